#!/usr/bin/env bash
# LM recipe TEMPLATE: LSTMP language models trained with MA / BMUF / gossip-BMUF on any corpus.
# A new corpus (utils/new_recipe.sh --type lm recipes/mycorpus/lm1) links to this run.sh and brings only
#   local/data.sh   its data preparation: data/src/wiki.{train,valid,test}.tokens (wikitext format:
#                   one paragraph per line, tokens separated by spaces)
#   conf/*.yaml     its model conf (conf/lstmp.yaml) and sync periods (conf/period_16_128.yaml),
#                   and conf/run.conf (option defaults)
# Everything after the data prep is the shared stages of utils/run_lm.sh. See docs/RECIPES.md.
#
#   ./run.sh                                          # every stage; 4 CPU workers
#   ./run.sh --stage 2 --algorithms "single ma bmuf gossip_bmuf" -- train.lr=0.05
#
# Stages: 0 local/data.sh   1 vocabulary (gossip_accel.bin.prepare_lm)   2 train   3 test perplexity
#         4 comparison table + plot (utils/run_lm.sh)
set -euo pipefail
cd "$(dirname "$0")"    # the recipe dir (this file may be a link into recipes/TEMPLATE)

stage=0
stop_stage=100
src=data/src            # what local/data.sh writes
min_count=1             # vocabulary: words seen fewer times are <unk>
conf=conf/lstmp.yaml
periods=16_128          # conf/period_${periods}.yaml
algorithms=gossip_bmuf  # any of: single ddp ma bmuf local_ma local_bmuf gossip_ma gossip_bmuf
num_workers=4           # per node
ngpu=""                 # same as --num-workers
num_nodes=1             # several machines: needs utils/run_lm.sh with --num-nodes (see docs/RECIPES.md)
node_rank=0
master_addr=127.0.0.1
launcher=accelerate     # or torchrun
port=29571
max_restarts=0          # a worker that dies or hangs: the launcher restarts the job up to N times
epochs=""               # overrides train.epochs of the conf
data_opts=""            # more options for local/data.sh
data=data/lm
exp=exp
[ -f conf/run.conf ] && . conf/run.conf   # the corpus's defaults (shell assignments of the options above)
help_message="Usage: ./run.sh [options] [-- trainer overrides, e.g. train.lr=0.05 sync.q=2]"

. utils/log.sh
. utils/parse_options.sh
[ "${1:-}" = "--" ] && shift
. ./path.sh
[ -n "$ngpu" ] && num_workers=$ngpu

if [ $stage -le 0 ] && [ $stop_stage -ge 0 ] && [ "$node_rank" = 0 ]; then
  [ -x local/data.sh ] || die "local/data.sh is missing (or not executable): it writes $src/wiki.{train,valid,test}.tokens"
  log "Stage 0: local/data.sh -> $src"
  read -r -a opts <<< "$data_opts"   # --data-opts "--a 1 --b 2": several options, split into words
  local/data.sh --out "$src" ${opts[@]+"${opts[@]}"}
fi

if [ $stage -le 1 ] && [ $stop_stage -ge 1 ] && [ "$node_rank" = 0 ]; then
  log "Stage 1: vocabulary of $src -> $data"
  python -m gossip_accel.bin.prepare_lm --src "$src" --out "$data" --min-count "$min_count"
fi

if [ $stop_stage -ge 2 ]; then
  multinode=()
  if [ "$num_nodes" -gt 1 ]; then
    multinode=(--num-nodes $num_nodes --node-rank $node_rank --master-addr $master_addr)
  fi
  utils/run_lm.sh --stage $(( stage > 2 ? stage : 2 )) --stop-stage $stop_stage --data "$data" --exp "$exp" \
    --confs "$conf conf/period_${periods}.yaml" --periods "$periods" --algorithms "$algorithms" \
    --num-workers "$num_workers" ${multinode[@]+"${multinode[@]}"} --launcher "$launcher" --port "$port" --max-restarts "$max_restarts" \
    --epochs "$epochs" -- "$@"
fi
log "Done."
