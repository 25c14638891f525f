#!/usr/bin/env bash
# LM recipe TEMPLATE: LSTMP language models trained with MA / BMUF / gossip-BMUF on any corpus.
# A new corpus (utils/new_recipe.sh --type lm recipes/mycorpus/lm1) links to this run.sh and brings only
#   local/data.sh   its data preparation: stage 0 the corpus, stage 1 the LM data dir <data>
#                   (wiki.{train,valid,test}.tokens in the wikitext format and vocab.txt)
#   conf/*.yaml     its model conf (conf/lstmp.yaml) and sync periods (conf/period_16_128.yaml)
#   conf/run.conf   its defaults: shell assignments of the options (./run.sh --help lists them)
# The stages are the shared ones of utils/run_lm.sh; every option of local/data.sh is an option
# here too. A corpus with options of its own in run.sh writes its own (recipes/wikitext103/lm1).
#
#   ./run.sh                                          # every stage; 4 CPU workers
#   ./run.sh --stage 2 --algorithms "single ma bmuf gossip_bmuf" -- train.lr=0.05
#
# Stages: 0-1 local/data.sh (corpus, vocabulary)   2 train   3 test perplexity
#         4 comparison table + plots (utils/run_lm.sh)
set -euo pipefail
cd "$(dirname "$0")"    # the recipe dir (this file may be a link into recipes/TEMPLATE)
defaults=()
[ ! -f conf/run.conf ] || defaults=(--config conf/run.conf)
exec utils/run_lm.sh ${defaults[@]+"${defaults[@]}"} "$@"
