#!/usr/bin/env bash
# Set up the environment (once) and run the whole test suite: utils/run_tests.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
. ./path.sh
exec python -m pytest -q "$@"
