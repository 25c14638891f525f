#!/usr/bin/env bash
# The Debian packages the recipes and tests use beyond Python: flite (the mini corpora's voices),
# iproute2 and procps (the emulated-cluster benchmark's namespaces, tc and sysctl), ffmpeg
# (decodes PCM-shortened SPHERE; its libraries are the ones torchaudio's I/O, torchcodec, loads).
# Installs what is missing when run as root (apt-get, without recommends); otherwise says what to
# install and fails, because the tests need them (none is skipped for want of a package).
# Idempotent: a no-op when all are there.
set -euo pipefail
declare -A need=([flite]=flite [ip]=iproute2 [tc]=iproute2 [sysctl]=procps [ffmpeg]=ffmpeg)
missing=()
for cmd in "${!need[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install_system_deps: missing $pkgs- install them (Debian/Ubuntu: sudo apt-get install $pkgs)" >&2
  exit 1
fi
echo "install_system_deps: apt-get install $pkgs" >&2
{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs; } >&2
