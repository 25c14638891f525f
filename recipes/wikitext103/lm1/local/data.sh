#!/usr/bin/env bash
# WikiText-103 -> the LM data dir (the contract of docs/RECIPES.md; utils/run_lm.sh runs this as
# stages 0-1): 0 the corpus: a real wikitext-103 dir (--wikitext-root: wiki.{train,valid,test}.tokens)
# or, without it, the MINI corpus built from local/data/wiki_mini (~100 real Wikipedia articles,
# CC BY-SA) in the wikitext-103 format; 1 validation and vocabulary (local/prepare_wikitext.py) -> --data.
set -euo pipefail
stage=0
stop_stage=1
data=data/lm
wikitext_root=""        # a real wikitext-103 dir (wiki.{train,valid,test}.tokens); empty: the mini corpus
help_message="Usage: local/data.sh [options]"
. utils/parse_options.sh
. utils/log.sh

src=$wikitext_root
if [ -z "$src" ]; then
  src=data/mini_src
  if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
    log "Stage 0: no --wikitext-root given: using the MINI corpus ($src), built from local/data/wiki_mini"
    log "         (~100 real Wikipedia articles, CC BY-SA) in the wikitext-103 format"
    python local/make_mini.py --src "$GOSSIP_ROOT/local/data/wiki_mini" --out "$src"
  fi
fi
if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  log "Stage 1: validate $src and build the vocabulary -> $data"
  python local/prepare_wikitext.py --src "$src" --out "$data"
fi
