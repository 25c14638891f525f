#!/usr/bin/env bash
# The stages of every ASR recipe (a recipe's run.sh gives its corpus's defaults and execs this):
#   0 local/data.sh (the corpus's: Kaldi data dirs data/<train-set>, <dev-set>, <test-sets>, and the dev sets of
#     --tune-sets whose test sets are decoded)
#   1 validate the data dirs (utils/validate_data_dir.sh; utils/fix_data_dir.sh when needed)
#   2 fbank features (+ global CMVN on the training set)   3 units (sentencepiece BPE or char, or the phones of
#     --lexicon and/or --g2p flite's pronunciations: a phone model decodes to words with beam_word alone)
#   4 train CTC models with `accelerate launch`, one run per --algorithms entry
#   5 the LMs the decode methods need: for beam_lm a unit-level LSTMP LM (shallow fusion; --use-lm true)
#     on --lm-text (one sentence per line, e.g. LibriSpeech's librispeech-lm-norm.txt[.gz]) or, without
#     it, the training transcripts; for beam_word a word n-gram of the same text (--word-lm-order N;
#     KenLM's lmplz, built by utils/install_kenlm.sh when missing) with a lexicon spelled in the units
#     (its words, and --word-list's: a dictionary, one word per line, its words scored as unseen by the n-gram)
#   6 decode every test set (--decode-methods: greedy, beam, beam_lm, beam_word) with the average of each run's
#     --avg N epoch models (--avg-mode best: the N lowest CV losses; last: the last N; each epoch's
#     model is the replicas' global average) -> <run>/decode_<set>_<method>_avg_<mode><N>;
#     --avg 0: the final model -> <run>/decode_<set>_<method>; beam_word's LM weight and word score are tuned on
#     --dev-set, or on a test set's own dev set (--tune-sets "test_other:dev_other", as LibriSpeech's recipes do)
#   7 <exp>/RESULTS.md: the table at a glance (a row per run: %WER, %CER of each test set, MB sent
#     per step, vs the baseline), then a WER/CER row per finished run of the model (any algorithm,
#     any tag), set, method and checkpoint
#
# Decode what exists: --model-dir "exp/dnn_ddp-n4 exp/dnn_gossip_*" (run dirs, globs allowed)
# makes stages 6-7 decode and report those runs instead of --algorithms'; --test-only true makes
# stages 0-2 prepare only the test sets (local/data.sh --test-only true; their features, with the
# training set's CMVN left as it is) and skips stages 3-5 (units, training, LM: they exist):
#   ./run.sh --test-only true --test-sets "test_clean my_set" --model-dir "exp/dnn_*"
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
unit_type=bpe            # bpe | char | phone (a pronunciation lexicon's phones; decoded to words by beam_word)
vocab_size=300           # BPE only
lexicon=""               # phone units: WORD PH1 PH2 ... per line (LibriSpeech's librispeech-lexicon.txt)
g2p=""                   # phone units: pronounce the words the lexicon lacks (flite: flite's t2p), in stages 3 and 5
conf=conf/train_dnn.yaml # the model conf: runs are named <exp>/<conf name without train_>_<algorithm>-n<workers>
use_lm=true
lm_conf=conf/lm_units.yaml
lm_text=""               # plain-text LM corpus; empty: data/<train-set>/text
decode_methods="greedy beam_lm"   # any of: greedy beam beam_lm beam_word (beam_lm needs --use-lm true,
                         # beam_word --word-lm-order > 0)
beam=8
lm_weight=0.5
insertion_bonus=1.0
word_lm_order=3          # stage 5's word n-gram for beam_word (lexicon decoding), made when --decode-methods has beam_word
word_beam=400            # beam_word: the beam, and the units tried per frame (flashlight's beam_size_token): 400 and 6
word_beam_tokens=6       # beat 200 and all units in WER and time on dev-clean (recipes/librispeech/asr1/RESULTS.md)
word_lm_weights="1 2 3"  # (the pair of lowest dev WER decodes the test sets, as Kaldi's scoring picks its
word_scores="-1 0 1"     # LM weight; <run>/word_tuning_<model>[_<list name>]_on_<dev set>.json keeps every pair's dev WER)
tune_sets=""             # test:dev pairs: the dev set a test set's LM weight and word score are tuned on, e.g.
                         # "test_other:dev_other" (LibriSpeech's); the other test sets are tuned on --dev-set. Stages
                         # 0-2 prepare the dev sets of the pairs whose test set is decoded, when there is a grid to tune
