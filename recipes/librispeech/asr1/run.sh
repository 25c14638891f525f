#!/usr/bin/env bash
# LibriSpeech CTC acoustic models trained with model averaging / (gossip-)BMUF, end to end:
# the experiment of 001_3db6b3ddf1f13045.txt (DNN and CLDNN; BSP/MA vs BMUF) on our toolkit.
#
#   ./run.sh                                              # mini corpus (synthesized offline), DNN, 4 CPU workers
#   ./run.sh --librispeech-root /data/LibriSpeech --conf conf/paper/train_dnn.yaml --num-mel-bins 40 --ngpu 8
#   ./run.sh --stage 4 --algorithms "single ma bmuf gossip_bmuf"     # the comparison of the paper
#
# Stages: 0 mini corpus (unless --librispeech-root)   1 Kaldi data dirs + validation
#         2 fbank + CMVN   3 units   4 train   5 unit LM   6 decode   7 RESULTS.md (utils/run_asr.sh)
set -euo pipefail
cd "$(dirname "$0")"

stage=0
stop_stage=100
librispeech_root=""     # a real LibriSpeech (its subset folders); empty: the mini corpus
train_set=train-clean-100
dev_set=dev-clean
test_sets="test-clean test-other"
mini_train_utts=1200    # size of the mini corpus (~1.6 h of training audio)
mini_eval_utts=120
nj=2
num_mel_bins=80
unit_type=char          # char | bpe
vocab_size=""           # BPE size (ignored for char)
conf=conf/train_dnn.yaml
algorithms=gossip_bmuf  # single ddp ma bmuf local_ma local_bmuf gossip_ma gossip_bmuf
num_workers=4
ngpu=""                 # same as --num-workers
num_nodes=1             # machines; run this on each with its --node-rank (utils/slurm.sh does it under Slurm)
node_rank=0
master_addr=127.0.0.1   # node 0's address
launcher=accelerate
port=29541
max_restarts=0          # a worker that dies or hangs: the launcher restarts the job up to N times
use_lm=true
lm_conf=conf/lm_units.yaml
decode_methods="greedy beam_lm"   # any of: greedy beam beam_lm
lm_text=""              # LM corpus, one sentence per line (LibriSpeech's librispeech-lm-norm.txt.gz from
                        # openslr.org/11); default: the mini corpus's own, or the training transcripts
exp=exp
help_message="Usage: ./run.sh [options] [-- trainer overrides, e.g. train.lr=2e-3 sync.period=8]"

. utils/log.sh
. utils/parse_options.sh
[ "${1:-}" = "--" ] && shift
. ./path.sh
[ -n "$ngpu" ] && num_workers=$ngpu

root=$librispeech_root
if [ -z "$root" ]; then
  root=data/mini_librispeech
  if [ $stage -le 0 ] && [ $stop_stage -ge 0 ] && [ "$node_rank" = 0 ]; then
    log "Stage 0: no --librispeech-root given: using the MINI corpus $root, synthesized with Debian's flite voices"
    if ! command -v flite >/dev/null; then
      [ "$(id -u)" = 0 ] || die "flite is missing: install it with 'apt-get install flite' (Debian/Ubuntu)"
      log "  installing flite (apt-get install flite)"
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq flite; } >&2 \
        || die "could not install flite; install it with 'apt-get install flite'"
    fi
    # the builder's own stamp makes a rerun with the same sizes a no-op, and a changed size a rebuild
    python local/make_mini_librispeech.py --out "$root" --train-utts "$mini_train_utts" \
      --eval-utts "$mini_eval_utts" --jobs "$nj"
    # its LM corpus (librispeech-lm-norm.txt's counterpart): the rest of the Wikipedia text, dev/test held out
    python local/make_lm_text.py --corpus "$root" --out "$root/librispeech-lm-norm.txt"
  fi
  if [ -z "$lm_text" ] && [ -f "$root/librispeech-lm-norm.txt" ]; then lm_text=$root/librispeech-lm-norm.txt; fi
fi

if [ $stage -le 1 ] && [ $stop_stage -ge 1 ] && [ "$node_rank" = 0 ]; then
  for s in $train_set $dev_set $test_sets; do
    d=data/${s//-/_}
    [ -d "$root/$s" ] || die "$root/$s not found: --librispeech-root must hold the subset folders ($train_set, $dev_set, $test_sets)"
    log "Stage 1: $root/$s -> $d"
    python local/data_prep.py --src "$root/$s" --out $d
    utils/validate_data_dir.sh $d || { log "  $d has problems (listed above): fixing"; utils/fix_data_dir.sh $d; }
  done
fi

if [ $stop_stage -ge 2 ]; then
  [ -n "$vocab_size" ] || vocab_size=300
  utils/run_asr.sh --stage $(( stage > 2 ? stage : 2 )) --stop-stage $stop_stage \
    --train-set "${train_set//-/_}" --dev-set "${dev_set//-/_}" --test-sets "$(echo ${test_sets//-/_})" \
    --nj $nj --num-mel-bins $num_mel_bins --unit-type $unit_type --vocab-size $vocab_size --conf "$conf" \
    --algorithms "$algorithms" --num-workers $num_workers --num-nodes $num_nodes --node-rank $node_rank \
    --master-addr "$master_addr" --launcher "$launcher" --port "$port" --max-restarts "$max_restarts" \
    --use-lm $use_lm --lm-conf "$lm_conf" --lm-text "$lm_text" \
    --decode-methods "$decode_methods" --exp "$exp" -- "$@"
fi
log "Done."
