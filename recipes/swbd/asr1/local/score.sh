#!/usr/bin/env bash
# The recipe's scoring hook (utils/run_asr.sh --score-hook local/score.sh): after decoding
# <data-dir> into <decode-dir>, score again with local/wer_filter.py on both reference and
# hypothesis (hesitations, non-speech tokens, optional and partial words removed; GLM spelling
# variants mapped). The decode dir's wer, cer, per_utt, hyp.txt, ref.txt and summary.json then
# hold the filtered scores, which RESULTS.md reports; the unfiltered ones move to <decode-dir>/unfiltered/.
#
#   local/score.sh data/eval2000_swbd exp/dnn_gossip_bmuf-n4/decode_eval2000_swbd_greedy
set -euo pipefail
[ $# -eq 2 ] || { echo "Usage: $0 <data-dir> <decode-dir>" >&2; exit 1; }
data=$1
dir=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir/unfiltered"
for f in wer cer per_utt hyp.txt ref.txt summary.json; do
  # a rerun starts from the unfiltered scores again
  if [ -f "$dir/unfiltered/$f" ]; then cp "$dir/unfiltered/$f" "$dir/$f"; else cp "$dir/$f" "$dir/unfiltered/$f"; fi
done
python "$here/wer_filter.py" < "$dir/unfiltered/ref.txt" > "$dir/ref.filt.txt"
python "$here/wer_filter.py" < "$dir/unfiltered/hyp.txt" > "$dir/hyp.filt.txt"
python - "$dir" <<'PY'
import json, sys
from pathlib import Path
from gossip_accel.asr.scoring import write_scoring_dir
from gossip_accel.data.kaldi.tables import read_table
d = Path(sys.argv[1])
refs, hyps = read_table(d / "ref.filt.txt"), read_table(d / "hyp.filt.txt")
stats = write_scoring_dir(d, refs, hyps)
summary = json.loads((d / "unfiltered" / "summary.json").read_text())
unfiltered = {k: summary[k] for k in ("wer", "errors", "ref_words") if k in summary}
summary.update(stats.as_dict(), filter="local/wer_filter.py (hesitations, non-speech, optional and partial words)",
               unfiltered=unfiltered)
(d / "summary.json").write_text(json.dumps(summary, indent=2))
print(f"{stats.kaldi_lines()[0]} {d} (filtered; unfiltered {unfiltered.get('wer', float('nan')):.2f})")
PY