word_list=""             # a dictionary (one word per line) whose words join beam_word's lexicon as words the
                         # n-gram has not seen (make_word_lm --word-list); its LM dir is word_lm<N>_<lang>_<list name>
score_hook=""            # run after each decode as: <hook> <data-dir> <decode-dir> (e.g. a recipe's local/score.sh)
avg=5                    # stage 6 decodes the average of N epoch models of each run; 0: its final model
decode_jobs=2            # stage 6 decodes this many runs at once (each run's log then in <run>/decode.log)
avg_mode=best            # best: the N epochs of lowest CV loss (results.json) | last: the last N epochs
model_dir=""             # stages 6-7: these run dirs (space-separated, globs allowed) instead of --algorithms' runs
test_only=false          # true: stages 0-2 prepare the test sets alone, stages 3-5 are skipped (decode what exists)
speed_perturb=""         # e.g. "0.9 1.0 1.1": train on data/<train-set>_sp, Kaldi's speed perturbation (stage 2)
augment=0                # N > 0: train on data/<train-set>_aug<N>: the set and N noise/reverberation copies (after speed_perturb)
augment_opts=""          # more options of gossip_accel.bin.augment_data, e.g. "--snr 10,20 --noise babble --reverb-probability 1"
declare train_stage=4   # (not options: what utils/stages.sh needs to know)
declare epochs_key=train.max_epochs
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/stages.sh"
[ -f "$conf" ] || die "--conf $conf not found"
case $unit_type in
  char) lang=data/lang_char; units_args=(--unit-type char) ;;
  phone) lang=data/lang_phone; units_args=(--unit-type phone ${lexicon:+--lexicon "$lexicon"} ${g2p:+--g2p "$g2p"})
         [ -n "$lexicon$g2p" ] || die "--unit-type phone needs --lexicon FILE (WORD PH1 PH2 ... per line) or --g2p flite"
         [ -z "$lexicon" ] || [ -f "$lexicon" ] || die "--lexicon $lexicon not found" ;;
  *) lang=data/lang_${unit_type}${vocab_size}; units_args=(--unit-type "$unit_type" --vocab-size "$vocab_size") ;;
