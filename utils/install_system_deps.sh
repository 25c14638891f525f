#!/usr/bin/env bash
# The Debian packages the recipes and tests use beyond Python: flite (the mini corpora's voices),
# espeak-ng (more voices and accents for the mini LibriSpeech: --mini-train-voices 'espeak-*'),
# iproute2 and procps (the emulated-cluster benchmark's namespaces, tc and sysctl), ffmpeg
# (decodes PCM-shortened SPHERE; its libraries are the ones torchaudio's I/O, torchcodec, loads), and one
# file: wamerican-huge's word list (the mini LibriSpeech's lexicon words beyond its small LM text), and WordNet's
# data files (wordnet-base: English words and glosses for that LM text, local/make_lm_text.py --wordnet), and
# MBROLA with its four English voices (the mini LibriSpeech's mbrola-* voices), and Festival with six English voices
# (its festival-* voices: MBROLA's four through Festival, ked and rab). Some are in Debian's contrib and non-free
# components, which this script enables on Debian when they are off; MBROLA's voices are for non-commercial use.
#
#   utils/install_system_deps.sh            # every command and file below (utils/run_tests.sh: the tests need all)
#   utils/install_system_deps.sh flite      # only these commands or files (a recipe's local/data.sh: its mini corpus)
#
# Installs the packages of the missing commands when run as root (apt-get, without recommends);
# otherwise says what to install and fails (no test is skipped for want of a package). A no-op when
# all are there.
set -euo pipefail
declare -A need=([flite]=flite [espeak-ng]=espeak-ng [ip]=iproute2 [tc]=iproute2 [sysctl]=procps [ffmpeg]=ffmpeg
                 [/usr/share/dict/american-english-huge]=wamerican-huge [/usr/share/wordnet/data.noun]=wordnet-base
                 [mbrola]=mbrola [festival]=festival)
declare -A voice_files=([mbrola]="" [festival]="")   # "mbrola", "festival": the program and its voices
for v in us1 us2 us3 en1; do
  need[/usr/share/mbrola/$v/$v]=mbrola-$v; voice_files[mbrola]+=" /usr/share/mbrola/$v/$v"
done
for v in us1_mbrola:festvox-us1 us2_mbrola:festvox-us2 us3_mbrola:festvox-us3 en1_mbrola:festvox-en1 \
         ked_diphone:festvox-kdlpc16k rab_diphone:festvox-rablpc16k; do
  f=/usr/share/festival/voices/english/${v%%:*}/festvox/${v%%:*}.scm
  need[$f]=${v#*:}; voice_files[festival]+=" $f"
done
cmds=()
for cmd in "$@"; do
  cmds+=("$cmd")
  for f in ${voice_files[$cmd]-}; do cmds+=("$f"); done
done
[ $# -gt 0 ] || cmds=("${!need[@]}")
missing=()
for cmd in "${cmds[@]}"; do
  [ -n "${need[$cmd]+x}" ] || { echo "install_system_deps: unknown command or file '$cmd' (known: ${!need[*]})" >&2; exit 1; }
  case $cmd in
    /*) [ -f "$cmd" ] || missing+=("${need[$cmd]}") ;;
    *) command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}") ;;
  esac
done
[ ${#missing[@]} -eq 0 ] && exit 0
pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install_system_deps: missing $pkgs- install them (Debian/Ubuntu: sudo apt-get install $pkgs)" >&2
  exit 1
fi
echo "install_system_deps: apt-get install $pkgs" >&2
fail() { echo "install_system_deps: could not install $pkgs- install them with 'apt-get install $pkgs'" >&2; exit 1; }
apt-get update -qq >&2 || fail
# (grep reads all of apt-cache's output: with -q it could stop early, and pipefail would take apt-cache's SIGPIPE
# for "no candidate")
absent=$(for p in $pkgs; do apt-cache policy "$p" 2>/dev/null | grep 'Candidate: [0-9]' >/dev/null || echo -n "$p "; done)
if [ -n "$absent" ]; then
  # MBROLA and some Festival voices are in Debian's contrib, MBROLA's voices in non-free: enable both for this
  # release (a file of our own)
  . /etc/os-release
  [ "${ID:-}" = debian ] && [ -n "${VERSION_CODENAME:-}" ] || { echo "install_system_deps: $absent- not in the" \
    "package lists; MBROLA, its voices and some Festival voices are in Debian's contrib and non-free, Ubuntu's" \
    "multiverse: enable those and run this again" >&2; exit 1; }
  list=/etc/apt/sources.list.d/gossip-accel-mbrola.list
  echo "install_system_deps: enabling Debian's contrib and non-free for $VERSION_CODENAME ($list: $absent)" >&2
  # the same keyring as the system's deb.debian.org entry (apt refuses one source with two Signed-By values)
  keyring=$(sed -n 's/^Signed-By: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)
  opts=""; [ ! -f "$keyring" ] || opts="[signed-by=$keyring] "
  echo "deb ${opts}http://deb.debian.org/debian $VERSION_CODENAME contrib non-free" >"$list"
  apt-get update -qq >&2 || { rm -f "$list"; fail; }   # leave apt as it was
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >&2 || fail
