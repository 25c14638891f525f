#!/usr/bin/env bash
# The stages of every ASR recipe (a recipe's run.sh gives its corpus's defaults and execs this):
#   0 local/data.sh (the corpus's: Kaldi data dirs data/<train-set>, <dev-set>, <test-sets>)
#   1 validate the data dirs (utils/validate_data_dir.sh; utils/fix_data_dir.sh when needed)
#   2 fbank features (+ global CMVN on the training set)   3 units (sentencepiece BPE or char)
#   4 train CTC models with `accelerate launch`, one run per --algorithms entry
#   5 unit-level LSTMP LM (for shallow fusion; --use-lm true) on --lm-text (one sentence per
#     line, e.g. LibriSpeech's librispeech-lm-norm.txt[.gz]) or, without it, the training transcripts
#   6 decode every test set (--decode-methods: greedy, beam, beam_lm)
#   7 <exp>/RESULTS.md: a WER/CER row per finished run of the model (any algorithm, any tag), set, method
#
#   ./run.sh --stage 4 --algorithms "single ma bmuf gossip_bmuf" --num-workers 4 [-- trainer overrides]
#   ./run.sh --stage 4 --algorithms gossip_bmuf --tag eta075 -- sync.block_momentum=0.75   # beside the untagged run
#
# The options every recipe shares (stages, algorithms, --tag, workers, nodes, launcher, port,
# restarts, exp) are declared once in utils/stages.sh; ./run.sh --help lists them all, with the
# corpus's own (those of local/data.sh). Every stage skips work that is done (.done markers);
# training resumes from its last checkpoint (epoch ends, and every train.checkpoint_every_steps
# steps). --max-restarts N: a worker that dies or hangs (train.collective_timeout) makes the
# launcher restart the job by itself, up to N times; the count is logged after training and
# written to results.json ("restarts"). Several machines: run the same command on each with
# --num-nodes N --node-rank R --master-addr <node 0> (utils/launch.sh; utils/slurm.sh does it under
# Slurm); --num-workers is per node. A node with --node-rank > 0 runs stage 4 only (its workers
# join node 0's job), logging to <run>/train.node<R>.log; node 0 runs every stage.
set -euo pipefail
train_set=train
dev_set=dev
test_sets=test
nj=2
sample_rate=16000        # of the audio (8000 for telephone speech: Switchboard)
num_mel_bins=80
allow_pipes=false        # true: run Kaldi pipes of wav.scp ("sph2pipe ... |") with bash; false refuses them
unit_type=bpe            # bpe | char
vocab_size=300           # BPE only
conf=conf/train_dnn.yaml # the model conf: runs are named <exp>/<conf name without train_>_<algorithm>-n<workers>
use_lm=true
lm_conf=conf/lm_units.yaml
lm_text=""               # plain-text LM corpus; empty: data/<train-set>/text
decode_methods="greedy beam_lm"   # any of: greedy beam beam_lm (beam_lm needs --use-lm true)
beam=8
lm_weight=0.5
insertion_bonus=1.0
score_hook=""            # run after each decode as: <hook> <data-dir> <decode-dir> (e.g. a recipe's local/score.sh)
speed_perturb=""         # e.g. "0.9 1.0 1.1": train on data/<train-set>_sp, Kaldi's speed perturbation (stage 2)
declare train_stage=4   # (not options: what utils/stages.sh needs to know)
declare epochs_key=train.max_epochs
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/stages.sh"
[ -f "$conf" ] || die "--conf $conf not found"
if [ "$unit_type" = char ]; then lang=data/lang_char; units_args=(--unit-type char)
else lang=data/lang_${unit_type}${vocab_size}; units_args=(--unit-type "$unit_type" --vocab-size "$vocab_size"); fi
run_prefix=$(basename "$conf" .yaml); run_prefix=${run_prefix#train_}_
run_periods=""
runs=()
for algo in $algorithms; do runs+=("$(run_dir "$algo")"); done

data_prep 0 0 --nj "$nj" --train-set "$train_set" --dev-set "$dev_set" --test-sets "$test_sets"

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  for d in $train_set $dev_set $test_sets; do
    [ -d "data/$d" ] || die "data/$d not found: local/data.sh must create it"
    log "Stage 1: validating data/$d"
    "$utils_dir/validate_data_dir.sh" "data/$d" || { log "  data/$d has problems (listed above): fixing"; "$utils_dir/fix_data_dir.sh" "data/$d"; }
  done
fi

if [ -n "$speed_perturb" ]; then  # sp<f>- copies of the training set; stage 2 changes their speed on the fly
  if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ] && [ ! -f "data/${train_set}_sp/.fbank.done" ]; then
    python -m gossip_accel.bin.perturb_speed --src "data/$train_set" --dst "data/${train_set}_sp" --factors "$speed_perturb"
  fi
  train_set=${train_set}_sp
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  for x in $train_set $dev_set $test_sets; do
    if [ -f "data/$x/.fbank.done" ]; then log "Stage 2: data/$x has features"; continue; fi
    log "Stage 2: ${num_mel_bins}-dim fbank of data/$x ($nj jobs)"
    python -m gossip_accel.bin.compute_fbank --data "data/$x" --out "fbank/$x" --nj "$nj" --num-mel-bins "$num_mel_bins" \
      --sample-rate "$sample_rate" $([ "$allow_pipes" = true ] && echo --allow-pipes)
    touch "data/$x/.fbank.done"
  done
  python -m gossip_accel.bin.compute_cmvn --data "data/$train_set"
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  if [ -f "$lang/.done" ]; then
    log "Stage 3: $lang exists"
  else
    log "Stage 3: $unit_type units from data/$train_set/text -> $lang"
    python -m gossip_accel.bin.train_units --text "data/$train_set/text" --lang-dir "$lang" "${units_args[@]}"
    touch "$lang/.done"
  fi
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  train_runs gossip_accel.bin.train_asr --config "$conf" data.train="data/$train_set" data.valid="data/$dev_set" data.lang="$lang"
fi

