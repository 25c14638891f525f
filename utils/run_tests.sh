#!/usr/bin/env bash
# Set up the environment (once) and run the whole test suite: utils/run_tests.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
utils/install_system_deps.sh   # flite, iproute2 (apt, as root), so that no test skips for want of them
. ./path.sh
exec python -m pytest -q "$@"
