#!/usr/bin/env bash
# Data preparation of this recipe: the one script a new corpus must write (see docs/RECIPES.md).
# Contract: write <out>/wiki.train.tokens, wiki.valid.tokens and (optionally) wiki.test.tokens in
# the wikitext format: UTF-8, one paragraph (or sentence) per line, tokens separated by single
# spaces, already tokenized and normalized as the corpus wants (gossip_accel.data.tokenize has
# the wikitext tokenizer); rare words may stay (stage 1's --min-count maps them to <unk>).
# Reruns should skip work that is done.
#
# THIS EXAMPLE copies the embedded Wikipedia sample (local/data/wiki_mini, CC BY-SA) with rare
# words mapped to <unk> as in WikiText-103 (the wikitext-103 recipe's make_mini.py); replace it.
set -euo pipefail
out=data/src
corpus_root=""          # your corpus; empty: the example
help_message="Usage: local/data.sh [options]"
. utils/parse_options.sh
. utils/log.sh
[ -n "${GOSSIP_ROOT:-}" ] || die "source path.sh first"
if [ -z "$corpus_root" ]; then
  python "$GOSSIP_ROOT/recipes/wikitext103/lm1/local/make_mini.py" --src "$GOSSIP_ROOT/local/data/wiki_mini" --out "$out"
else
  mkdir -p "$out"
  for s in train valid test; do cp "$corpus_root/wiki.$s.tokens" "$out/"; done   # replace with your conversion
fi