lm_dir=$exp/lm_$(basename "$lang")
lm_data=data/lm_$(basename "$lang")
if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ] && [ "$use_lm" = true ]; then
  if [ -f "$lm_dir/.done" ]; then
    log "Stage 5: $lm_dir already trained"
  else
    if [ -n "$lm_text" ]; then
      [ -f "$lm_text" ] || die "--lm-text $lm_text not found"
      log "Stage 5: unit-level LSTMP LM on $lm_text -> $lm_dir"
      python -m gossip_accel.bin.units_text --lang-dir "$lang" --plain-text "$lm_text" --out "$lm_data/src/wiki.train.tokens"
    else
      log "Stage 5: unit-level LSTMP LM on the training transcripts (no --lm-text) -> $lm_dir"
      python -m gossip_accel.bin.units_text --lang-dir "$lang" --text "data/$train_set/text" --out "$lm_data/src/wiki.train.tokens"
    fi
    python -m gossip_accel.bin.units_text --lang-dir "$lang" --text "data/$dev_set/text" --out "$lm_data/src/wiki.valid.tokens"
    python -m gossip_accel.bin.prepare_lm --src "$lm_data/src" --out "$lm_data/lm"
    mkdir -p "$lm_dir"
    "$utils_dir/launch.sh" --num-workers 1 --launcher "$launcher" --port "$port" -- \
      -m gossip_accel.bin.train_lm --config "$lm_conf" --exp-dir "$lm_dir" data.dir="$lm_data/lm" sync.enabled=false \
      2>&1 | tee -a "$lm_dir/train.log" | grep --line-buffered '^\[train_lm\]' || true
    [ -f "$lm_dir/results.json" ] || die "LM training failed; see $lm_dir/train.log"
    touch "$lm_dir/.done"
  fi
fi

if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  for dir in "${runs[@]}"; do
    for x in $test_sets; do
      for m in $decode_methods; do
        out=$dir/decode_${x}_$m
        if [ -f "$out/.done" ]; then log "Stage 6: $out done"; continue; fi
        case $m in
          greedy) args=(--method greedy) ;;
          beam) args=(--method beam --beam "$beam") ;;
          beam_lm)
            [ "$use_lm" = true ] || { log "Stage 6: skipping beam_lm (--use-lm false)"; continue; }
            args=(--method beam --beam "$beam" --lm-dir "$lm_dir" --lm-weight "$lm_weight" --insertion-bonus "$insertion_bonus") ;;
          *) die "--decode-methods: unknown method '$m' (greedy, beam, beam_lm)" ;;
        esac
        log "Stage 6: decoding data/$x with $(basename "$dir") ($m)"
        python -m gossip_accel.bin.decode_asr --exp-dir "$dir" --data "data/$x" --out "$out" "${args[@]}"
        [ -z "$score_hook" ] || $score_hook "data/$x" "$out"
        touch "$out/.done"
      done
    done
  done
fi

if [ "$stage" -le 7 ] && [ "$stop_stage" -ge 7 ]; then
  mapfile -t done_runs < <(finished_runs)
  [ ${#done_runs[@]} -gt 0 ] || die "Stage 7: no finished run of $run_prefix* in $exp (stage 4 first)"
  log "Stage 7: the ${#done_runs[@]} finished ${run_prefix%_} runs of $exp -> $exp/RESULTS.md (baseline: $baseline)"
  python -m gossip_accel.bin.asr_report --out "$exp/RESULTS.md" --baseline "$baseline" "${done_runs[@]}"
fi
