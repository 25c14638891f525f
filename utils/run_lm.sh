#!/usr/bin/env bash
# The shared LM stages of every LM recipe: 2 train, 3 eval, 4 compare.
#
#   utils/run_lm.sh --data data/lm --exp exp --confs "conf/mini.yaml conf/period_16_128.yaml" \
#       --algorithms "single ma bmuf local_bmuf gossip_bmuf gossip_ma" --num-workers 4 \
#       [--stage 2 --stop-stage 4] [--periods 16_128] [--max-restarts 3] [-- extra trainer overrides]
#
# Algorithms: single (one worker, no sync), ddp (gradient all-reduce every step), or any
# sync.algorithm (ma, bmuf, local_ma, local_bmuf, gossip_ma, gossip_bmuf). Each run goes to
# <exp>/<algorithm>-<periods>-n<workers> (single-n1, ddp-n<N>); a finished run has a .done marker
# and is skipped; an interrupted one resumes from its last checkpoint (epoch ends, and every
# train.checkpoint_every_steps steps). --max-restarts N: a worker that dies or hangs (see
# train.collective_timeout) makes the launcher restart the job by itself, up to N times; the
# count is logged after training and written to results.json ("restarts").
# Several machines (sharing the recipe dir, as Kaldi recipes do): run the same command on each
# with --num-nodes N --node-rank R --master-addr <node 0>; --num-workers is per node; a node
# with --node-rank > 0 runs stage 2 only (its workers join node 0's job; node 0 writes results).
set -euo pipefail
stage=2
stop_stage=4
data=data/lm
exp=exp
confs=""
periods=16_128
algorithms=gossip_bmuf
num_workers=4            # per node
num_nodes=1
node_rank=0
master_addr=127.0.0.1
launcher=accelerate
port=29521
max_restarts=0
epochs=""
help_message="Usage: utils/run_lm.sh [options] [-- trainer overrides such as train.lr=0.05]"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/log.sh"
. "$here/parse_options.sh"
[ "${1:-}" = "--" ] && shift
extra=("$@")
[ -n "$confs" ] || die "--confs is empty: give the model conf and the period conf, e.g. \"conf/mini.yaml conf/period_${periods}.yaml\""
for c in $confs; do [ -f "$c" ] || die "config file $c not found"; done
[ -f "$data/vocab.txt" ] || die "$data/vocab.txt not found: run the data stages (--stage 0) first"

total_workers=$((num_workers * num_nodes))
run_dir() {  # run_dir ALGO -> the run's exp dir
  case $1 in
    single) echo "$exp/single-n1" ;;
    ddp) echo "$exp/ddp-n$total_workers" ;;
    *) echo "$exp/$1-$periods-n$total_workers" ;;
  esac
}
if [ "$node_rank" != 0 ]; then
  [ $stage -le 2 ] && [ $stop_stage -ge 2 ] || { log "node $node_rank: nothing to do outside stage 2"; exit 0; }
  stop_stage=2
fi
restarts_of() {  # restarts_of RESULTS_JSON -> the trainer's restart count
  python -c 'import json, sys; print(json.load(open(sys.argv[1])).get("restarts", 0))' "$1"
}
dirs=()
for algo in $algorithms; do dirs+=("$(run_dir "$algo")"); done

if [ $stage -le 2 ] && [ $stop_stage -ge 2 ]; then
  for algo in $algorithms; do
    dir=$(run_dir "$algo")
    if [ -f "$dir/.done" ]; then
      log "Stage 2: $dir already trained (remove $dir/.done to retrain)"
      continue
    fi
    workers=$num_workers
    nodes=(--num-nodes "$num_nodes" --node-rank "$node_rank" --master-addr "$master_addr")
    train_log=$dir/train.log
    [ "$node_rank" = 0 ] || train_log=$dir/train.node$node_rank.log
    case $algo in
      single) workers=1; nodes=(); sync_args=(sync.enabled=false)
        [ "$node_rank" = 0 ] || { log "Stage 2: node $node_rank: 'single' runs on node 0 only"; continue; } ;;
      ddp) sync_args=(sync.enabled=false) ;;
      *) sync_args=(sync.algorithm="$algo") ;;
    esac
    conf_args=()
    for c in $confs; do conf_args+=(--config "$c"); done
    [ -n "$epochs" ] && sync_args+=(train.epochs="$epochs")
    mkdir -p "$dir"
    log "Stage 2: training '$algo' with $workers worker(s) x $num_nodes node(s) ($launcher) -> $dir (log: $train_log)"
    "$here/launch.sh" --num-workers "$workers" ${nodes[@]+"${nodes[@]}"} --launcher "$launcher" --port "$port" \
      --max-restarts "$max_restarts" -- \
      -m gossip_accel.bin.train_lm "${conf_args[@]}" --exp-dir "$dir" --name "$(basename "$dir")" \
      data.dir="$data" "${sync_args[@]}" ${extra[@]+"${extra[@]}"} 2>&1 \
      | tee -a "$train_log" | grep --line-buffered '^\[train_lm\]' || true
    if [ "$node_rank" != 0 ]; then
      log "Stage 2: node $node_rank: its workers finished (node 0 writes $dir/results.json)"
      continue
    fi
    if [ ! -f "$dir/results.json" ]; then
      grep -E 'Error|error:' "$train_log" | grep -v Warning | sort -u | tail -n 5 >&2 || true
      die "training '$algo' failed; see $dir/train.log"
    fi
    log "Stage 2: '$algo' trained; restarts after a failed worker: $(restarts_of "$dir/results.json")"
    touch "$dir/.done"
  done
fi

if [ $stage -le 3 ] && [ $stop_stage -ge 3 ]; then
  for dir in "${dirs[@]}"; do
    if [ -f "$dir/.eval.done" ]; then
      log "Stage 3: $dir already evaluated"
      continue
    fi
    log "Stage 3: test perplexity of the averaged model of $dir"
    python -m gossip_accel.bin.eval_lm --exp-dir "$dir"
    touch "$dir/.eval.done"
  done
fi

if [ $stage -le 4 ] && [ $stop_stage -ge 4 ]; then
  log "Stage 4: comparison table $exp/compare/RESULTS.md and plot $exp/compare/RESULTS.png"
  python -m gossip_accel.bin.compare_runs --out "$exp/compare/RESULTS" \
    --title "$(basename "$(cd "$exp/.." && pwd)")/$(basename "$exp"): $algorithms" "${dirs[@]}"
fi
