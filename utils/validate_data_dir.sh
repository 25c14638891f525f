#!/usr/bin/env bash
# Check a Kaldi data directory (in the spirit of Kaldi's utils/validate_data_dir.sh).
#
#   utils/validate_data_dir.sh data/train_clean_100
#   utils/validate_data_dir.sh --need "wav.scp text utt2spk spk2utt feats.scp" data/x
#   utils/validate_data_dir.sh --check-audio false data/x      # skip the wav.scp path checks
#
# Prints every problem with its file and line, exits 1 if there is any. Checks: required files;
# UTF-8; sorted (LC_ALL=C), unique keys; the same utterances in every utterance file; spk2utt =
# utt2spk inverted; speaker ids prefix utterance ids (sort orders agree); no empty transcripts;
# wav.scp paths exist (a value ending in '|' is a pipe and is not run). The wav.scp value is the
# rest of the line, so paths may contain spaces.
# Implementation: python -m gossip_accel.bin.validate_data_dir (gossip_accel/data/kaldi/validate.py).
set -euo pipefail
need="wav.scp text utt2spk spk2utt"
check_audio=true
help_message="Usage: utils/validate_data_dir.sh [options] <data-dir>"
. "$(dirname "${BASH_SOURCE[0]}")/parse_options.sh"
[ $# -eq 1 ] || { echo "$help_message" >&2; exit 1; }
# called outside a recipe (path.sh not sourced): the project's environment (utils/project_env.sh)
python -c 'import gossip_accel' >/dev/null 2>&1 \
  || . "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/project_env.sh" "python cannot import gossip_accel"
extra=()
[ "$check_audio" = true ] || extra+=(--no-check-audio)
exec python -m gossip_accel.bin.validate_data_dir --need "$need" "${extra[@]}" "$1"
