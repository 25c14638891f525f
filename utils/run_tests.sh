#!/usr/bin/env bash
# Set up the environment (once) and run the whole test suite: utils/run_tests.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
utils/install_system_deps.sh   # flite, iproute2, procps, ffmpeg (apt, as root): the tests need them
. ./path.sh
exec python -m pytest -q "$@"