esac
run_prefix=$(basename "$conf" .yaml); run_prefix=${run_prefix#train_}_
run_periods=""
runs=()
for algo in $algorithms; do runs+=("$(run_dir "$algo")"); done
if [ -n "$model_dir" ]; then
  runs=()
  for d in $model_dir; do   # word splitting and globbing wanted: run dirs and patterns
    [ -f "$d/config.yaml" ] || die "--model-dir: $d is not a training run dir (no $d/config.yaml)"
    runs+=("${d%/}")
  done
fi
case $avg in ''|*[!0-9]*) die "--avg $avg: a number of epoch models (0: the final model)" ;; esac
case $avg_mode in best|last) ;; *) die "--avg-mode $avg_mode: use best or last" ;; esac
checkpoint=final; decode_suffix=""
[ "$avg" = 0 ] || { checkpoint=avg_${avg_mode}${avg}; decode_suffix=_$checkpoint; }
case $test_only in true|false) ;; *) die "--test-only $test_only: use true or false" ;; esac
declare -A tune_set_of=()   # test set -> the dev set its word decoding is tuned on (--tune-sets; the rest: --dev-set)
tune_dev_sets=""            # those dev sets, when beam_word has a grid to tune: prepared in stages 0-2
for pair in $tune_sets; do
  [[ $pair == ?*:?* && $pair != *:*:* ]] || die "--tune-sets '$pair': a test:dev pair of data set names (e.g. test_other:dev_other)"
  [[ " $test_sets " == *" ${pair%%:*} "* ]] || continue   # a test set not decoded this time
  tune_set_of[${pair%%:*}]=${pair#*:}
done
read -r -a weights <<< "$word_lm_weights"; read -r -a scores <<< "$word_scores"   # the grid beam_word tunes (stage 6)
word_tuning=false           # beam_word tunes its LM weight and word score (a grid of more than one pair)
[[ " $decode_methods " != *" beam_word "* ]] || [ $((${#weights[@]} * ${#scores[@]})) -le 1 ] || word_tuning=true
if [ "$word_tuning" = true ]; then
  for d in "${tune_set_of[@]}"; do
    [[ " $dev_set $test_sets $tune_dev_sets " == *" $d "* ]] || tune_dev_sets+="${tune_dev_sets:+ }$d"
  done
fi
eval_sets="$test_sets${tune_dev_sets:+ $tune_dev_sets}"   # what stages 0-2 prepare besides the training and dev sets
prep_sets="$train_set $dev_set $eval_sets"
skip_built() {  # skip_built STAGE: true (and says so) when --test-only skips that stage
  [ "$test_only" = true ] || return 1
  log "Stage $1: skipped (--test-only true: the units, models and LM exist)"
}
if [ "$test_only" = true ]; then
  prep_sets=$eval_sets
  if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
    grep -q -- '--test-only <' <<< "$(local/data.sh --help 2>&1)" \
      || die "--test-only: this recipe's local/data.sh has no --test-only option (make data/<test set> yourself, then --stage 1)"
  fi
  data_prep 0 0 --nj "$nj" --train-set "$train_set" --dev-set "$dev_set" --test-sets "$eval_sets" --test-only true
else
  data_prep 0 0 --nj "$nj" --train-set "$train_set" --dev-set "$dev_set" --test-sets "$eval_sets"
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  for d in $prep_sets; do
    [ -d "data/$d" ] || die "data/$d not found: local/data.sh must create it"
    log "Stage 1: validating data/$d"
    "$utils_dir/validate_data_dir.sh" "data/$d" || { log "  data/$d has problems (listed above): fixing"; "$utils_dir/fix_data_dir.sh" "data/$d"; }
  done
fi

# What a data dir's features are made from: its audio tables (wav.scp, segments, and the speed and noise of
# the copies below) and the fbank options. Stage 2 writes it into <dir>/.fbank.done and keeps features only
# while it holds, so a set whose audio changed (another mini corpus, new data under the same name) gets new
# features, and its copies (_sp, _aug<N>: their .made_from) are made again from it.
audio_key() {  # audio_key DIR
  { for f in wav.scp segments utt2speed utt2augment; do [ ! -f "$1/$f" ] || { echo "== $f"; cat "$1/$f"; }; done
    echo "num_mel_bins=$num_mel_bins sample_rate=$sample_rate"; } | md5sum | cut -d' ' -f1
}
up_to_date() {  # up_to_date MARKER KEY SOURCE: MARKER holds KEY, or is empty (made before the keys) and not
  local had        # older than SOURCE (then KEY is written into it)
  [ -f "$1" ] || return 1
  had=$(cat "$1")
  [ "$had" = "$2" ] && return 0
  [ -z "$had" ] && [ ! "$3" -nt "$1" ] && { echo "$2" > "$1"; return 0; }
  return 1
}
made_from=""
copy_needed() {  # copy_needed SRC DST OPTIONS: stage 2 runs and DST was not made from SRC's audio with OPTIONS
  [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ] || return 1
  made_from="$(audio_key "$1") $3"
  if [ -f "$2/.made_from" ]; then [ "$(cat "$2/.made_from")" != "$made_from" ] || return 1
  elif [ -f "$2/.fbank.done" ] && [ ! -s "$2/.fbank.done" ] && [ ! "$1/wav.scp" -nt "$2/.fbank.done" ]; then
    echo "$made_from" > "$2/.made_from"; return 1   # made before the keys, and after SRC's last change
  fi
  [ ! -d "$2" ] || log "Stage 2: $2 was not made from $1 as it is now (audio or $3): making it again"
}
if [ -n "$speed_perturb" ] && [ "$test_only" != true ]; then  # sp<f>- copies of the training set; stage 2 changes their speed on the fly
  if copy_needed "data/$train_set" "data/${train_set}_sp" "speed=$speed_perturb"; then
    python -m gossip_accel.bin.perturb_speed --src "data/$train_set" --dst "data/${train_set}_sp" --factors "$speed_perturb"
    echo "$made_from" > "data/${train_set}_sp/.made_from"
  fi
  train_set=${train_set}_sp
  prep_sets="$train_set $dev_set $eval_sets"
fi
case $augment in ''|*[!0-9]*) die "--augment $augment: a number of augmented copies (0: none)" ;; esac
if [ "$augment" -gt 0 ] && [ "$test_only" != true ]; then  # aug<i>- copies; stage 2 adds their noise and reverberation
  if copy_needed "data/$train_set" "data/${train_set}_aug$augment" "augment=$augment $augment_opts"; then
    # shellcheck disable=SC2086  # word splitting of the options wanted
    python -m gossip_accel.bin.augment_data --src "data/$train_set" --dst "data/${train_set}_aug$augment" \
      --copies "$augment" $augment_opts || die "augment_data failed (--augment-opts '$augment_opts')"
    echo "$made_from" > "data/${train_set}_aug$augment/.made_from"
  fi
  train_set=${train_set}_aug$augment
  prep_sets="$train_set $dev_set $eval_sets"
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  todo=() keys=()
  for x in $prep_sets; do
    key=$(audio_key "data/$x")
    if [ -f "data/$x/feats.scp" ] && up_to_date "data/$x/.fbank.done" "$key" "data/$x/wav.scp"; then
      log "Stage 2: data/$x has features"; continue
    fi
    [ ! -f "data/$x/.fbank.done" ] || log "Stage 2: data/$x changed since its features (audio tables or fbank options)"
    log "Stage 2: ${num_mel_bins}-dim fbank of data/$x ($nj jobs)"
    todo+=("data/$x") keys+=("$key")
  done
  if [ ${#todo[@]} -gt 0 ]; then   # one process for every set (one start of torch), archives in fbank/<set>
    python -m gossip_accel.bin.compute_fbank --data "${todo[@]}" --out-root fbank --nj "$nj" \
      --num-mel-bins "$num_mel_bins" --sample-rate "$sample_rate" $([ "$allow_pipes" = true ] && echo --allow-pipes)
    for i in "${!todo[@]}"; do echo "${keys[$i]}" > "${todo[$i]}/.fbank.done"; done
  fi
  # each set's own per-speaker stats (data.speaker_cmvn=true; Kaldi's data/<set>/cmvn.scp), again after new features
  stale=()
  for x in $prep_sets; do
    if [ ! -f "data/$x/cmvn_spk.ark" ] || [ "data/$x/feats.scp" -nt "data/$x/cmvn_spk.ark" ]; then stale+=("data/$x"); fi
  done
  [ ${#stale[@]} -eq 0 ] || python -m gossip_accel.bin.compute_cmvn --per-speaker --data "${stale[@]}"
  # the training set's CMVN (every set's features are normalized with it): computed once, again
  # only when its features were recomputed; never for a test set prepared alone
  cmvn=data/$train_set/cmvn.ark
  if [ "$test_only" = true ]; then
    log "Stage 2: --test-only true: the training set's $cmvn is left as it is"
  elif [ -f "$cmvn" ] && [ ! "data/$train_set/feats.scp" -nt "$cmvn" ]; then
    log "Stage 2: $cmvn is up to date"
  else
    python -m gossip_accel.bin.compute_cmvn --data "data/$train_set"
  fi
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ] && ! skip_built 3; then
  made_with="${lexicon:+$(realpath -ms "$lexicon")}${g2p:+ g2p=$g2p}"   # phone units' .done: what they came from
  if [ -f "$lang/.done" ] && [ "$unit_type" = phone ] && [ -s "$lang/.done" ] && [ "$(cat "$lang/.done")" != "$made_with" ]; then
    die "Stage 3: $lang was made from '$(cat "$lang/.done")', not '$made_with' (--lexicon/--g2p); models trained on it" \
        "need its phones: remove $lang (and retrain) to use the new ones, or give the old options"
  elif [ -f "$lang/.done" ]; then
    log "Stage 3: $lang exists"
  else
    log "Stage 3: $unit_type units from data/$train_set/text -> $lang"
    python -m gossip_accel.bin.train_units --text "data/$train_set/text" --lang-dir "$lang" "${units_args[@]}"
    if [ "$unit_type" = phone ]; then echo "$made_with" > "$lang/.done"; else touch "$lang/.done"; fi
  fi
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ] && ! skip_built 4; then
  train_runs gossip_accel.bin.train_asr --config "$conf" data.train="data/$train_set" data.valid="data/$dev_set" data.lang="$lang"
fi

lm_dir=$exp/lm_$(basename "$lang")
lm_data=data/lm_$(basename "$lang")
# each LM of stage 5 is made when a decode method needs it: the unit LM for beam_lm, the word LM for beam_word
if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ] && [ "$use_lm" = true ] && [[ " $decode_methods " == *" beam_lm "* ]] \
   && [ "$unit_type" != phone ] && ! skip_built 5; then   # phone units decode with beam_word only
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
case $word_lm_order in ''|*[!0-9]*) die "--word-lm-order $word_lm_order: an n-gram order (0: no word LM)" ;; esac
lexicon_tag=${word_list:+_$(basename "$word_list")}   # a lexicon widened by --word-list: its LM and decode dirs
word_lm_dir=data/word_lm${word_lm_order}_$(basename "$lang")$lexicon_tag
if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ] && [ "$word_lm_order" -gt 0 ] && [[ " $decode_methods " == *" beam_word "* ]] \
   && ! skip_built 5; then
  built_from=${word_list:+$(realpath -ms "$word_list")}   # .done names the list (absolute; links not followed)
  built_with=$(cat "$word_lm_dir/.done" 2>/dev/null) || built_with="(none)"   # the list it was built with
  text_newer=false   # the LM text changed since (local/data.sh rewrote it)
  [ ! -f "$word_lm_dir/.done" ] || [ -z "$lm_text" ] || [ ! "$lm_text" -nt "$word_lm_dir/.done" ] || text_newer=true
  if [ "$built_with" = "$built_from" ] && [ "$text_newer" = false ]; then
    log "Stage 5: $word_lm_dir exists"
  else
    [ "$text_newer" = false ] || log "Stage 5: $lm_text is newer than $word_lm_dir: rebuilding it"
    [ "$built_with" = "$built_from" ] || [ "$built_with" = "(none)" ] \
      || log "Stage 5: $word_lm_dir was built with another --word-list" \
      "('$built_with', now '$built_from', the same file name): rebuilding it"
    command -v lmplz >/dev/null 2>&1 || PATH="$("$utils_dir/install_kenlm.sh"):$PATH" \
      || die "Stage 5: KenLM's lmplz is needed for the word LM (above); --word-lm-order 0 goes without it"
    if [ -n "$lm_text" ]; then src=(--plain-text "$lm_text"); else src=(--text "data/$train_set/text"); fi
    [ -z "$word_list" ] || [ -f "$word_list" ] || "$utils_dir/install_system_deps.sh" "$word_list" \
      || die "Stage 5: --word-list $word_list not found"
    log "Stage 5: word ${word_lm_order}-gram and lexicon of ${src[1]} -> $word_lm_dir"
    python -m gossip_accel.bin.make_word_lm --lang-dir "$lang" "${src[@]}" --out "$word_lm_dir" \
      --order "$word_lm_order" --dev-text "data/$dev_set/text" ${word_list:+--word-list "$word_list"}
    echo "$built_from" > "$word_lm_dir/.done"
  fi
fi

average_of() {  # average_of RUN_DIR: model_args = decode_asr's model arguments (the average made when due)
  model_args=(--model "$1/final.pt")
  [ "$avg" != 0 ] || return 0
  local model=$1/$checkpoint.pt
  if [ ! -f "$model" ] || [ "$1/results.json" -nt "$model" ]; then
    log "Stage 6: $model: the average of $(basename "$1")'s $avg_mode $avg epoch models"
    python -m gossip_accel.bin.average_checkpoints --exp-dir "$1" --avg "$avg" --avg-mode "$avg_mode" \
      || die "Stage 6: averaging the epoch models of $1 failed (above); --avg 0 decodes its final model"
  fi
  model_args=(--model "$model")
}

decode_run() {  # decode_run RUN_DIR: stage 6 for one run: every test set x method (the model averaged first)
  local dir=$1 x m out args tune made_as was
  model_args=()
  for x in $test_sets; do
    tune=${tune_set_of[$x]:-$dev_set}
    for m in $decode_methods; do
      out=$dir/decode_${x}_$m$decode_suffix
      made_as=""   # what .done holds: a word decode's (LM weight, word score) grid and the set it was tuned on
      if [ "$m" = beam_word ]; then
        out=$dir/decode_${x}_$m$lexicon_tag$decode_suffix   # beside the plain lexicon's
        made_as="LM weights ${weights[*]}, word scores ${scores[*]}"
        [ "$word_tuning" = false ] || made_as+=", tuned on data/$tune"
      fi
      # done, unless the word LM it decoded with was rebuilt since (another --word-list of the same name) or it was
      # made with another grid or tuning set
      if [ -f "$out/.done" ]; then
        was=$(cat "$out/.done")
        if [ "$was" = "$made_as" ] && { [ "$m" != beam_word ] || [ "$out/.done" -nt "$word_lm_dir/.done" ]; }; then
          log "Stage 6: $out done"; continue
        fi
        [ "$was" = "$made_as" ] || log "Stage 6: $out was made with '$was', not '$made_as': decoding again"
      fi
      if [ "$m" != beam_word ] && [ -f "$(sed -n 's/^  lang: //p' "$dir/config.yaml")/units.json" ]; then
        log "Stage 6: skipping $m for $(basename "$dir"): phone units decode to words through the lexicon only (beam_word)"
        continue
      fi
      [ ${#model_args[@]} -gt 0 ] || average_of "$dir"
      case $m in
        greedy) args=(--method greedy) ;;
        beam) args=(--method beam --beam "$beam") ;;
        beam_lm)
          [ "$use_lm" = true ] || { log "Stage 6: skipping beam_lm (--use-lm false)"; continue; }
          [ -f "$lm_dir/final.pt" ] || die "Stage 6: beam_lm needs the LM $lm_dir/final.pt (stage 5), or --decode-methods greedy"
          args=(--method beam --beam "$beam" --lm-dir "$lm_dir" --lm-weight "$lm_weight" --insertion-bonus "$insertion_bonus") ;;
        beam_word)
          [ -f "$word_lm_dir/lexicon.txt" ] || die "Stage 6: beam_word needs the word LM $word_lm_dir (stage 5, --word-lm-order > 0${word_list:+; --word-list \"\": the lexicon without $word_list})"
          args=(--method word --beam "$word_beam" --beam-size-token "$word_beam_tokens" --word-lm-dir "$word_lm_dir"
                --word-lm-weight "${weights[@]}" --word-score "${scores[@]}" --tune-data "data/$tune") ;;
        *) die "--decode-methods: unknown method '$m' (greedy, beam, beam_lm, beam_word)" ;;
      esac
      log "Stage 6: decoding data/$x with $(basename "$dir") ($m, $checkpoint)"
      python -m gossip_accel.bin.decode_asr --exp-dir "$dir" --data "data/$x" --out "$out" "${args[@]}" "${model_args[@]}"
      [ -z "$score_hook" ] || $score_hook "data/$x" "$out"
      echo "$made_as" > "$out/.done"
    done
  done
}
if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  case $decode_jobs in ''|*[!0-9]*|0) die "--decode-jobs $decode_jobs: a number of runs decoded at once (>= 1)" ;; esac
  if [ "$decode_jobs" -eq 1 ] || [ ${#runs[@]} -le 1 ]; then
    for dir in "${runs[@]}"; do decode_run "$dir"; done
  else   # runs at once, each logging to <run>/decode.log
    pids=()
    for dir in "${runs[@]}"; do
      while [ "$(jobs -rp | wc -l)" -ge "$decode_jobs" ]; do sleep 1; done
      log "Stage 6: decoding $(basename "$dir") in the background (log: $dir/decode.log)"
      decode_run "$dir" > "$dir/decode.log" 2>&1 &
      pids+=($!)
    done
    failed=()
    for i in "${!pids[@]}"; do
      if wait "${pids[$i]}"; then log "Stage 6: $(basename "${runs[$i]}") decoded"
      else failed+=("${runs[$i]}"); tail -n 20 "${runs[$i]}/decode.log" >&2; fi
    done
    [ ${#failed[@]} -eq 0 ] || die "Stage 6: decoding failed for ${failed[*]} (the end of each decode.log above)"
  fi
fi

if [ "$stage" -le 7 ] && [ "$stop_stage" -ge 7 ]; then
  if [ -n "$model_dir" ]; then done_runs=("${runs[@]}"); else mapfile -t done_runs < <(finished_runs); fi
  [ ${#done_runs[@]} -gt 0 ] || die "Stage 7: no finished run of $run_prefix* in $exp (stage 4 first)"
  log "Stage 7: the ${#done_runs[@]} finished ${run_prefix%_} runs of $exp -> $exp/RESULTS.md (baseline: $baseline)"
  python -m gossip_accel.bin.asr_report --out "$exp/RESULTS.md" --baseline "$baseline" --checkpoint "$checkpoint" \
    "${done_runs[@]}"
fi
