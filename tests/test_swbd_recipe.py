"""recipes/swbd/asr1 end to end on a tiny mini Switchboard (flite), in a scratch recipe dir made
of links (the user's data/ and exp/ are left alone): corpus in the LDC layouts, data dirs with
segments and reco2file_and_channel, 8 kHz features from shortened two-channel SPHERE, BPE units,
gossip-BMUF training with 3 workers, unit LM, decoding, filtered scoring of the SWB and CallHome
halves of eval2000, RESULTS.md; then the training stage on two "nodes" (two run.sh, node ranks
0 and 1, over loopback), which must form one 2-worker job."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from gossip_accel.train.process_group import free_port

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "swbd" / "asr1"


def linked_recipe(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in ("run.sh", "path.sh", "conf", "local", "utils"):
        (dst / name).symlink_to(src / name)
    return dst


def run(recipe: Path, args: list[str], **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(["bash", str(recipe / "run.sh"), *args], cwd=recipe, env=env, capture_output=True,
                          text=True, timeout=600, **kw)


TINY = ["--mini-train-convs", "3", "--mini-segs-per-side", "5", "--mini-eval-convs", "1",
        "--mini-eval-segs-per-side", "3", "--dev-utts", "6", "--unit-type", "bpe", "--vocab-size", "60",   # (mini default: phones)
        "--mini-more-train-convs", "1", "--mini-more-train-voices", "espeak-en-us-m1 espeak-en-gb-scotland-f2",
        "--mini-more-train-speakers", "2"]
OVERRIDES = ["train.max_epochs=1", "train.max_steps_per_epoch=3", "model.options.hidden=32", "model.options.layers=1",
             "sync.period=1", "sync.warmup_steps=0", "data.max_frames=1000"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A scratch recipe dir after stages 0-3 (tiny mini corpus, data dirs, 8 kHz features, BPE units)."""
    recipe = linked_recipe(RECIPE, tmp_path_factory.mktemp("swbd") / "asr1")
    proc = run(recipe, [*TINY, "--stop-stage", "3"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return recipe, proc


def test_swbd_recipe_all_stages(prepared, tmp_path):
    recipe, prep = prepared
    lm_conf = tmp_path / "lm_tiny.yaml"
    lm_conf.write_text(re.sub(r"epochs: \d+", "epochs: 1", (RECIPE / "conf" / "lm_units.yaml").read_text())
                       + "  max_steps_per_epoch: 5\n")
    proc = run(recipe, [*TINY, "--stage", "4", "--num-workers", "3", "--port", str(free_port()), "--lm-conf",
                        str(lm_conf), "--decode-methods", "greedy beam_lm beam_word",
                        # a grid of 2 (each point loads the 100k-word lexicon again; the 3 x 3 default: test_asr_recipe)
                        "--word-lm-weights", "1 3", "--word-scores", "0", "--", *OVERRIDES])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    data = recipe / "data"
    # stages 0-1: LDC layouts -> Kaldi data dirs with segments and reco2file_and_channel
    convs = sorted(f.stem for f in (data / "mini_swbd" / "LDC97S62" / "swb1_d1" / "data").glob("sw0*.sph"))
    assert len(convs) == 4                # 3 of flite's voices, then 1 of two espeak-ng speakers
    stats = json.loads((data / "mini_swbd" / "mini_swbd.json").read_text())["stats"]
    assert {s.split()[0] for s in stats["sides"][convs[-1]].values()} == {"espeak-en-us-m1", "espeak-en-gb-scotland-f2"}
    assert all(u.startswith(convs[0]) for u in (data / "train_dev" / "text").read_text().split("\n") if u)
    for d in ("train_nodup", "train_dev", "eval2000_swbd", "eval2000_callhome"):
        for f in ("segments", "reco2file_and_channel", "feats.scp", "text"):
            assert (data / d / f).is_file(), f"{d}/{f}"
    assert all(u.startswith("sw_") for u in (data / "eval2000_swbd" / "text").read_text().split("\n") if u)
    assert all(u.startswith("en_") for u in (data / "eval2000_callhome" / "text").read_text().split("\n") if u)
    assert "40 mel bins" in prep.stderr                                   # 8 kHz, 40-dim fbank
    # the LM text: the corpus's (Wikipedia) then WordNet's words and glosses, lower case, no eval2000 sentence
    lm_text = (data / "lm_text.txt").read_text().splitlines()
    wiki = (data / "mini_swbd" / "lm_text.txt").read_text().splitlines()
    evals = {" ".join(line.split()[1:]) for line in (data / "eval2000" / "text").read_text().splitlines()}
    dev = {" ".join(line.split()[1:]) for line in (data / "train_dev" / "text").read_text().splitlines()}
    kept = [s for s in wiki if s not in dev]    # train_dev tunes the LM weights: its sentences are held out
    assert dev & set(wiki) and lm_text[:len(kept)] == kept and "edmonton" in lm_text
    assert len(lm_text) > len(kept) + 300000 and evals and not (evals | dev) & set(lm_text)
    assert (data / "lang_bpe60" / "bpe.model").is_file()
    # stage 4: gossip-BMUF, 3 workers; stage 6: filtered scoring of each half
    exp = recipe / "exp"
    res = json.loads((exp / "tdnn_gossip_bmuf-n3" / "results.json").read_text())
    assert res["workers"] == 3 and res["bytes_sent_per_step_per_worker"] > 0
    for half in ("eval2000_swbd", "eval2000_callhome"):
        for m in ("greedy", "beam_lm", "beam_word"):
            d = exp / "tdnn_gossip_bmuf-n3" / f"decode_{half}_{m}_avg_best5"   # the average decoded by default
            s = json.loads((d / "summary.json").read_text())
            assert "filter" in s and s["unfiltered"]["ref_words"] >= s["ref_words"] > 0
            assert (d / "unfiltered" / "wer").is_file() and (d / "wer").read_text().startswith("%WER")
            ref = (d / "ref.txt").read_text()
            assert "(%hesitation)" not in ref and "[noise]" not in ref
    table = (exp / "RESULTS.md").read_text()
    for half in ("eval2000_swbd", "eval2000_callhome"):
        assert f"| {half} | greedy |" in table and f"| {half} | beam (beam 8) + LM |" in table
        assert f"| {half} | word (beam 400, 6 units a frame) + word LM |" in table
    # the word LM's lexicon spells words in the BPE units, as sentencepiece writes them at a word start
    lexicon = (data / "word_lm3_lang_bpe60" / "lexicon.txt").read_text(encoding="utf-8").splitlines()
    assert lexicon and all(line.split()[1].startswith("\u2581") for line in lexicon)
    # a rerun skips the finished work
    again = run(recipe, [*TINY, "--stage", "4", "--stop-stage", "4", "--num-workers", "3", "--", *OVERRIDES])
    assert again.returncode == 0 and "already trained" in again.stderr, again.stderr[-3000:]


def test_swbd_training_stage_on_two_nodes(prepared):
    """Stage 4 on two "nodes" over loopback (two run.sh, node ranks 1 and 0): one job of 2 x 1 workers."""
    recipe, _ = prepared
    port = str(free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(["bash", str(recipe / "run.sh"), *TINY, "--stage", "4", "--stop-stage", "4",
                               "--algorithms", "ma", "--num-workers", "1", "--num-nodes", "2", "--node-rank", str(r),
                               "--master-addr", "127.0.0.1", "--port", port, "--", *OVERRIDES],
                              cwd=recipe, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in (1, 0)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    run_dir = recipe / "exp" / "tdnn_ma-n2"
    res = json.loads((run_dir / "results.json").read_text())
    assert res["workers"] == 2 and res["bytes_sent_per_step_per_worker"] > 0
    assert (run_dir / "train.node1.log").is_file() and "this is node 1" in outs[0]
    assert not list(run_dir.glob("decode_*"))                            # node 1 ran stage 4 only
