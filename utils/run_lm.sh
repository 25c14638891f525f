#!/usr/bin/env bash
# The stages of every LM recipe (a recipe's run.sh gives its corpus's defaults and execs this):
#   0-1 local/data.sh --stage S --stop-stage E --data <data>: the corpus (0) and the LM data dir
#       the trainer reads (1: the splits named in the conf's data section, and vocab.txt)
#   2 train, one run per --algorithms entry   3 test perplexity of the averaged models
#   4 comparison of every finished run of <exp> (any algorithm, any tag): <exp>/compare/RESULTS.md
#     (+ .json) and RESULTS.png (valid perplexity against epoch, MB sent per worker and training
#     time), each run against --baseline
#
#   ./run.sh --stage 2 --algorithms "single ma bmuf local_bmuf gossip_bmuf gossip_ma" --num-workers 4 [-- trainer overrides]
#   ./run.sh --stage 2 --algorithms gossip_bmuf --tag eta075 -- sync.block_momentum=0.75   # beside the untagged run
#
# Algorithms: single (one worker, no sync), ddp (gradient all-reduce every step), or any
# sync.algorithm. Each run goes to <exp>/<algorithm>-<periods>-n<workers> (single-n1, ddp-n<N>),
# with -<tag> appended when --tag is set; a finished run has a .done marker and is skipped; an
# interrupted one resumes from its last checkpoint (epoch ends, and every
# train.checkpoint_every_steps steps). The options every recipe shares (stages, algorithms, --tag,
# --baseline, workers, nodes, launcher, port, --max-restarts, exp) are declared once in
# utils/stages.sh; ./run.sh --help lists them all, with the corpus's own (those of local/data.sh).
# Several machines (sharing the recipe dir, as Kaldi recipes do): run the same command on each
# with --num-nodes N --node-rank R --master-addr <node 0>; --num-workers is per node; a node
# with --node-rank > 0 runs stage 2 only (its workers join node 0's job; node 0 writes results).
set -euo pipefail
data=data/lm             # the LM data dir (local/data.sh writes it)
conf=conf/lstmp.yaml     # the model conf
periods=16_128           # the sync periods: conf/period_<periods>.yaml is read after --conf
declare train_stage=2   # (not options: what utils/stages.sh needs to know)
declare epochs_key=train.epochs
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/stages.sh"
confs=("$conf" "conf/period_${periods}.yaml")
for c in "${confs[@]}"; do [ -f "$c" ] || die "config file $c not found (--conf, --periods)"; done
run_prefix=""
run_periods=$periods
runs=()
for algo in $algorithms; do runs+=("$(run_dir "$algo")"); done

data_prep 0 1 --stage "$((stage > 0 ? stage : 0))" --stop-stage "$((stop_stage < 1 ? stop_stage : 1))" --data "$data"

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  [ -f "$data/vocab.txt" ] || die "$data/vocab.txt not found: run the data stages (--stage 0) first"
  train_runs gossip_accel.bin.train_lm --config "${confs[0]}" --config "${confs[1]}" data.dir="$data"
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  for dir in "${runs[@]}"; do
    if [ -f "$dir/.eval.done" ]; then
      log "Stage 3: $dir already evaluated"
      continue
    fi
    log "Stage 3: test perplexity of the averaged model of $dir"
    python -m gossip_accel.bin.eval_lm --exp-dir "$dir"
    touch "$dir/.eval.done"
  done
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  mapfile -t done_runs < <(finished_runs)
  [ ${#done_runs[@]} -gt 0 ] || die "Stage 4: no finished run in $exp (stage 2 first)"
  log "Stage 4: the ${#done_runs[@]} finished runs of $exp -> $exp/compare/RESULTS.md and RESULTS.png (baseline: $baseline)"
  python -m gossip_accel.bin.compare_runs --out "$exp/compare/RESULTS" --baseline "$baseline" \
    --title "$(basename "$(cd "$exp/.." && pwd)")/$(basename "$exp")" "${done_runs[@]}"
fi
