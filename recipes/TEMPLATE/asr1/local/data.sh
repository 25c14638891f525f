#!/usr/bin/env bash
# Data preparation of this recipe: the one script a new corpus must write (see docs/RECIPES.md).
# Contract: create the Kaldi data dirs data/<train-set>, data/<dev-set> and data/<test-set> for
# each test set, each with wav.scp (a path or `cmd |`, keyed by recording if there is a
# segments file), text, utt2spk, spk2utt, and optionally segments, reco2file_and_channel,
# spk2gender; sorted (LC_ALL=C), speaker ids prefixing utterance ids. utils/run_asr.sh runs this
# as stage 0 (`local/data.sh --nj N --train-set X --dev-set Y --test-sets "Z ..."`, plus any of its
# own options given to ./run.sh) and validates the dirs next (stage 1). Reruns should skip work
# that is done.
#
# THIS EXAMPLE builds a tiny LibriSpeech-layout corpus with Debian's flite voices (the LibriSpeech
# recipe's builder) and converts it with that recipe's data_prep.py; replace it with your corpus's.
set -euo pipefail
nj=2
train_set=train
dev_set=dev
test_sets=test
corpus_root=""          # your corpus; empty: the example's synthetic corpus
train_utts=200
eval_utts=40
help_message="Usage: local/data.sh [options]"
. utils/parse_options.sh
. utils/log.sh
[ -n "${GOSSIP_ROOT:-}" ] || die "source path.sh first"
ls_local="$GOSSIP_ROOT/recipes/librispeech/asr1/local"

if [ -z "$corpus_root" ]; then
  corpus_root=data/example_corpus
  utils/install_system_deps.sh flite   # the example's voices
  python "$ls_local/make_mini_librispeech.py" --out "$corpus_root" --train-utts "$train_utts" --eval-utts "$eval_utts" --jobs "$nj"
fi
set -- $test_sets   # word splitting wanted: a list of set names
[ $# -eq 1 ] || die "this example makes one test set, got --test-sets '$test_sets'"
for pair in "train-clean-100 $train_set" "dev-clean $dev_set" "test-clean $test_sets"; do
  read -r src dst <<< "$pair"
  log "  $corpus_root/$src -> data/$dst"
  python "$ls_local/data_prep.py" --src "$corpus_root/$src" --out "data/$dst"
done
