#!/usr/bin/env bash
# LibriSpeech CTC acoustic models trained with model averaging / (gossip-)BMUF, end to end:
# the experiment of 001_3db6b3ddf1f13045.txt (DNN and CLDNN; BSP/MA vs BMUF) on our toolkit.
# This file holds the corpus's defaults; the stages are utils/run_asr.sh's, the data preparation
# local/data.sh's. Every option of either is an option here (./run.sh --help lists them).
#
#   ./run.sh              # the full mini recipe (9.9 h synthesized offline, TDNN 512): one worker, DDP and gossip-BMUF on 4
#   ./run.sh --mini quick # the quick start's (1.6 h, TDNN 256); ./run.sh --tasks asr at the top: DDP and gossip-BMUF
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
mini=full               # the mini corpus and model, full | quick (below; options given after them win)
keep_unknown_options=true   # every other option goes on to utils/run_asr.sh, which checks it
. utils/parse_options.sh
[[ " $* " != *" --help "* ]] || printf 'Options of this run.sh:\n  --mini <mini> # default: %s (full | quick)\n' "$mini"
# The mini corpus: phone units of flite's own G2P, decoded to words by beam_word alone (the word 3-gram of its LM
# text + WordNet's, the lexicon widened by wamerican-huge; README.md "Phone units and a lexicon"). quick: 20 flite
# speakers read 1200 sentences once (1.6 h), the 256-wide TDNN. full: 40 flite speakers read 2000 sentences twice,
# 40 espeak-ng speakers (of 42 voices never in dev or test) twice more (9.9 h), speed-perturbed 3-way (24000 utterances);
# the 512-wide TDNN, per-speaker mean and variance, DDP's steps (RESULTS.md "A fourth reading", "Per-speaker CMVN").
mini_quick=(--conf conf/train_tdnn.yaml --unit-type phone --g2p flite --decode-methods beam_word
  --lm-text data/mini_librispeech/librispeech-lm-norm.txt --word-list /usr/share/dict/american-english-huge
  --mini-lm-wordnet /usr/share/wordnet)
mini_full=("${mini_quick[@]}" --conf conf/train_tdnn512.yaml --algorithms "single ddp gossip_bmuf"
  --mini-train-utts 2000 --mini-train-readings 4 --mini-speakers-per-voice 10 --speed-perturb "0.9 1.0 1.1"
  --mini-train-only-voices "espeak-*-m1 espeak-*-m3 espeak-*-f2 espeak-*-m4 espeak-*-f1 espeak-*-m6" --mini-train-only-speakers 40)
case $mini in quick|full) ;; *) echo "run.sh: --mini $mini: use full or quick" >&2; exit 1 ;; esac
corpus=(--unit-type char --decode-methods "greedy beam_word")   # the real LibriSpeech's
[ -n "$librispeech_root" ] || [ "$mini" != quick ] || corpus=("${mini_quick[@]}")
[ -n "$librispeech_root" ] || [ "$mini" != full ] || corpus=("${mini_full[@]}")
exec utils/run_asr.sh --train-set train_clean_100 --dev-set dev_clean --test-sets "test_clean test_other" \
  --num-mel-bins 80 --conf conf/train_dnn.yaml --port 29541 --beam 16 --lm-weight 1.0 --insertion-bonus 2.0 \
  --tune-sets test_other:dev_other --librispeech-root "$librispeech_root" ${corpus[@]+"${corpus[@]}"} "$@"
