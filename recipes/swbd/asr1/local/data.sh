#!/usr/bin/env bash
# Switchboard-1 (LDC97S62) and Hub5'00 (eval2000: LDC2002S09 speech, LDC2002T43 transcripts) ->
# Kaldi data dirs (the contract of docs/RECIPES.md; utils/run_asr.sh runs this as stage 0 and
# validates the dirs in stage 1): data/train (all of Switchboard), split into data/<dev-set>
# (Kaldi: the first 4000 utterances) and data/<train-set> (the rest, at most --max-dup copies of
# one transcript), and data/eval2000 with its halves eval2000_swbd and eval2000_callhome (the test
# sets), each with segments and reco2file_and_channel. Without --swbd-root: the MINI Switchboard
# (8 kHz shortened two-channel SPHERE in the LDC layouts) synthesized offline with flite voices.
# --test-only true: data/eval2000{,_swbd,_callhome} alone (decoding models that exist), from
# --eval2000-speech and --eval2000-transcripts (no --swbd-root needed), or the mini corpus's.
set -euo pipefail
nj=2
train_set=train_nodup
dev_set=train_dev
test_sets="eval2000_swbd eval2000_callhome"   # any of eval2000 eval2000_swbd eval2000_callhome
swbd_root=""            # LDC97S62 (the .sph files); empty: the mini corpus
swbd_transcripts=""     # swb_ms98_transcriptions (default: found under or beside --swbd-root)
eval2000_speech=""      # LDC2002S09 (or its hub5e_00 folder)
eval2000_transcripts="" # LDC2002T43
wav_style=path          # path: wav.scp holds the .sph (read directly, shortened or not) | sph2pipe | sox
dev_utts=""             # dev set size (Kaldi: first 4000 utterances; mini: 150)
max_dup=300             # copies of one transcript kept in the training set
mini_train_convs=30     # size of the mini corpus: conversations (2 sides each) ...
mini_segs_per_side=15   # ... segments per side (30 x 2 x 15 = 900 training segments, ~0.75 h of speech)
mini_eval_convs=2       # eval2000 conversations of each half (SWB, CallHome) ...
mini_eval_segs_per_side=12   # ... and their segments per side
mini_more_train_convs=0      # more training conversations (after the others; train_dev keeps its own) ...
mini_more_train_voices=""    # ... between speakers of these voices: flite's, espeak-ng's ('espeak-*-m1'), never awb ...
mini_more_train_speakers=0   # ... this many speakers, one number per group (';' separates groups of voices), dealt in turn
test_only=false         # true: only eval2000 and its halves (no Switchboard-1 needed)
mini_lm_wordnet=""      # WordNet 3.0's dict folder (Debian's wordnet-base: /usr/share/wordnet): its words and glosses
                        # join the mini corpus's LM text in data/lm_text.txt (the mini recipe's --lm-text)
help_message="Usage: local/data.sh [options]"
. utils/parse_options.sh
. utils/log.sh

if [ "$test_only" = true ] && [ -n "$eval2000_speech" ]; then
  [ -n "$eval2000_transcripts" ] || die "--test-only true --eval2000-speech needs --eval2000-transcripts (LDC2002T43)"
elif [ -z "$swbd_root" ]; then
  root=data/mini_swbd
  mini=true
  swbd_root=$root/LDC97S62
  eval2000_speech=$root/LDC2002S09/hub5e_00
  eval2000_transcripts=$root/LDC2002T43
  [ -n "$dev_utts" ] || dev_utts=150
  log "no --swbd-root given: using the MINI Switchboard $root, synthesized with Debian's flite voices${mini_more_train_voices:+ and $mini_more_train_voices}"
  utils/install_system_deps.sh flite
  [[ "$mini_more_train_voices" != *espeak* ]] || utils/install_system_deps.sh espeak-ng
  python local/make_mini_swbd.py --out "$root" --train-convs "$mini_train_convs" --segs-per-side "$mini_segs_per_side" \
    --eval-convs "$mini_eval_convs" --eval-segs-per-side "$mini_eval_segs_per_side" --jobs "$nj" \
    --more-train-convs "$mini_more_train_convs" --more-train-voices "$mini_more_train_voices" \
    --more-train-speakers "$mini_more_train_speakers" --dev-segments "$dev_utts"
else
  [ -n "$eval2000_speech" ] && [ -n "$eval2000_transcripts" ] \
    || die "--swbd-root needs --eval2000-speech (LDC2002S09) and --eval2000-transcripts (LDC2002T43)"
  [ -n "$dev_utts" ] || dev_utts=4000
fi
if [ "$test_only" = true ]; then
  log "--test-only true: eval2000 alone -> data/eval2000{,_swbd,_callhome}"
  python local/eval2000_data_prep.py --speech "$eval2000_speech" --transcripts "$eval2000_transcripts" \
    --out data/eval2000 --wav-style "$wav_style"
  exit 0
fi
log "$swbd_root -> data/train -> data/$train_set + data/$dev_set; eval2000 -> data/eval2000{,_swbd,_callhome}"
python local/swbd1_data_prep.py --swbd-root "$swbd_root" ${swbd_transcripts:+--transcripts "$swbd_transcripts"} \
  --out data/train --wav-style "$wav_style"
python local/split_train_dev.py --src data/train --dev "data/$dev_set" --train "data/$train_set" \
  --dev-utts "$dev_utts" --max-dup "$max_dup"
python local/eval2000_data_prep.py --speech "$eval2000_speech" --transcripts "$eval2000_transcripts" \
  --out data/eval2000 --wav-style "$wav_style"
if [ "${mini:-}" = true ]; then   # the LM text: the mini corpus's Wikipedia sentences (+ WordNet's), without
  # eval2000's sentences nor those of the dev set the LM weights are tuned on (as Kaldi's swbd1_train_lms.sh holds out
  # the head of the training text, where train_dev comes from)
  [ "$mini_lm_wordnet" != /usr/share/wordnet ] || utils/install_system_deps.sh /usr/share/wordnet/data.noun
  python "$(dirname "$(readlink -f "$0")")/../../../librispeech/asr1/local/make_lm_text.py" --base "$root/lm_text.txt" \
    --out data/lm_text.txt --held-out data/eval2000/text "data/$dev_set/text" \
    ${mini_lm_wordnet:+--wordnet "$mini_lm_wordnet" --lower-case}
fi
