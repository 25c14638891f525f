#!/usr/bin/env bash
# LibriSpeech CTC acoustic models trained with model averaging / (gossip-)BMUF, end to end:
# the experiment of 001_3db6b3ddf1f13045.txt (DNN and CLDNN; BSP/MA vs BMUF) on our toolkit.
# This file holds the corpus's defaults; the stages are utils/run_asr.sh's, the data preparation
# local/data.sh's. Every option of either is an option here (./run.sh --help lists them).
#
#   ./run.sh                                              # mini corpus (synthesized offline), TDNN, 4 CPU workers
#   ./run.sh --librispeech-root /data/LibriSpeech --conf conf/paper/train_dnn.yaml --num-mel-bins 40 --ngpu 8 \
#            --lm-text /data/librispeech-lm-norm.txt.gz   # openslr.org/11
#   ./run.sh --stage 4 --algorithms "single ma bmuf gossip_bmuf"     # the comparison of the paper
#   ./run.sh --stage 4 --algorithms gossip_bmuf --tag p8 -- sync.period=8   # a variant beside it
#
# Stages: 0 local/data.sh (mini corpus unless --librispeech-root; Kaldi data dirs)   1 validation
#         2 fbank + CMVN   3 units   4 train   5 word LM (+ unit LM for beam_lm)   6 decode   7 exp/RESULTS.md
set -euo pipefail
cd "$(dirname "$0")"
librispeech_root=""     # a real LibriSpeech (its subset folders); empty: the mini corpus (local/data.sh)
keep_unknown_options=true   # every other option goes on to utils/run_asr.sh, which checks it
. utils/parse_options.sh
# The mini corpus: phone units pronounced by flite's own G2P (t2p: how its voices say each word), so the model
# need not learn English spelling from 2000 sentences, decoded to words by beam_word alone: the word 3-gram of its
# LM text (the counterpart of librispeech-lm-norm.txt) with a lexicon widened by Debian's wamerican-huge (338k
# words, installed by stage 5; the LM text's 17k leave 12.2% of test-clean's words out, the list 1.5%), its LM
# weight and word score tuned on dev-clean. test-clean, characters -> phones: quick start DNNs (DDP, 4 workers)
# 69.27% -> 37.65% (LM text's lexicon); one 512-wide TDNN of corpus c 25.82% -> 9.45% (RESULTS.md "Phone units").
# The real LibriSpeech keeps characters and greedy + beam_word (--unit-type phone --lexicon librispeech-lexicon.txt
# for its phones); beam_lm (--decode-methods "greedy beam_lm beam_word", character units) decodes with beam 16,
# LM weight 1.0, insertion bonus 2.0, tuned on the mini dev-clean (RESULTS.md, "More varied data").
# The mini corpus's model is the TDNN (+-0.42 s of context), not the DNN (+-0.11 s): with phones, 4 workers, test-clean
# DDP 37.65% -> 32.14%, gossip-BMUF 43.75% -> 30.13% with the LM text's lexicon (RESULTS.md "Phone units").
corpus=(--unit-type char --decode-methods "greedy beam_word")
[ -n "$librispeech_root" ] || corpus=(--conf conf/train_tdnn.yaml --unit-type phone --g2p flite --decode-methods beam_word
  --lm-text data/mini_librispeech/librispeech-lm-norm.txt --word-list /usr/share/dict/american-english-huge)
exec utils/run_asr.sh --train-set train_clean_100 --dev-set dev_clean --test-sets "test_clean test_other" \
  --num-mel-bins 80 --conf conf/train_dnn.yaml --port 29541 --beam 16 --lm-weight 1.0 --insertion-bonus 2.0 \
  --librispeech-root "$librispeech_root" ${corpus[@]+"${corpus[@]}"} "$@"
