#!/usr/bin/env bash
# The paper's comparison (Tables 1-2 of 000_07fa007f7f1023ae.txt, in shape): one worker, MA,
# BMUF-NBM, local-BMUF, gossip-BMUF and gossip-MA, same data, same epochs, each worker reading
# its 1/n of the training data. Writes exp/compare/RESULTS.md and exp/compare/RESULTS.png.
#
#   local/compare.sh [--num-workers 8] [--periods 8] [any other ./run.sh option]
set -euo pipefail
cd "$(dirname "$0")/.."
exec ./run.sh --algorithms "single ma bmuf local_bmuf gossip_bmuf gossip_ma" "$@"
