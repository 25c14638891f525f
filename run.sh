#!/usr/bin/env bash
# Quick start of gossip_accel: every stage end to end, on the embedded mini data, on CPU.
#
#   ./run.sh                                   # all stages (sets up .venv the first time)
#   ./run.sh --stage 2 --stop-stage 2 --algorithms "gossip_bmuf bmuf"
#
# Stage 0  environment (pinned .venv, via path.sh)
# Stage 1  LM data: the embedded wiki_mini text (real Wikipedia, wikitext layout) + vocabulary
# Stage 2  train a small LSTMP LM with 4 CPU workers under `accelerate launch`, once per
#          algorithm in --algorithms ("ddp" = plain DDP gradient all-reduce every step)
# Stage 3  report: valid/test perplexity and bytes sent per step per worker, side by side
set -euo pipefail
cd "$(dirname "$0")"

stage=0
stop_stage=100
num_workers=4
launcher=accelerate
algorithms="ddp gossip_bmuf"
conf=conf/quickstart_lm.yaml
src=local/data/wiki_mini
data=data/lm
exp=exp/quickstart
min_count=3
epochs=2
port=29511
help_message="Usage: ./run.sh [options] [-- extra trainer overrides such as sync.period=8]"

. utils/log.sh
. utils/parse_options.sh
[ "${1:-}" = "--" ] && shift
extra=("$@")

if [ $stage -le 0 ] && [ $stop_stage -ge 0 ]; then
  log "Stage 0: environment"
fi
. ./path.sh
python -c 'import torch, accelerate; print(f"torch {torch.__version__}, accelerate {accelerate.__version__}")'

if [ $stage -le 1 ] && [ $stop_stage -ge 1 ]; then
  log "Stage 1: LM data from $src -> $data"
  if [ -f $data/.done ]; then
    log "  $data already prepared (remove $data/.done to redo)"
  else
    python -m gossip_accel.bin.prepare_lm --src "$src" --out "$data" --min-count $min_count
    touch $data/.done
  fi
fi

if [ $stage -le 2 ] && [ $stop_stage -ge 2 ]; then
  for algo in $algorithms; do
    dir=$exp/$algo
    if [ -f $dir/.done ]; then
      log "Stage 2: $dir already trained (remove $dir/.done to retrain)"
      continue
    fi
    if [ "$algo" = ddp ]; then sync_args=(sync.enabled=false); else sync_args=(sync.algorithm=$algo); fi
    log "Stage 2: training '$algo' with $num_workers workers ($launcher) -> $dir (log: $dir/train.log)"
    mkdir -p $dir
    utils/launch.sh --num-workers $num_workers --launcher $launcher --port $port -- \
      -m gossip_accel.bin.train_lm --config $conf --exp-dir $dir \
      data.dir=$data train.epochs=$epochs "${sync_args[@]}" ${extra[@]+"${extra[@]}"} 2>&1 \
      | tee $dir/train.log | grep --line-buffered '^\[train_lm\]' || true
    if [ ! -f $dir/summary.json ]; then
      grep -E '^[^ ]*(Error|error:)|rror: ' $dir/train.log | grep -v Warning | sort -u | tail -n 5 >&2 || true
      die "training '$algo' failed; see $dir/train.log"
    fi
    touch $dir/.done
  done
fi

if [ $stage -le 3 ] && [ $stop_stage -ge 3 ]; then
  log "Stage 3: comparison (table: $exp/compare.md, plot: $exp/compare.png)"
  python -m gossip_accel.bin.compare_runs --out $exp/compare $(for a in $algorithms; do echo $exp/$a; done)
fi
log "Done."
