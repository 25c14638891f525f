#!/usr/bin/env bash
# Switchboard (300 h, LDC97S62) CTC acoustic models trained with MA / BMUF / gossip-BMUF, tested
# on Hub5'00 (eval2000) with its Switchboard and CallHome halves scored apart: the task of the
# ADPSGD papers (shared/papers/002, 004: LSTM acoustic models on Switchboard-2000) on our toolkit.
#
#   ./run.sh                                              # mini corpus (synthesized offline), DNN, 4 CPU workers
#   ./run.sh --swbd-root /data/LDC97S62 --eval2000-speech /data/LDC2002S09/hub5e_00 \
#            --eval2000-transcripts /data/LDC2002T43 --conf conf/train_cldnn.yaml --ngpu 8
#   ./run.sh --stage 4 --algorithms "single ma bmuf gossip_bmuf"     # the comparison
#   ./run.sh --stage 4 --stop-stage 4 --ngpu 8 --num-nodes 2 --node-rank 1 --master-addr node0  # on node 1
#
# Stages: 0 mini corpus (unless --swbd-root)   1 Kaldi data dirs (train_nodup, train_dev, eval2000_{swbd,callhome})
#         2 8 kHz fbank + CMVN   3 BPE units   4 train   5 unit LM   6 decode + filtered scoring
#         7 RESULTS.md (stages 2-7: utils/run_asr.sh)
set -euo pipefail
cd "$(dirname "$0")"

stage=0
stop_stage=100
swbd_root=""            # LDC97S62 (the .sph files); empty: the mini corpus
swbd_transcripts=""     # swb_ms98_transcriptions (default: found under or beside --swbd-root)
eval2000_speech=""      # LDC2002S09 (or its hub5e_00 folder)
eval2000_transcripts="" # LDC2002T43
wav_style=path          # path: wav.scp holds the .sph (read directly, shortened or not) | sph2pipe | sox
dev_utts=""             # train_dev size (Kaldi: first 4000 utterances; mini: 150)
max_dup=300             # copies of one transcript kept in train_nodup
mini_train_convs=30     # size of the mini corpus: conversations (2 sides each) ...
mini_segs_per_side=15   # ... segments per side (30 x 2 x 15 = 900 training segments, ~0.75 h of speech)
mini_eval_convs=2       # eval2000 conversations of each half (SWB, CallHome) ...
mini_eval_segs_per_side=12   # ... and their segments per side
nj=2
sample_rate=8000
num_mel_bins=40
unit_type=bpe           # bpe | char
vocab_size=""           # BPE size (default 500 for the real corpus, 100 for the mini one)
conf=conf/train_dnn.yaml
algorithms=gossip_bmuf  # single ddp ma bmuf local_ma local_bmuf gossip_ma gossip_bmuf
num_workers=4           # per node
ngpu=""                 # same as --num-workers (one worker per GPU)
num_nodes=1             # machines; run this on each with its --node-rank (utils/slurm.sh does it under Slurm)
node_rank=0
master_addr=127.0.0.1   # node 0's address
launcher=accelerate
port=29551
max_restarts=0          # a worker that dies or hangs: the launcher restarts the job up to N times
use_lm=true
lm_conf=conf/lm_units.yaml
decode_methods="greedy beam_lm"   # any of: greedy beam beam_lm
lm_text=""              # LM text, one sentence per line (e.g. Fisher transcripts); default: the mini
                        # corpus's lm_text.txt, or the training transcripts
exp=exp
help_message="Usage: ./run.sh [options] [-- trainer overrides, e.g. train.lr=2e-3 sync.period=8]"

. utils/log.sh
. utils/parse_options.sh
[ "${1:-}" = "--" ] && shift
. ./path.sh
[ -n "$ngpu" ] && num_workers=$ngpu

if [ -z "$swbd_root" ]; then
  root=data/mini_swbd
  swbd_root=$root/LDC97S62
  eval2000_speech=$root/LDC2002S09/hub5e_00
  eval2000_transcripts=$root/LDC2002T43
  [ -n "$dev_utts" ] || dev_utts=150
  [ -n "$vocab_size" ] || vocab_size=100
  if [ $stage -le 0 ] && [ $stop_stage -ge 0 ] && [ "$node_rank" = 0 ]; then
    log "Stage 0: no --swbd-root given: using the MINI Switchboard $root, synthesized with Debian's flite voices"
    if ! command -v flite >/dev/null; then
      [ "$(id -u)" = 0 ] || die "flite is missing: install it with 'apt-get install flite' (Debian/Ubuntu)"
      log "  installing flite (apt-get install flite)"
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq flite; } >&2 \
        || die "could not install flite; install it with 'apt-get install flite'"
    fi
    python local/make_mini_swbd.py --out "$root" --train-convs "$mini_train_convs" --segs-per-side "$mini_segs_per_side" \
      --eval-convs "$mini_eval_convs" --eval-segs-per-side "$mini_eval_segs_per_side" --jobs "$nj"
  fi
  if [ -z "$lm_text" ] && [ -f "$root/lm_text.txt" ]; then lm_text=$root/lm_text.txt; fi
else
  [ -n "$eval2000_speech" ] && [ -n "$eval2000_transcripts" ] \
    || die "--swbd-root needs --eval2000-speech (LDC2002S09) and --eval2000-transcripts (LDC2002T43)"
  [ -n "$dev_utts" ] || dev_utts=4000
  [ -n "$vocab_size" ] || vocab_size=500
fi

if [ $stage -le 1 ] && [ $stop_stage -ge 1 ] && [ "$node_rank" = 0 ]; then
  log "Stage 1: $swbd_root -> data/train; eval2000 -> data/eval2000{,_swbd,_callhome}"
  python local/swbd1_data_prep.py --swbd-root "$swbd_root" ${swbd_transcripts:+--transcripts "$swbd_transcripts"} \
    --out data/train --wav-style $wav_style
  python local/split_train_dev.py --src data/train --dev data/train_dev --train data/train_nodup \
    --dev-utts $dev_utts --max-dup $max_dup
  python local/eval2000_data_prep.py --speech "$eval2000_speech" --transcripts "$eval2000_transcripts" \
    --out data/eval2000 --wav-style $wav_style
  for d in train_nodup train_dev eval2000_swbd eval2000_callhome; do
    utils/validate_data_dir.sh data/$d || { log "  data/$d has problems (listed above): fixing"; utils/fix_data_dir.sh data/$d; }
  done
fi

if [ $stop_stage -ge 2 ]; then
  utils/run_asr.sh --stage $(( stage > 2 ? stage : 2 )) --stop-stage $stop_stage \
    --train-set train_nodup --dev-set train_dev --test-sets "eval2000_swbd eval2000_callhome" \
    --allow-pipes "$([ "$wav_style" = path ] && echo false || echo true)" \
    --nj $nj --sample-rate $sample_rate --num-mel-bins $num_mel_bins --unit-type $unit_type --vocab-size $vocab_size \
    --conf "$conf" --algorithms "$algorithms" --num-workers $num_workers --num-nodes $num_nodes \
    --node-rank $node_rank --master-addr "$master_addr" --launcher "$launcher" --port "$port" --max-restarts "$max_restarts" \
    --use-lm $use_lm --lm-conf "$lm_conf" --lm-text "$lm_text" --decode-methods "$decode_methods" \
    --score-hook local/score.sh --exp "$exp" -- "$@"
fi
log "Done."
