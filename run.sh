#!/usr/bin/env bash
# Quick start of gossip_accel: the LM and the ASR recipes, every stage, on their embedded mini
# data, on CPU with 4 workers. Sets up the pinned .venv the first time.
#
#   ./run.sh                                            # LM, then ASR: all stages
#   ./run.sh --tasks asr                                # the ASR part only
#   ./run.sh --algorithms "single bmuf gossip_bmuf"     # other methods for the LM
#   ./run.sh --stage 2 -- sync.q=2                      # LM from training on, with trainer overrides
#   ./run.sh --stage 2 --algorithms gossip_bmuf --tag eta075 -- sync.block_momentum=0.75   # a variant, compared with the rest
#   ./run.sh --tasks asr --asr-opts "--stage 4" --asr-overrides "train.max_epochs=20"
#
# LM (recipes/wikitext103/lm1, the gossip-BMUF paper's setup scaled down):
#   0 mini wikitext-103 corpus (real Wikipedia articles)  1 validation + vocabulary
#   2 train: plain DDP and gossip-BMUF (12,96), pairwise mixing, 4 workers under `accelerate launch`
#   3 test perplexity of the averaged models               4 comparison table + plot
# ASR (recipes/librispeech/asr1, the BMUF paper's LibriSpeech experiment scaled down):
#   0 mini LibriSpeech (Wikipedia sentences spoken by flite voices)  1 Kaldi data dirs
#   2 fbank + CMVN   3 phone units (flite's G2P)   4 CTC training of the TDNN: DDP and gossip-BMUF, 4 workers
#   5 word 3-gram (KenLM) + lexicon (+ wamerican-huge)   6 word-LM decoding of the average of the 5 best epoch models
#   7 RESULTS.md: one row per method at a glance (%WER, %CER, MB/step, vs DDP), then every decode
set -euo pipefail
cd "$(dirname "$0")"

tasks="lm asr"         # lm, asr or both
num_workers=4
launcher=accelerate
port=29511             # the ASR part uses port+30
tag=""                 # appended to the run names (<run>-<tag>): a variant beside the untagged runs
# LM part
stage=0
stop_stage=100
algorithms="ddp gossip_bmuf"
epochs=3               # gossip-BMUF below DDP in test ppl at 1/64 of its bytes, 3 seeds (docs/RESULTS.md)
periods=12_96          # the gossip periods (conf/period_<periods>.yaml of the LM recipe): (12,96) sends
                       # about what global BMUF sends at the paper's (16,128)
data=data/lm           # relative to the LM recipe directory
exp=exp/quickstart     # relative to the recipe directories
# ASR part
asr_dir=recipes/librispeech/asr1   # a recipe dir (or a copy made of links to it)
asr_algorithms="ddp gossip_bmuf"
asr_opts=""            # more options of the ASR recipe's run.sh, split on spaces: "--stage 4 --nj 4"
asr_overrides=""       # ASR trainer overrides, split on spaces: "train.max_epochs=20 sync.period=8"
help_message="Usage: ./run.sh [options] [-- LM trainer overrides such as sync.period=8]"

. utils/log.sh
. utils/parse_options.sh
[ "${1:-}" = "--" ] && shift
. ./path.sh

for t in $tasks; do
  case $t in lm|asr) ;; *) die "--tasks: unknown task '$t' (use lm, asr or \"lm asr\")" ;; esac
done

if [[ " $tasks " == *" lm "* ]]; then
  lm=recipes/wikitext103/lm1
  log "LM quick start: $lm/run.sh (stages $stage..$stop_stage; results in $lm/$exp/compare/RESULTS.md)"
  $lm/run.sh --stage "$stage" --stop-stage "$stop_stage" --num-workers "$num_workers" \
    --algorithms "$algorithms" --epochs "$epochs" --periods "$periods" --launcher "$launcher" --port "$port" \
    --data "$data" --exp "$exp" --tag "$tag" -- "$@"
  [ -f "$lm/$exp/compare/RESULTS.md" ] && cat "$lm/$exp/compare/RESULTS.md"
fi

if [[ " $tasks " == *" asr "* ]]; then
  [ -x "$asr_dir/run.sh" ] || die "--asr-dir $asr_dir has no run.sh"
  read -r -a opts <<< "$asr_opts"
  read -r -a overrides <<< "$asr_overrides"
  log "ASR quick start: $asr_dir/run.sh (results in $asr_dir/$exp/RESULTS.md)"
  # the recipe's quick mini corpus and model (--mini quick: 1.6 h, the 256-wide TDNN, phone units, the dictionary-
  # widened lexicon, the LM text widened by WordNet; the recipe's default is the full one, 1-2 h); the word LM's
  # weight and word score fixed at 3 and +1 (the pair dev-clean chose for the quick-start TDNNs), so no dev decodes
  "$asr_dir/run.sh" --mini quick --num-workers "$num_workers" --algorithms "$asr_algorithms" --launcher "$launcher" \
    --port $((port + 30)) --exp "$exp" --tag "$tag" --word-lm-weights 3 --word-scores 1 ${opts[@]+"${opts[@]}"} \
    -- ${overrides[@]+"${overrides[@]}"}
  [ -f "$asr_dir/$exp/RESULTS.md" ] && cat "$asr_dir/$exp/RESULTS.md"
fi
log "Done."
