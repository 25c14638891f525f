#!/usr/bin/env bash
# Gutenberg LSTMP language model trained with (gossip-)BMUF: section 3 of
# "A Random Gossip BMUF Process for Neural Language Modeling" (shared/papers/000_*).
# This file holds the corpus's defaults; the stages are utils/run_lm.sh's, the data preparation
# local/data.sh's. Every option of either is an option here (./run.sh --help lists them).
#
#   ./run.sh                                         # mini corpus (Jane Austen, local/data/original-books-mini.tar.gz), 4 CPU workers
#   ./run.sh --books /data/original-books.tar.gz --conf conf/lstmp.yaml --ngpu 8
#   ./run.sh --stage 2 --algorithms "single ma bmuf local_bmuf gossip_bmuf gossip_ma"   # the paper's comparison
#   ./run.sh --stage 2 --periods 8 -- train.lr=0.05  # trainer overrides after --
#   ./run.sh --stage 2 --tag eta075 -- sync.block_momentum=0.75   # a variant beside the untagged run
#
# Stages: 0 corpus (the mini one unless --books), 1 95/5 split by book + vocabulary (count >= 7)
#         (local/data.sh), 2 train (one run per --algorithms entry), 3 test perplexity, 4 comparison.
set -euo pipefail
cd "$(dirname "$0")"
exec utils/run_lm.sh --conf conf/mini.yaml --periods 16_128 --port 29531 "$@"   # conf/lstmp.yaml: the paper's model
