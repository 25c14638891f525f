#!/usr/bin/env bash
# ASR recipe TEMPLATE: CTC acoustic models trained with MA / BMUF / gossip-BMUF on any corpus.
# A new corpus (utils/new_recipe.sh recipes/mycorpus/asr1) links to this run.sh and brings only
#   local/data.sh   its data preparation: Kaldi data dirs data/<train-set>, <dev-set>, <test-sets>
#   conf/*.yaml     its model confs (conf/train_dnn.yaml by default) and conf/run.conf (option defaults)
# Everything after the data prep is the shared stages of utils/run_asr.sh. See docs/RECIPES.md.
#
#   ./run.sh                                          # every stage; 4 CPU workers
#   ./run.sh --stage 4 --algorithms "single ma bmuf gossip_bmuf" -- train.lr=2e-3
#   ./run.sh --stage 4 --stop-stage 4 --ngpu 8 --num-nodes 2 --node-rank 1 --master-addr node0   # on node 1
#
# Stages: 0 local/data.sh (corpus -> Kaldi data dirs)   1 validate (and fix) the data dirs
#         2 fbank + CMVN   3 units   4 train   5 unit LM   6 decode   7 RESULTS.md (utils/run_asr.sh)
set -euo pipefail
cd "$(dirname "$0")"    # the recipe dir (this file may be a link into recipes/TEMPLATE)

stage=0
stop_stage=100
train_set=train
dev_set=dev
test_sets="test"
nj=2
sample_rate=16000       # 8000 for telephone speech
num_mel_bins=80
unit_type=bpe           # bpe | char
vocab_size=300          # BPE units (500 for ~1000 h; fewer for a small corpus)
conf=conf/train_dnn.yaml
algorithms=gossip_bmuf  # single ddp ma bmuf local_ma local_bmuf gossip_ma gossip_bmuf
num_workers=4           # per node
ngpu=""                 # same as --num-workers (one worker per GPU)
num_nodes=1             # machines; run this on each with its --node-rank (utils/slurm.sh does it under Slurm)
node_rank=0
master_addr=127.0.0.1   # node 0's address
launcher=accelerate     # or torchrun
port=29561
max_restarts=0          # a worker that dies or hangs: the launcher restarts the job up to N times
use_lm=true
lm_conf=conf/lm_units.yaml
lm_text=""              # LM text, one sentence per line (default: the training transcripts)
decode_methods="greedy beam_lm"   # any of: greedy beam beam_lm
score_hook=""           # e.g. local/score.sh: run as <hook> <data-dir> <decode-dir> after each decode
data_opts=""            # more options for local/data.sh
exp=exp
[ -f conf/run.conf ] && . conf/run.conf   # the corpus's defaults (shell assignments of the options above)
help_message="Usage: ./run.sh [options] [-- trainer overrides, e.g. train.lr=2e-3 sync.period=8]"

. utils/log.sh
. utils/parse_options.sh
[ "${1:-}" = "--" ] && shift
. ./path.sh
[ -n "$ngpu" ] && num_workers=$ngpu

if [ $stage -le 0 ] && [ $stop_stage -ge 0 ] && [ "$node_rank" = 0 ]; then
  [ -x local/data.sh ] || die "local/data.sh is missing (or not executable): it prepares data/$train_set, data/$dev_set, data/{$test_sets}"
  log "Stage 0: local/data.sh -> data/$train_set, data/$dev_set, data/{${test_sets// /,}}"
  read -r -a opts <<< "$data_opts"   # --data-opts "--a 1 --b 2": several options, split into words
  local/data.sh --nj "$nj" --train-set "$train_set" --dev-set "$dev_set" --test-sets "$test_sets" ${opts[@]+"${opts[@]}"}
fi

if [ $stage -le 1 ] && [ $stop_stage -ge 1 ] && [ "$node_rank" = 0 ]; then
  for d in $train_set $dev_set $test_sets; do
    [ -d data/$d ] || die "data/$d not found: local/data.sh must create it"
    log "Stage 1: validating data/$d"
    utils/validate_data_dir.sh data/$d || { log "  data/$d has problems (listed above): fixing"; utils/fix_data_dir.sh data/$d; }
  done
fi

if [ $stop_stage -ge 2 ]; then
  utils/run_asr.sh --stage $(( stage > 2 ? stage : 2 )) --stop-stage $stop_stage \
    --train-set "$train_set" --dev-set "$dev_set" --test-sets "$test_sets" \
    --nj $nj --sample-rate $sample_rate --num-mel-bins $num_mel_bins --unit-type $unit_type --vocab-size $vocab_size \
    --conf "$conf" --algorithms "$algorithms" --num-workers $num_workers --num-nodes $num_nodes \
    --node-rank $node_rank --master-addr "$master_addr" --launcher "$launcher" --port "$port" --max-restarts "$max_restarts" \
    --use-lm $use_lm --lm-conf "$lm_conf" --lm-text "$lm_text" --decode-methods "$decode_methods" \
    --score-hook "$score_hook" --exp "$exp" -- "$@"
fi
log "Done."
