#!/usr/bin/env bash
# Quick start of gossip_accel: every stage of the recipes, end to end, on their embedded mini
# data, on CPU with 4 workers. Sets up the pinned .venv the first time.
#
#   ./run.sh                                            # all stages
#   ./run.sh --algorithms "single bmuf gossip_bmuf"     # other methods
#   ./run.sh --stage 2 -- sync.q=2                      # from training on, with trainer overrides
#
# LM (recipes/wikitext103/lm1, the gossip-BMUF paper's setup scaled down):
#   0 mini wikitext-103 corpus (real Wikipedia articles)  1 validation + vocabulary
#   2 train: plain DDP and gossip-BMUF (16,128), 4 workers under `accelerate launch`
#   3 test perplexity of the averaged models               4 comparison table + plot
set -euo pipefail
cd "$(dirname "$0")"

stage=0
stop_stage=100
num_workers=4
algorithms="ddp gossip_bmuf"
epochs=2
launcher=accelerate
port=29511
data=data/lm           # relative to the recipe directory
exp=exp/quickstart     # relative to the recipe directory
help_message="Usage: ./run.sh [options] [-- trainer overrides such as sync.period=8]"

. utils/log.sh
. utils/parse_options.sh
[ "${1:-}" = "--" ] && shift
. ./path.sh

lm=recipes/wikitext103/lm1
log "LM quick start: $lm/run.sh (stages $stage..$stop_stage; results in $lm/$exp/compare/RESULTS.md)"
$lm/run.sh --stage "$stage" --stop-stage "$stop_stage" --num-workers "$num_workers" \
  --algorithms "$algorithms" --epochs "$epochs" --launcher "$launcher" --port "$port" \
  --data "$data" --exp "$exp" -- "$@"
[ -f "$lm/$exp/compare/RESULTS.md" ] && cat "$lm/$exp/compare/RESULTS.md"
log "Done."
