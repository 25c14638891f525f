#!/usr/bin/env bash
# Make a Kaldi data directory consistent (in the spirit of Kaldi's utils/fix_data_dir.sh).
#
#   utils/fix_data_dir.sh data/train_clean_100
#   utils/fix_data_dir.sh --check-audio false data/x   # do not drop utterances whose audio is missing
#
# Keeps the utterances found in every utterance file (text, utt2spk, wav.scp or segments,
# feats.scp, utt2num_frames, utt2dur) that have a non-empty transcript and existing audio;
# keeps the first of duplicate keys; rebuilds spk2utt from utt2spk; sorts every file (LC_ALL=C).
# Never silent: every dropped utterance and the reason go to stderr and <dir>/.backup/dropped.txt;
# the original files are copied to <dir>/.backup/ first. Exit 1 if the result is still invalid
# or empty. Implementation: python -m gossip_accel.bin.fix_data_dir (gossip_accel/data/kaldi/fix.py).
set -euo pipefail
check_audio=true
help_message="Usage: utils/fix_data_dir.sh [options] <data-dir>"
. "$(dirname "${BASH_SOURCE[0]}")/parse_options.sh"
[ $# -eq 1 ] || { echo "$help_message" >&2; exit 1; }
# called outside a recipe (path.sh not sourced): the project's environment (utils/project_env.sh)
python -c 'import gossip_accel' >/dev/null 2>&1 \
  || . "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/project_env.sh" "python cannot import gossip_accel"
extra=()
[ "$check_audio" = true ] || extra+=(--no-check-audio)
exec python -m gossip_accel.bin.fix_data_dir "${extra[@]}" "$1"
