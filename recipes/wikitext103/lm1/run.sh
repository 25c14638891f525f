#!/usr/bin/env bash
# wikitext-103 LSTMP language model trained with (gossip-)BMUF: section 3 of
# "A Random Gossip BMUF Process for Neural Language Modeling" (shared/papers/000_*).
#
#   ./run.sh                                         # mini corpus (built from the embedded wiki_mini), 4 CPU workers
#   ./run.sh --wikitext-root /data/wikitext-103 --conf conf/lstmp.yaml --ngpu 8
#   ./run.sh --stage 2 --algorithms "single ma bmuf local_bmuf gossip_bmuf gossip_ma"   # the paper's comparison
#   ./run.sh --stage 2 --periods 8 -- train.lr=0.05  # trainer overrides after --
#
# Stages: 0 corpus (the mini one unless --wikitext-root), 1 validation + vocabulary,
#         2 train (one run per --algorithms entry), 3 test perplexity, 4 comparison table + plot.
set -euo pipefail
cd "$(dirname "$0")"

stage=0
stop_stage=100
wikitext_root=""        # a real wikitext-103 dir (wiki.{train,valid,test}.tokens); empty: the mini corpus
conf=conf/mini.yaml     # conf/lstmp.yaml: the paper's model
periods=16_128          # conf/period_${periods}.yaml: 8 or 16_128
algorithms=gossip_bmuf  # any of: single ddp ma bmuf local_ma local_bmuf gossip_ma gossip_bmuf
algorithm=""            # one algorithm (same as --algorithms with one entry)
num_workers=4
ngpu=""                 # same as --num-workers (one worker per GPU)
num_nodes=1             # machines (sharing this dir); run this on each with its --node-rank (utils/slurm.sh)
node_rank=0
master_addr=127.0.0.1   # node 0's address
launcher=accelerate     # or torchrun
port=29521
max_restarts=0          # a worker that dies or hangs: the launcher restarts the job up to N times
epochs=""               # overrides train.epochs of the conf
data=data/lm
exp=exp
help_message="Usage: ./run.sh [options] [-- trainer overrides, e.g. train.lr=0.05 sync.q=2]"

. utils/log.sh
. utils/parse_options.sh
[ "${1:-}" = "--" ] && shift
. ./path.sh
[ -n "$ngpu" ] && num_workers=$ngpu
[ -n "$algorithm" ] && algorithms=$algorithm

src=$wikitext_root
if [ -z "$src" ]; then
  src=data/mini_src
  if [ $stage -le 0 ] && [ $stop_stage -ge 0 ]; then
    log "Stage 0: no --wikitext-root given: using the MINI corpus ($src), built from local/data/wiki_mini"
    log "         (~100 real Wikipedia articles, CC BY-SA) in the wikitext-103 format"
    python local/make_mini.py --src "$GOSSIP_ROOT/local/data/wiki_mini" --out "$src"
  fi
fi

if [ $stage -le 1 ] && [ $stop_stage -ge 1 ]; then
  log "Stage 1: validate $src and build the vocabulary -> $data"
  python local/prepare_wikitext.py --src "$src" --out "$data"
fi

if [ $stop_stage -ge 2 ]; then
  utils/run_lm.sh --stage $(( stage > 2 ? stage : 2 )) --stop-stage $stop_stage --data "$data" --exp "$exp" \
    --confs "$conf conf/period_${periods}.yaml" --periods "$periods" --algorithms "$algorithms" \
    --num-workers "$num_workers" --num-nodes "$num_nodes" --node-rank "$node_rank" --master-addr "$master_addr" \
    --launcher "$launcher" --port "$port" --max-restarts "$max_restarts" --epochs "$epochs" -- "$@"
fi
log "Done."
