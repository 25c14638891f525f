#!/usr/bin/env bash
# Create the project's virtual environment once and install the pinned requirements.
#
# Usage: utils/setup_env.sh            (or `. path.sh`, which calls it)
#        utils/setup_env.sh --check    exit 0 if the environment is up to date, 1 if it would be
#                                      (re)built; builds nothing (utils/project_env.sh asks it)
# Idempotent: a stamp file records the hash of requirements.txt + pyproject.toml; when it
# matches, this returns in well under a second. Override the location with GOSSIP_VENV.
set -euo pipefail
root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd -P)
venv="${GOSSIP_VENV:-$root/.venv}"
python=${PYTHON:-python3}
stamp=$venv/.gossip_accel_stamp
want=$(cat "$root/requirements.txt" "$root/pyproject.toml" | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi
[ "${1:-}" != --check ] || exit 1

echo "[setup_env] creating/updating $venv (pinned versions from requirements.txt; ~2 min the first time)" >&2
"$python" -c 'import sys; assert sys.version_info >= (3, 10), "gossip_accel needs Python >= 3.10"' \
  || { echo "[setup_env] ERROR: $python is too old; set PYTHON=/path/to/python3.10+" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
pip_install() {  # quiet on success; on failure show pip's output (minus unused-index noise)
  local rc=0
  "$venv/bin/python" -m pip install --quiet "$@" >"$log" 2>&1 || rc=$?
  if [ $rc -ne 0 ]; then
    grep -v "is ignored: it is neither a file nor a directory" "$log" >&2 || true
    echo "[setup_env] ERROR: pip install $* failed (exit $rc)" >&2
  fi
  return $rc
}
pip_install --upgrade "pip>=24"
pip_install -r "$root/requirements.txt"
pip_install --no-deps -e "$root"
"$venv/bin/python" - <<'PY' >&2
import torch, torchaudio, accelerate, omegaconf, sentencepiece, kaldiio  # noqa: F401
print(f"[setup_env] ok: torch {torch.__version__}, torchaudio {torchaudio.__version__}, accelerate {accelerate.__version__}")
PY
echo "$want" > "$stamp"
