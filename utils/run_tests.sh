#!/usr/bin/env bash
# Set up the environment (once) and run the whole test suite: utils/run_tests.sh [pytest args]
# Two test files run at a time (pytest-xdist, --dist loadfile: a file's tests and its module fixtures
# stay in one process): 10.7 min on 2 cores against 15.4 min one at a time (2026-12-02). One at a
# time: utils/run_tests.sh -n 0; more at a time: GOSSIP_TEST_JOBS=4 utils/run_tests.sh. The slowest 15 tests
# are listed at the end (keep the suite under 15 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
utils/install_system_deps.sh   # flite, espeak-ng, iproute2, procps, ffmpeg, mbrola, festival, ... (apt, as root): the tests need them
. ./path.sh
utils/install_kenlm.sh >/dev/null   # KenLM lmplz + build_binary into tools/kenlm/bin (once; ~1.5 min)
exec python -m pytest -q -n "${GOSSIP_TEST_JOBS:-2}" --dist loadfile --durations=15 "$@"   # the 15 slowest tests at the end
