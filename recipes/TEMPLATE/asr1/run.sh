#!/usr/bin/env bash
# ASR recipe TEMPLATE: CTC acoustic models trained with MA / BMUF / gossip-BMUF on any corpus.
# A new corpus (utils/new_recipe.sh recipes/mycorpus/asr1) links to this run.sh and brings only
#   local/data.sh   its data preparation: Kaldi data dirs data/<train-set>, <dev-set>, <test-sets>
#   conf/*.yaml     its model confs (conf/train_dnn.yaml by default)
#   conf/run.conf   its defaults: shell assignments of the options (./run.sh --help lists them)
# The stages are the shared ones of utils/run_asr.sh; every option of local/data.sh is an option
# here too. A corpus with options of its own in run.sh writes its own (recipes/librispeech/asr1).
#
#   ./run.sh                                          # every stage; 4 CPU workers
#   ./run.sh --stage 4 --algorithms "single ma bmuf gossip_bmuf" -- train.lr=2e-3
#   ./run.sh --stage 4 --stop-stage 4 --ngpu 8 --num-nodes 2 --node-rank 1 --master-addr node0   # on node 1
#
# Stages: 0 local/data.sh (corpus -> Kaldi data dirs)   1 validate (and fix) the data dirs
#         2 fbank + CMVN   3 units   4 train   5 unit LM   6 decode   7 RESULTS.md (utils/run_asr.sh)
set -euo pipefail
cd "$(dirname "$0")"    # the recipe dir (this file may be a link into recipes/TEMPLATE)
defaults=()
[ ! -f conf/run.conf ] || defaults=(--config conf/run.conf)
exec utils/run_asr.sh ${defaults[@]+"${defaults[@]}"} "$@"
