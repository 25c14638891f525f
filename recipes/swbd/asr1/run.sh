#!/usr/bin/env bash
# Switchboard (300 h, LDC97S62) CTC acoustic models trained with MA / BMUF / gossip-BMUF, tested
# on Hub5'00 (eval2000) with its Switchboard and CallHome halves scored apart: the task of the
# ADPSGD papers (shared/papers/002, 004: LSTM acoustic models on Switchboard-2000) on our toolkit.
# This file holds the corpus's defaults; the stages are utils/run_asr.sh's, the data preparation
# local/data.sh's. Every option of either is an option here (./run.sh --help lists them).
#
#   ./run.sh                                              # mini corpus (synthesized offline, 4.1 h), TDNN, 4 CPU workers
#   ./run.sh --swbd-root /data/LDC97S62 --eval2000-speech /data/LDC2002S09/hub5e_00 \
#            --eval2000-transcripts /data/LDC2002T43 --conf conf/train_cldnn.yaml --ngpu 8
#   ./run.sh --stage 4 --algorithms "single ma bmuf gossip_bmuf"     # the comparison
#   ./run.sh --stage 4 --stop-stage 4 --ngpu 8 --num-nodes 2 --node-rank 1 --master-addr node0  # on node 1
#
# Stages: 0 local/data.sh (mini corpus unless --swbd-root; train_nodup, train_dev, eval2000_{swbd,callhome})
#         1 validation   2 8 kHz fbank + CMVN   3 BPE units   4 train   5 unit LM
#         6 decode + filtered scoring (local/score.sh)   7 exp/RESULTS.md
set -euo pipefail
cd "$(dirname "$0")"
swbd_root=""            # LDC97S62; empty: the mini corpus (local/data.sh)
wav_style=path          # path | sph2pipe | sox (local/data.sh): pipes in wav.scp need --allow-pipes true
keep_unknown_options=true   # every other option goes on to utils/run_asr.sh, which checks it
. utils/parse_options.sh
# Decoding: greedy, and the word 3-gram with its lexicon in the BPE units (beam_word; README.md: on the mini
# corpus it lowers both halves' WER against the unit LM's beam_lm, e.g. DDP's SWB 81.74% -> 76.22%).
# The mini corpus: phones pronounced by flite's G2P (its voices' own), beam_word alone, its own LM text (made by
# local/data.sh): SWB DDP 76.22% -> 50.32%, gossip-BMUF 87.47% -> 66.88% against BPE 100 (README.md "Results").
corpus=(--vocab-size 500)   # BPE units
[ -n "$swbd_root" ] || corpus=(--unit-type phone --g2p flite --decode-methods beam_word --vocab-size 100   # (BPE: 100)
  --lm-text data/lm_text.txt --mini-lm-wordnet /usr/share/wordnet   # its LM text + WordNet's (local/data.sh)
  --conf conf/train_tdnn.yaml   # the TDNN: README.md "Results", 2026-12-05
  # 90 more conversations between 16 new flite speakers and 40 espeak-ng speakers (4.1 h in all, 1.0 h without):
  # SWB DDP 39.28% -> 27.39%, CallHome 76.60% -> 67.66% (README.md "Results", "More speakers", 2026-12-07)
  --mini-more-train-convs 90 --mini-more-train-speakers "16 40"
  --mini-more-train-voices "kal kal16 rms slt; espeak-*-m1 espeak-*-m3 espeak-*-f2 espeak-*-m4 espeak-*-f1 espeak-*-m6")
exec utils/run_asr.sh --train-set train_nodup --dev-set train_dev --test-sets "eval2000_swbd eval2000_callhome" \
  --sample-rate 8000 --num-mel-bins 40 --unit-type bpe --conf conf/train_dnn.yaml --score-hook local/score.sh \
  --decode-methods "greedy beam_word" \
  --port 29551 --allow-pipes "$([ "$wav_style" = path ] && echo false || echo true)" \
  --swbd-root "$swbd_root" --wav-style "$wav_style" "${corpus[@]}" "$@"
