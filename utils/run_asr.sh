#!/usr/bin/env bash
# The shared ASR stages of every ASR recipe, after its own data preparation (stages 0-1):
#   2 fbank features (+ global CMVN on the training set)   3 units (sentencepiece BPE or char)
#   4 train CTC models with `accelerate launch`, one run per --algorithms entry
#   5 unit-level LSTMP LM (for shallow fusion; --use-lm true) on --lm-text (one sentence per
#     line, e.g. LibriSpeech's librispeech-lm-norm.txt[.gz]) or, without it, the training transcripts
#   6 decode every test set (--decode-methods: greedy, beam, beam_lm)   7 RESULTS.md: a WER/CER row per run, set, method
#
#   utils/run_asr.sh --train-set train_clean_100 --dev-set dev_clean --test-sets "test_clean test_other" \
#       --conf conf/train_dnn.yaml --algorithms "single ma bmuf gossip_bmuf" --num-workers 4 [-- overrides]
#
# Every stage skips work that is done (.done markers); training resumes from its last checkpoint
# (epoch ends, and every train.checkpoint_every_steps steps). --max-restarts N: a worker that
# dies or hangs (train.collective_timeout) makes the launcher restart the job by itself, up to
# N times; the count is logged after training and written to results.json ("restarts").
# Several machines: run the same command on each with --num-nodes N --node-rank R --master-addr
# <node 0> (utils/launch.sh; utils/slurm.sh does it under Slurm); --num-workers is per node. A
# node with --node-rank > 0 runs stage 4 only (its workers join node 0's job), logging to
# <run>/train.node<R>.log; node 0 runs every stage.
set -euo pipefail
stage=2
stop_stage=7
train_set=train_clean_100
dev_set=dev_clean
test_sets="test_clean test_other"
nj=2
num_mel_bins=80
sample_rate=16000        # of the audio (8000 for telephone speech: Switchboard)
allow_pipes=false        # true: run Kaldi pipes of wav.scp ("sph2pipe ... |") with bash; false refuses them
unit_type=bpe            # bpe | char
vocab_size=300           # BPE only
conf=conf/train_dnn.yaml
algorithms=gossip_bmuf   # single ddp ma bmuf local_ma local_bmuf gossip_ma gossip_bmuf
num_workers=4            # per node
num_nodes=1
node_rank=0
master_addr=127.0.0.1
launcher=accelerate
port=29541
max_restarts=0
use_lm=true
lm_conf=conf/lm_units.yaml
lm_text=""               # plain-text LM corpus; empty: data/<train-set>/text
decode_methods="greedy beam_lm"   # any of: greedy beam beam_lm (beam_lm needs --use-lm true)
beam=8
lm_weight=0.5
insertion_bonus=1.0
score_hook=""            # run after each decode as: <hook> <data-dir> <decode-dir> (e.g. a recipe's local/score.sh)
exp=exp
help_message="Usage: utils/run_asr.sh [options] [-- trainer overrides]"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/log.sh"
. "$here/parse_options.sh"
[ "${1:-}" = "--" ] && shift
extra=("$@")
[ -f "$conf" ] || die "--conf $conf not found"
if [ "$unit_type" = char ]; then lang=data/lang_char; units_args=(--unit-type char)
else lang=data/lang_${unit_type}${vocab_size}; units_args=(--unit-type "$unit_type" --vocab-size "$vocab_size"); fi
tag=$(basename "$conf" .yaml); tag=${tag#train_}

total_workers=$((num_workers * num_nodes))
run_dir() {
  case $1 in
    single) echo "$exp/${tag}_single-n1" ;;
    ddp) echo "$exp/${tag}_ddp-n$total_workers" ;;
    *) echo "$exp/${tag}_$1-n$total_workers" ;;
  esac
}
if [ "$node_rank" != 0 ]; then
  # a worker node: only the training stage, whose workers join node 0's job
  [ $stage -le 4 ] && [ $stop_stage -ge 4 ] || { log "node $node_rank: nothing to do outside stage 4"; exit 0; }
  stage=4
  stop_stage=4
fi
multinode=(--num-nodes "$num_nodes" --node-rank "$node_rank" --master-addr "$master_addr")
restarts_of() {  # restarts_of RESULTS_JSON -> the trainer's restart count
  python -c 'import json, sys; print(json.load(open(sys.argv[1])).get("restarts", 0))' "$1"
}

