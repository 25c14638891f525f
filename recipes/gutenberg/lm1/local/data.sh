#!/usr/bin/env bash
# LibriSpeech's original-books (openslr resource 12, the paper's Gutenberg corpus) -> the LM data
# dir (the contract of docs/RECIPES.md; utils/run_lm.sh runs this as stages 0-1): 0 the corpus:
# --books or, without it, the MINI corpus local/data/original-books-mini.tar.gz (Jane Austen's
# novels, public domain, in the layout of original-books.tar.gz); 1 the 95/5 split by book and the
# vocabulary (words seen --min-count times; local/prepare_gutenberg.py) -> --data.
set -euo pipefail
stage=0
stop_stage=1
data=data/lm
books=""                # the paper's original-books.tar.gz (openslr 12) or its extracted dir; empty: the mini corpus
min_count=7             # vocabulary: training words seen at least this often (the paper: 7)
help_message="Usage: local/data.sh [options]"
. utils/parse_options.sh
. utils/log.sh

src=$books
if [ -z "$src" ]; then
  src=local/data/original-books-mini.tar.gz
  [ "$stage" -gt 0 ] || [ "$stop_stage" -lt 0 ] || log "Stage 0: no --books given: using the MINI corpus $src" \
    "(Jane Austen's novels, public domain, in the layout of original-books.tar.gz)"
fi
if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  log "Stage 1: $src -> $data (95% train / 5% test by book, vocabulary count >= $min_count)"
  python local/prepare_gutenberg.py --src "$src" --out "$data" --min-count "$min_count" --jobs "$(nproc)"
fi
