#!/usr/bin/env bash
# Create a new recipe from recipes/TEMPLATE: a working recipe that shares run.sh, path.sh and
# utils/ with the template through links, so that a new corpus needs only its local/data.sh and
# its confs (docs/RECIPES.md walks through it).
#
#   utils/new_recipe.sh recipes/mycorpus/asr1            # ASR (CTC) recipe: --type from the name (asr*, lm*)
#   utils/new_recipe.sh --type lm recipes/mycorpus/lm1   # LM recipe
#   utils/new_recipe.sh --copy-run true recipes/mycorpus/asr1   # own copy of run.sh, to change the stages
#
# Creates in the new dir: run.sh -> the template's run.sh (a link; --copy-run true: a copy),
# path.sh (the template's, identical; a link when the dir is not at recipes/<corpus>/<task>),
# utils -> the project's utils/, conf/ (copies of the template's confs, to edit), local/data.sh
# (the template's example, to replace), README.md (a stub). It works at once: ./run.sh runs the
# example data prep and every shared stage. An existing non-empty dir is never touched.
set -euo pipefail
type=""               # asr | lm (default: from the dir name)
copy_run=false        # true: copy run.sh instead of linking it
help_message="Usage: utils/new_recipe.sh [options] <new-recipe-dir, e.g. recipes/mycorpus/asr1>"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/parse_options.sh"
. "$here/log.sh"
[ $# -eq 1 ] || { echo "$help_message" >&2; exit 1; }
dir=$1
root=$(cd "$here/.." && pwd)
if [ -z "$type" ]; then
  case $(basename "$dir") in
    asr*) type=asr ;;
    lm*) type=lm ;;
    *) die "cannot tell the type from '$(basename "$dir")': pass --type asr or --type lm" ;;
  esac
fi
case $type in asr) tpl=$root/recipes/TEMPLATE/asr1 ;; lm) tpl=$root/recipes/TEMPLATE/lm1 ;; *) die "--type must be asr or lm, got '$type'" ;; esac
[ -d "$tpl" ] || die "$tpl not found"
if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then die "$dir exists and is not empty: choose a new dir"; fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
rel() { realpath --relative-to="$dir" "$1"; }

if [ "$copy_run" = true ]; then cp "$tpl/run.sh" "$dir/run.sh"; else ln -s "$(rel "$tpl/run.sh")" "$dir/run.sh"; fi
if [ "$(realpath -m "$dir/../../../path.sh")" = "$root/path.sh" ]; then
  cp "$tpl/path.sh" "$dir/path.sh"          # at recipes/<corpus>/<task>: the same file as every recipe's
else
  ln -s "$(rel "$tpl/path.sh")" "$dir/path.sh"   # elsewhere: a link, which finds the project (readlink -f)
fi
ln -s "$(rel "$root/utils")" "$dir/utils"
cp -r "$tpl/conf" "$dir/conf"
mkdir -p "$dir/local"
cp "$tpl/local/data.sh" "$dir/local/data.sh"
chmod +x "$dir/local/data.sh"
name=$(basename "$(dirname "$dir")")/$(basename "$dir")
cat > "$dir/README.md" <<EOF
# $name

Made by \`utils/new_recipe.sh\` from \`recipes/TEMPLATE/$(basename "$tpl")\` (docs/RECIPES.md).

1. Replace \`local/data.sh\` (now the template's example) with this corpus's data preparation.
2. Set the option defaults in \`conf/run.conf\` (e.g. \`test_sets="test_a test_b"\`) and adapt \`conf/*.yaml\`.
3. \`./run.sh\`, then report \`exp/RESULTS.md\` here.
EOF
log "created $dir ($type recipe: run.sh -> $(readlink "$dir/run.sh" 2>/dev/null || echo 'own copy'), utils -> $(readlink "$dir/utils"))"
log "next: edit $dir/local/data.sh and $dir/conf/, then run $dir/run.sh (docs/RECIPES.md)"
