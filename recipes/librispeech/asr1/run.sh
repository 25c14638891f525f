#!/usr/bin/env bash
# LibriSpeech CTC acoustic models trained with model averaging / (gossip-)BMUF, end to end:
# the experiment of 001_3db6b3ddf1f13045.txt (DNN and CLDNN; BSP/MA vs BMUF) on our toolkit.
# This file holds the corpus's defaults; the stages are utils/run_asr.sh's, the data preparation
# local/data.sh's. Every option of either is an option here (./run.sh --help lists them).
#
#   ./run.sh                                              # mini corpus (synthesized offline), DNN, 4 CPU workers
#   ./run.sh --librispeech-root /data/LibriSpeech --conf conf/paper/train_dnn.yaml --num-mel-bins 40 --ngpu 8 \
#            --lm-text /data/librispeech-lm-norm.txt.gz   # openslr.org/11
#   ./run.sh --stage 4 --algorithms "single ma bmuf gossip_bmuf"     # the comparison of the paper
#   ./run.sh --stage 4 --algorithms gossip_bmuf --tag p8 -- sync.period=8   # a variant beside it
#
# Stages: 0 local/data.sh (mini corpus unless --librispeech-root; Kaldi data dirs)   1 validation
#         2 fbank + CMVN   3 char units   4 train   5 word LM (+ unit LM for beam_lm)   6 decode   7 exp/RESULTS.md
set -euo pipefail
cd "$(dirname "$0")"
librispeech_root=""     # a real LibriSpeech (its subset folders); empty: the mini corpus (local/data.sh)
keep_unknown_options=true   # every other option goes on to utils/run_asr.sh, which checks it
. utils/parse_options.sh
corpus=()               # the mini corpus's LM text (its librispeech-lm-norm.txt), made by local/data.sh, and
# beam_word's lexicon widened by Debian's wamerican-huge (338k words; installed by stage 5 when missing): the mini
# LM text's 17k words leave 12.2% of test-clean's words out of the lexicon, the list 1.5% (the real LibriSpeech's
# 200k-word vocabulary: under 1%); one TDNN of corpus c + speed perturbation, dev-clean WER 27.87% -> 22.13%,
# test-clean 32.22% -> 29.09%, at about 9x the decoding time (RESULTS.md, "A dictionary in the lexicon").
# --word-list "" decodes with the LM text's words alone (the repository's quick start does, for its time).
[ -n "$librispeech_root" ] || corpus=(--lm-text data/mini_librispeech/librispeech-lm-norm.txt
                                      --word-list /usr/share/dict/american-english-huge)
# Decoding: greedy, and the word 3-gram of the LM text with the lexicon (beam_word; its LM weight and word score
# chosen on dev-clean by stage 6): on the mini corpus 34.45% test-clean WER for the TDNN of corpus c where the
# character LM's beam_lm gives 45.31%, 68.30% / 72.47% for the quick start's DNNs (DDP / gossip-BMUF) against
# 73.96% / 77.23% (RESULTS.md, "Word-level decoding"). beam_lm (--decode-methods "greedy beam_lm beam_word")
# decodes with beam 16, LM weight 1.0, insertion bonus 2.0, tuned on the mini corpus's dev-clean (not on the real
# LibriSpeech; RESULTS.md, "More varied data":
# the TDNN's dev WER 46.0% at stage 6's generic 8 / 0.5 / 1.0, 39.7% here; test-clean 62.2% -> 58.1% for the
# default corpus's TDNN). Options given to this script override them.
exec utils/run_asr.sh --train-set train_clean_100 --dev-set dev_clean --test-sets "test_clean test_other" \
  --unit-type char --num-mel-bins 80 --conf conf/train_dnn.yaml --port 29541 \
  --decode-methods "greedy beam_word" --beam 16 --lm-weight 1.0 --insertion-bonus 2.0 \
  --librispeech-root "$librispeech_root" ${corpus[@]+"${corpus[@]}"} "$@"
