#!/usr/bin/env bash
# KenLM's n-gram estimator and binarizer (lmplz, build_binary) for the ASR recipes' word LM
# (stage 5's word n-gram, decoded by torchaudio's CTC lexicon decoder, which reads ARPA/binary
# KenLM files through flashlight-text). Built once from KenLM's source as published on PyPI
# (kenlm==0.3.0, sha256-pinned; the wheel-less package holds the whole C++ tree) into
# tools/kenlm/bin (ignored by git), the Kaldi/icefall way (Kaldi's tools/extras/install_kenlm*.sh).
#
#   utils/install_kenlm.sh            # prints the bin dir; a no-op when lmplz and build_binary are there
#
# Needs a C++ toolchain, cmake and Boost (program_options system thread test), zlib, bzip2, lzma:
# installed with apt-get when run as root and missing; otherwise says what to install and fails.
# About 3 minutes on 2 cores, 40 MB of packages.
set -euo pipefail
root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
prefix=${KENLM_PREFIX:-$root/tools/kenlm}
version=0.3.0
sha256=c4628bb9fb63c8a6f9240035b8b037385cfc404cb72e933cf48878291edac1e8
if [ -x "$prefix/bin/lmplz" ] && [ -x "$prefix/bin/build_binary" ]; then echo "$prefix/bin"; exit 0; fi
log() { echo "install_kenlm: $*" >&2; }

pkgs=()
for cmd in g++:g++ make:make cmake:cmake; do command -v "${cmd%%:*}" >/dev/null 2>&1 || pkgs+=("${cmd#*:}"); done
for hdr in boost/program_options.hpp:libboost-program-options-dev boost/system/error_code.hpp:libboost-system-dev \
           boost/thread.hpp:libboost-thread-dev boost/test/unit_test.hpp:libboost-test-dev zlib.h:zlib1g-dev \
           bzlib.h:libbz2-dev lzma.h:liblzma-dev; do
  [ -f "/usr/include/${hdr%%:*}" ] || pkgs+=("${hdr#*:}")
done
if [ ${#pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    log "missing ${pkgs[*]} - install them (Debian/Ubuntu: sudo apt-get install ${pkgs[*]})"; exit 1
  fi
  log "apt-get install ${pkgs[*]}"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}"; } >&2 \
    || { log "could not install ${pkgs[*]}"; exit 1; }
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation -d "$work" "kenlm==$version" >&2 \
  || { log "could not download kenlm==$version from the package index"; exit 1; }
tarball=$(ls "$work"/kenlm-*.tar.gz)
got=$(sha256sum "$tarball" | cut -d' ' -f1)
[ "$got" = "$sha256" ] || { log "$tarball: sha256 $got, expected $sha256"; exit 1; }
tar xzf "$tarball" -C "$work"
src=$(ls -d "$work"/kenlm-*/)
log "building lmplz and build_binary (cmake, $(nproc) jobs)"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DKENLM_MAX_ORDER=6 >"$work/cmake.log" 2>&1 \
  || { tail -20 "$work/cmake.log" >&2; log "cmake failed"; exit 1; }
cmake --build "$work/build" --target lmplz build_binary -j "$(nproc)" >"$work/build.log" 2>&1 \
  || { tail -20 "$work/build.log" >&2; log "build failed"; exit 1; }
mkdir -p "$prefix/bin"
cp "$work/build/bin/lmplz" "$work/build/bin/build_binary" "$prefix/bin/"
log "lmplz and build_binary in $prefix/bin"
echo "$prefix/bin"