if [ $stage -le 2 ] && [ $stop_stage -ge 2 ]; then
  for x in $train_set $dev_set $test_sets; do
    if [ -f "data/$x/.fbank.done" ]; then log "Stage 2: data/$x has features"; continue; fi
    log "Stage 2: ${num_mel_bins}-dim fbank of data/$x ($nj jobs)"
    python -m gossip_accel.bin.compute_fbank --data "data/$x" --out "fbank/$x" --nj "$nj" --num-mel-bins "$num_mel_bins" \
      --sample-rate "$sample_rate" $([ "$allow_pipes" = true ] && echo --allow-pipes)
    touch "data/$x/.fbank.done"
  done
  python -m gossip_accel.bin.compute_cmvn --data "data/$train_set"
fi

if [ $stage -le 3 ] && [ $stop_stage -ge 3 ]; then
  if [ -f "$lang/.done" ]; then
    log "Stage 3: $lang exists"
  else
    log "Stage 3: $unit_type units from data/$train_set/text -> $lang"
    python -m gossip_accel.bin.train_units --text "data/$train_set/text" --lang-dir "$lang" "${units_args[@]}"
    touch "$lang/.done"
  fi
fi

if [ $stage -le 4 ] && [ $stop_stage -ge 4 ]; then
  for algo in $algorithms; do
    dir=$(run_dir "$algo")
    if [ -f "$dir/.done" ]; then log "Stage 4: $dir already trained"; continue; fi
    workers=$num_workers
    nodes=("${multinode[@]}")
    case $algo in
      single) workers=1; nodes=(); sync_args=(sync.enabled=false)
        [ "$node_rank" = 0 ] || { log "Stage 4: node $node_rank: 'single' runs on node 0 only"; continue; } ;;
      ddp) sync_args=(sync.enabled=false) ;;
      *) sync_args=(sync.algorithm="$algo") ;;
    esac
    mkdir -p "$dir"
    train_log=$dir/train.log
    [ "$node_rank" = 0 ] || train_log=$dir/train.node$node_rank.log
    log "Stage 4: training $tag with '$algo' on $workers worker(s)$([ ${#nodes[@]} -gt 0 ] && [ $num_nodes -gt 1 ] && echo " x $num_nodes nodes (this is node $node_rank)") -> $dir (log: $train_log)"
    "$here/launch.sh" --num-workers "$workers" ${nodes[@]+"${nodes[@]}"} --launcher "$launcher" --port "$port" \
      --max-restarts "$max_restarts" -- \
      -m gossip_accel.bin.train_asr --config "$conf" --exp-dir "$dir" --name "$(basename "$dir")" \
      data.train="data/$train_set" data.valid="data/$dev_set" data.lang="$lang" "${sync_args[@]}" \
      ${extra[@]+"${extra[@]}"} 2>&1 | tee -a "$train_log" | grep --line-buffered '^\[train_asr\]' || true
    if [ "$node_rank" != 0 ]; then
      log "Stage 4: node $node_rank: its workers finished (node 0 writes $dir/results.json)"
      continue
    fi
    if [ ! -f "$dir/results.json" ]; then
      grep -E 'Error|error:' "$dir/train.log" | grep -v Warning | sort -u | tail -n 5 >&2 || true
      die "training '$algo' failed; see $dir/train.log"
    fi
    log "Stage 4: '$algo' trained; restarts after a failed worker: $(restarts_of "$dir/results.json")"
    touch "$dir/.done"
  done
fi

lm_dir=$exp/lm_$(basename "$lang")
lm_data=data/lm_$(basename "$lang")
if [ $stage -le 5 ] && [ $stop_stage -ge 5 ] && [ "$use_lm" = true ]; then
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
    "$here/launch.sh" --num-workers 1 --launcher "$launcher" --port "$port" -- \
      -m gossip_accel.bin.train_lm --config "$lm_conf" --exp-dir "$lm_dir" data.dir="$lm_data/lm" sync.enabled=false \
      2>&1 | tee -a "$lm_dir/train.log" | grep --line-buffered '^\[train_lm\]' || true
    [ -f "$lm_dir/results.json" ] || die "LM training failed; see $lm_dir/train.log"
    touch "$lm_dir/.done"
  fi
fi

if [ $stage -le 6 ] && [ $stop_stage -ge 6 ]; then
  for algo in $algorithms; do
    dir=$(run_dir "$algo")
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

if [ $stage -le 7 ] && [ $stop_stage -ge 7 ]; then
  log "Stage 7: $exp/RESULTS.md"
  dirs=()
  for algo in $algorithms; do dirs+=("$(run_dir "$algo")"); done
  python -m gossip_accel.bin.asr_report --out "$exp/RESULTS.md" "${dirs[@]}"
fi
