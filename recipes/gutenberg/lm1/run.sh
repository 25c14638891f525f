#!/usr/bin/env bash
# Gutenberg LSTMP language model trained with (gossip-)BMUF: section 3 of
# "A Random Gossip BMUF Process for Neural Language Modeling" (shared/papers/000_*).
#
#   ./run.sh                                         # mini corpus (Jane Austen, local/data/original-books-mini.tar.gz), 4 CPU workers
#   ./run.sh --books /data/original-books.tar.gz --conf conf/lstmp.yaml --ngpu 8
#   ./run.sh --stage 2 --algorithms "single ma bmuf local_bmuf gossip_bmuf gossip_ma"   # the paper's comparison
#   ./run.sh --stage 2 --periods 8 -- train.lr=0.05  # trainer overrides after --
#
# Stages: 0 corpus (the mini one unless --books), 1 95/5 split by book + vocabulary (count >= 7),
#         2 train (one run per --algorithms entry), 3 test perplexity, 4 comparison table + plot.
set -euo pipefail
cd "$(dirname "$0")"

stage=0
stop_stage=100
books=""                # the paper's original-books.tar.gz (openslr 12) or its extracted dir; empty: the mini corpus
min_count=7             # vocabulary: training words seen at least this often (the paper: 7)
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
port=29531
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

src=$books
if [ -z "$src" ]; then
  src=local/data/original-books-mini.tar.gz
  [ $stage -le 0 ] && [ $stop_stage -ge 0 ] && \
    log "Stage 0: no --books given: using the MINI corpus $src (Jane Austen's novels, public domain, in the layout of original-books.tar.gz)"
fi

if [ $stage -le 1 ] && [ $stop_stage -ge 1 ]; then
  log "Stage 1: $src -> $data (95% train / 5% test by book, vocabulary count >= $min_count)"
  python local/prepare_gutenberg.py --src "$src" --out "$data" --min-count "$min_count" --jobs "$(nproc)"
fi

if [ $stop_stage -ge 2 ]; then
  utils/run_lm.sh --stage $(( stage > 2 ? stage : 2 )) --stop-stage $stop_stage --data "$data" --exp "$exp" \
    --confs "$conf conf/period_${periods}.yaml" --periods "$periods" --algorithms "$algorithms" \
    --num-workers "$num_workers" --num-nodes "$num_nodes" --node-rank "$node_rank" --master-addr "$master_addr" \
    --launcher "$launcher" --port "$port" --max-restarts "$max_restarts" --epochs "$epochs" -- "$@"
fi
log "Done."
