#!/usr/bin/env bash
# Data preparation of this recipe: the one script a new corpus must write (see docs/RECIPES.md).
# Contract: utils/run_lm.sh calls it as `local/data.sh --stage S --stop-stage E --data <dir>`
# (plus any of its own options given to ./run.sh) for stages 0-1:
#   stage 0: get the corpus (download, unpack, convert: whatever the corpus needs);
#   stage 1: write the LM data dir <dir>: wiki.train.tokens, wiki.valid.tokens and (optionally)
#   wiki.test.tokens in the wikitext format (UTF-8, one paragraph or sentence per line, tokens
#   separated by single spaces, tokenized and normalized as the corpus wants;
#   gossip_accel.data.tokenize has the wikitext tokenizer), and vocab.txt (here by
#   gossip_accel.bin.prepare_lm: words seen --min-count times, the rest are <unk>).
# Reruns should skip work that is done.
#
# THIS EXAMPLE copies the embedded Wikipedia sample (local/data/wiki_mini, CC BY-SA) with rare
# words mapped to <unk> as in WikiText-103 (the wikitext-103 recipe's make_mini.py); replace it.
set -euo pipefail
stage=0
stop_stage=1
data=data/lm
src=data/src            # the corpus in the wikitext format (stage 0 writes it)
corpus_root=""          # your corpus; empty: the example
min_count=1             # vocabulary: words seen fewer times are <unk>
help_message="Usage: local/data.sh [options]"
. utils/parse_options.sh
. utils/log.sh
[ -n "${GOSSIP_ROOT:-}" ] || die "source path.sh first"
if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  log "Stage 0: the corpus -> $src"
  if [ -z "$corpus_root" ]; then
    python "$GOSSIP_ROOT/recipes/wikitext103/lm1/local/make_mini.py" --src "$GOSSIP_ROOT/local/data/wiki_mini" --out "$src"
  else
    mkdir -p "$src"
    for s in train valid test; do cp "$corpus_root/wiki.$s.tokens" "$src/"; done   # replace with your conversion
  fi
fi
if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  log "Stage 1: vocabulary of $src -> $data"
  python -m gossip_accel.bin.prepare_lm --src "$src" --out "$data" --min-count "$min_count"
fi
