"""ASR training end to end on a tiny synthetic data dir: 2-worker launch, exact resume, decoding."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from gossip_accel.bin.train_asr import NewBob
from gossip_accel.data.kaldi.tables import read_table
from gossip_accel.train.process_group import free_port

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "recipes" / "librispeech" / "asr1" / "conf" / "train_dnn.yaml"
WORDS = ["HELLO", "WORLD", "GOSSIP", "MODEL", "AVERAGE", "SPEECH", "RING", "BLOCK"]


def run(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 or not check, f"{' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def python(*args: str) -> list[str]:
    return [str(Path(os.sys.executable)), *args]


def chirp_dir(root: Path, name: str, n: int, rng) -> Path:
    """A raw Kaldi data dir root/data/<name> (wav.scp, text, utt2spk, spk2utt) of chirps "saying" words."""
    d = root / "data" / name
    d.mkdir(parents=True)
    (root / "wav").mkdir(exist_ok=True)
    wav, text, u2s = [], [], []
    for i in range(n):
        utt = f"spk{i % 3}-{name}-{i:03d}"
        words = [WORDS[j] for j in rng.integers(0, len(WORDS), size=3)]
        t = np.arange(int(16000 * 0.9)) / 16000
        freqs = [200 + 60 * WORDS.index(w) for w in words]
        sig = np.concatenate([np.sin(2 * np.pi * f * t[: len(t) // 3]) for f in freqs]) * 0.3
        path = root / "wav" / f"{utt}.wav"
        sf.write(path, (sig + 0.01 * rng.standard_normal(len(sig))).astype(np.float32), 16000)
        wav.append(f"{utt} {path}\n")
        text.append(f"{utt} {' '.join(words)}\n")
        u2s.append(f"{utt} {utt.split('-')[0]}\n")
    for f, lines in (("wav.scp", wav), ("text", text), ("utt2spk", u2s)):
        (d / f).write_text("".join(sorted(lines)))
    spk2utt: dict[str, list[str]] = {}
    for line in sorted(u2s):
        utt, spk = line.split()
        spk2utt.setdefault(spk, []).append(utt)
    (d / "spk2utt").write_text("".join(f"{s} {' '.join(u)}\n" for s, u in sorted(spk2utt.items())))
    return d


@pytest.fixture(scope="module")
def asr_dir(tmp_path_factory) -> Path:
    """Two Kaldi data dirs of chirps "saying" word sequences, with features, CMVN (global, per speaker), char units."""
    root = tmp_path_factory.mktemp("asr")
    rng = np.random.default_rng(0)
    for name, n in (("train", 24), ("dev", 8)):
        d = chirp_dir(root, name, n, rng)
        run(python("-m", "gossip_accel.bin.compute_fbank", "--data", str(d), "--out", str(root / "fbank" / name),
                   "--nj", "2", "--num-mel-bins", "40", "--no-progress"), root)
    run(python("-m", "gossip_accel.bin.compute_cmvn", "--data", str(root / "data" / "train")), root)
    for name in ("train", "dev"):
        run(python("-m", "gossip_accel.bin.compute_cmvn", "--data", str(root / "data" / name), "--per-speaker"), root)
    run(python("-m", "gossip_accel.bin.train_units", "--text", str(root / "data" / "train" / "text"),
               "--lang-dir", str(root / "data" / "lang_char"), "--unit-type", "char"), root)
    return root


TINY = ["model.options.hidden=32", "model.options.layers=2", "data.max_frames=800", "train.min_epochs=3",
        "sync.algorithm=bmuf", "sync.period=2"]


def train(root: Path, exp: str, *overrides: str) -> None:
    run(["bash", str(ROOT / "utils" / "launch.sh"), "--num-workers", "2", "--port", str(free_port()), "--",
         "-m", "gossip_accel.bin.train_asr", "--config", str(CONF), "--exp-dir", str(root / exp),
         f"data.train={root / 'data' / 'train'}", f"data.valid={root / 'data' / 'dev'}",
         f"data.lang={root / 'data' / 'lang_char'}", *TINY, *overrides], root)


def test_two_workers_train_resume_exactly_and_decode(asr_dir):
    # with VTLP: its per-utterance warp factors come from the epoch's generator, which a resume restores; with
    # per-speaker CMVN, read from each set's cmvn_spk.ark in training, validation and decoding
    spk = ["vtlp.enabled=true", "data.utterance_cmn=true", "data.utterance_cvn=true", "data.speaker_cmvn=true"]
    train(asr_dir, "exp/full", "train.max_epochs=2", *spk)
    res = json.loads((asr_dir / "exp/full/results.json").read_text())
    assert res["workers"] == 2 and res["epochs"] == 2 and res["bytes_sent_per_worker"] > 0
    assert [h["epoch"] for h in res["history"]] == [1, 2]
    assert res["history"][0]["steps"] == res["history"][1]["steps"] > 0
    # every epoch validates the replicas (their mean) and their average; the last average is the final model
    assert all({"cv_loss", "cv_loss_replicas"} <= set(h) for h in res["history"])
    assert res["history"][-1]["cv_loss"] == pytest.approx(res["final_cv_loss"], rel=1e-9)
    assert res["sync_settings"]["algorithm"] == "bmuf" and res["sync_settings"]["periods"] == "(2)"

    train(asr_dir, "exp/resumed", "train.max_epochs=1", *spk)
    train(asr_dir, "exp/resumed", "train.max_epochs=2", *spk)
    resumed = json.loads((asr_dir / "exp/resumed/results.json").read_text())
    assert resumed["history"] == res["history"]
    a = torch.load(asr_dir / "exp/full/final.pt", weights_only=True)
    b = torch.load(asr_dir / "exp/resumed/final.pt", weights_only=True)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)

    out = asr_dir / "exp/full/decode_dev_greedy"
    proc = run(python("-m", "gossip_accel.bin.decode_asr", "--exp-dir", str(asr_dir / "exp/full"),
                      "--data", str(asr_dir / "data/dev"), "--out", str(out)), asr_dir)
    assert proc.stdout.startswith("%WER ")
    wer_lines = (out / "wer").read_text().splitlines()
    assert wer_lines[0].startswith("%WER ") and "ins," in wer_lines[0] and wer_lines[2].startswith("Scored 8 sentences")
    assert len((out / "hyp.txt").read_text().splitlines()) == 8


def test_frames_per_step_is_one_step_of_all_workers(asr_dir):
    """data.frames_per_step: one worker's batches hold what two workers' batches of half the frames hold; an
    elastic resume continues after the frames the earlier workers consumed; a bad value is one ConfigError line."""
    from gossip_accel.bin.train_asr import ASRTask, load_conf, worker_frames
    from gossip_accel.sync.config import ConfigError

    data = [f"data.train={asr_dir / 'data' / 'train'}", f"data.valid={asr_dir / 'data' / 'dev'}",
            f"data.lang={asr_dir / 'data' / 'lang_char'}", "data.max_frames=100"]
    conf = load_conf([str(CONF)], [*data, "data.frames_per_step=1600"])
    assert worker_frames(conf.data, 1) == 1600 and worker_frames(conf.data, 2) == 800 and worker_frames(conf.data, 3) == 533
    one, two = ASRTask(conf, 0, 1), ASRTask(conf, 1, 2)
    assert one.train_batches == ASRTask(load_conf([str(CONF)], [*data, "data.max_frames=1600"]), 0, 1).train_batches
    assert two.train_batches == ASRTask(load_conf([str(CONF)], [*data, "data.max_frames=800"]), 1, 2).train_batches
    assert len(two.train_batches) > len(one.train_batches)
    assert all(len(b) * max(u.frames for u in b) <= 800 for b in two.train_batches if len(b) > 1)
    # 2 workers took 1 step each (2 batches of 800 frames); the one worker resumes after 1 batch of 1600
    assert one.rest_of_epoch(1, [(2, 1)]) == one.batches(1)[1:]
    assert two.rest_of_epoch(1, [(2, 1)]) == two.batches(1)[1:]  # the same workers: after the 2 batches they took
    with pytest.raises(ConfigError, match=r"^data.frames_per_step=0: must be >= 1"):
        load_conf([str(CONF)], [*data, "data.frames_per_step=0"])


def test_newbob_schedule():
    class Opt:
        param_groups = [{"lr": 1.0}]

    opt, nb = Opt(), NewBob(start_impr=0.01, end_impr=0.001, factor=0.5, min_epochs=1)
    assert not nb.update(1, 10.0, opt) and opt.param_groups[0]["lr"] == 1.0      # first epoch: keep
    assert not nb.update(2, 9.0, opt) and opt.param_groups[0]["lr"] == 1.0       # -10%: keep
    assert not nb.update(3, 8.95, opt) and opt.param_groups[0]["lr"] == 0.5      # -0.6% < 1%: start halving
    assert not nb.update(4, 8.5, opt) and opt.param_groups[0]["lr"] == 0.25      # halving: halve every epoch
    assert nb.update(5, 8.4999, opt)                                            # < 0.1% while halving: stop
    opt.param_groups[0]["lr"] = 1.0
    keep = NewBob(start_impr=0.01, end_impr=0.001, factor=0.5, min_epochs=1, keep_lr_epochs=2)
    assert not keep.update(1, 10.0, opt) and not keep.update(2, 10.5, opt)        # worse, but kept: epoch <= 2
    assert opt.param_groups[0]["lr"] == 1.0
    assert not keep.update(3, 10.0, opt) and opt.param_groups[0]["lr"] == 0.5     # no gain over the best: halve


def _uneven_worker(rank: int, world: int, init_file: str, local_steps: list[int], out_dir: str) -> None:
    import torch.distributed as dist

    from gossip_accel import shutdown
    from gossip_accel.train.collectives import agree_on_steps

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    steps = agree_on_steps(local_steps[rank])
    total = torch.zeros(1)
    for _ in range(steps):  # one collective per step, as a sync round is: a rank that went on alone would hang
        t = torch.ones(1)
        dist.all_reduce(t)
        total += t
    Path(out_dir, f"rank{rank}").write_text(f"{steps} {int(total)}")
    shutdown()


def test_ranks_with_uneven_batches_agree_on_steps(tmp_path):
    """Ranks holding 5, 3 and 4 batches all take 3 steps (the minimum), and every collective completes."""
    import torch.multiprocessing as mp

    ctx = mp.spawn(_uneven_worker, args=(3, str(tmp_path / "init"), [5, 3, 4], str(tmp_path)), nprocs=3, join=False)
    for _ in range(30):  # bounded wait: a hang fails the test instead of stalling the suite
        if ctx.join(timeout=10):
            break
    else:
        for p in ctx.processes:
            p.kill()
        pytest.fail("workers with uneven batch counts did not finish")
    assert [(tmp_path / f"rank{r}").read_text() for r in range(3)] == ["3 9"] * 3


# ---------------------------------------------------------------- the stages (utils/run_asr.sh)
CORPUS_DATA_SH = """#!/usr/bin/env bash
# the test corpus's data preparation: copies the raw data dirs of --corpus (train, dev, test, extra)
set -euo pipefail
nj=2
train_set=train
dev_set=dev
test_sets=test
test_only=false   # true: the test sets alone
corpus=""         # the raw data dirs
help_message="Usage: local/data.sh [options]"
. utils/parse_options.sh
sets="$train_set $dev_set $test_sets"
[ "$test_only" = true ] && sets=$test_sets
for s in $sets; do
  [ -f "data/$s/text" ] && continue
  mkdir -p "data/$s" && cp "$corpus/$s/"* "data/$s/" && echo "local/data.sh: prepared data/$s" >&2
done
"""


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    return make_recipe(tmp_path_factory.mktemp("recipe"))


def make_recipe(root: Path) -> Path:
    """A recipe dir on utils/run_asr.sh whose local/data.sh copies chirp data dirs (train, dev, test, extra, dev_extra)."""
    rng = np.random.default_rng(1)
    for name, n in (("train", 24), ("dev", 8), ("test", 6), ("extra", 5), ("dev_extra", 5)):
        chirp_dir(root / "corpus", name, n, rng)
    rec = root / "asr1"
    (rec / "local").mkdir(parents=True)
    (rec / "utils").symlink_to(ROOT / "utils")
    (rec / "local" / "data.sh").write_text(CORPUS_DATA_SH)
    (rec / "run.sh").write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\ncd \"$(dirname \"$0\")\"\n"
        f"exec utils/run_asr.sh --corpus {root / 'corpus' / 'data'} --unit-type char --num-mel-bins 40 --conf {CONF} "
        "--use-lm false --decode-methods greedy --num-workers 2 --algorithms bmuf \"$@\"\n")
    for f in ("run.sh", "local/data.sh"):
        (rec / f).chmod(0o755)
    return rec


def stages(rec: Path, *args: str) -> subprocess.CompletedProcess:
    return run(["bash", str(rec / "run.sh"), "--port", str(free_port()), *args], rec)


def test_stages_decode_the_average_of_the_best_epochs_then_a_new_test_set_alone(recipe):
    exp = recipe / "exp" / "dnn_bmuf-n2"
    first = stages(recipe, "--avg", "2", "--avg-mode", "best", "--decode-methods", "greedy beam_word",
                   "--word-lm-order", "2", "--", *TINY, "train.max_epochs=3",
                   "train.max_steps_per_epoch=3", "train.keep_checkpoints=1")
    res = json.loads((exp / "results.json").read_text())
    # every epoch's globally averaged model is kept (the checkpoints are pruned to 1); the last is the final model
    assert sorted(p.name for p in (exp / "epoch_models").iterdir()) == ["epoch1.pt", "epoch2.pt", "epoch3.pt"]
    assert len(list((exp / "checkpoints").iterdir())) == 1
    final = torch.load(exp / "final.pt", weights_only=True)
    for k, v in torch.load(exp / "epoch_models" / "epoch3.pt", weights_only=True).items():
        torch.testing.assert_close(v, final[k], rtol=0, atol=1e-6)
    # stage 6: the mean of the 2 epochs of lowest CV loss (results.json) is what was decoded
    best = sorted(sorted(res["history"], key=lambda h: (h["cv_loss"], -h["epoch"]))[:2], key=lambda h: h["epoch"])
    rec = json.loads((exp / "avg_best2.json").read_text())
    assert rec["epochs"] == [h["epoch"] for h in best]
    models = [torch.load(exp / "epoch_models" / f"epoch{e}.pt", weights_only=True) for e in rec["epochs"]]
    averaged = torch.load(exp / "avg_best2.pt", weights_only=True)
    for k, v in averaged.items():
        if v.is_floating_point():
            assert torch.equal(v, (models[0][k].double() + models[1][k].double()).div(2).to(v.dtype)), k
    summary = json.loads((exp / "decode_test_greedy_avg_best2" / "summary.json").read_text())
    assert summary["checkpoint"] == "avg_best2" and summary["model_file"].endswith("avg_best2.pt")
    # stage 5's word bigram of the training transcripts (no --lm-text), decoded with the lexicon by beam_word
    word_lm = recipe / "data" / "word_lm2_lang_char"
    info = json.loads((word_lm / "info.json").read_text())
    assert info["order"] == 2 and info["source"] == "data/train/text" and "dev_oov_rate" in info
    words = json.loads((exp / "decode_test_beam_word_avg_best2" / "summary.json").read_text())
    assert words["method"] == "word" and words["word_lm"] == "data/word_lm2_lang_char" and words["checkpoint"] == "avg_best2"
    # its LM weight and word score: the pair of lowest WER on the dev set, of the 3 x 3 tried there
    tuning = json.loads((exp / "word_tuning_avg_best2_on_dev.json").read_text())
    assert tuning["tune_data"] == "data/dev" == words["tuned_on"] and len(tuning["wer"]) == 9
    assert tuning["chosen_wer"] == min(tuning["wer"]) and tuning["chosen"] == [words["word_lm_weight"], words["word_score"]]
    assert words["beam"] == 400 and words["beam_size_token"] == 6 == tuning["beam_size_token"]   # run_asr.sh's defaults
    lexicon = {line.split()[0] for line in (word_lm / "lexicon.txt").read_text().splitlines()}
    hyp_lines = (exp / "decode_test_beam_word_avg_best2" / "hyp.txt").read_text().splitlines()
    assert {w for line in hyp_lines for w in line.split()[1:]} <= lexicon      # only lexicon words come out
    # stage 7: the table at a glance first (one row per run), then every decode, naming the model
    table = (recipe / "exp" / "RESULTS.md").read_text().splitlines()
    assert table[0].startswith("| run | %WER test | %CER test | MB sent/step/worker |")
    assert any(line.startswith("| dnn_bmuf-n2 |") for line in table[:3])
    assert "At a glance: word (beam 400, 6 units a frame) + word LM decoding of each run's model avg_best2" in "\n".join(table)
    epochs = " ".join(map(str, rec["epochs"]))
    assert any(f"| test | greedy | avg_best2: epochs {epochs} |" in line for line in table)
    assert any(f"| test | word (beam 400, 6 units a frame) + word LM | avg_best2: epochs {epochs} |" in line for line in table)
    assert "\n".join(table) in first.stdout
    # --word-list: the lexicon widened by a dictionary, in its own LM dir, decoded beside the plain lexicon;
    # the table at a glance takes it
    (recipe / "dict.txt").write_text("".join(f"{w.lower()}\n" for w in ("zebra", "deal", "moss", "hello")))
    stages(recipe, "--stage", "5", "--stop-stage", "7", "--avg", "2", "--decode-methods", "beam_word",
           "--word-lm-order", "2", "--word-list", str(recipe / "dict.txt"))
    widened = recipe / "data" / "word_lm2_lang_char_dict.txt"
    winfo = json.loads((widened / "info.json").read_text())
    assert winfo["word_list"] == str(recipe / "dict.txt") and winfo["word_list_added"] == 2   # DEAL, MOSS (Z: no unit)
    assert winfo["lexicon_words"] == info["lexicon_words"] + winfo["word_list_added"]
    wide = json.loads((exp / "decode_test_beam_word_dict.txt_avg_best2" / "summary.json").read_text())
    assert wide["word_lm"] == "data/word_lm2_lang_char_dict.txt" and wide["word_list"] == str(recipe / "dict.txt")
    assert (exp / "decode_test_beam_word_avg_best2" / "summary.json").is_file()       # the plain decode is kept
    wtuning = json.loads((exp / "word_tuning_avg_best2_dict.txt_on_dev.json").read_text())    # tuned apart from the plain one
    assert wtuning["word_lm"] == "data/word_lm2_lang_char_dict.txt" and wtuning["chosen"] == [wide["word_lm_weight"],
                                                                                            wide["word_score"]]
    assert json.loads((exp / "word_tuning_avg_best2_on_dev.json").read_text())["word_lm"] == "data/word_lm2_lang_char"
    table = (recipe / "exp" / "RESULTS.md").read_text()
    assert "At a glance: word (beam 400, 6 units a frame) + word LM + dict.txt decoding" in table
    assert "| test | word (beam 400, 6 units a frame) + word LM |" in table and "| test | word (beam 400, 6 units a frame) + word LM + dict.txt |" in table
    # another list of the same file name: its LM dir is rebuilt (not taken for the first list's) and re-decoded
    (recipe / "other").mkdir()
    (recipe / "other" / "dict.txt").write_text("deal\n")
    redo = stages(recipe, "--stage", "5", "--stop-stage", "6", "--avg", "2", "--decode-methods", "beam_word",
                  "--word-lm-order", "2", "--word-list", str(recipe / "other" / "dict.txt"))
    assert "was built with another --word-list" in redo.stderr
    winfo = json.loads((widened / "info.json").read_text())
    assert winfo["word_list"] == str(recipe / "other" / "dict.txt") and winfo["word_list_added"] == 1   # DEAL
    assert "decode_test_beam_word_dict.txt_avg_best2 done" not in redo.stderr                  # decoded again
    again = stages(recipe, "--stage", "5", "--stop-stage", "6", "--avg", "2", "--decode-methods", "beam_word",
                   "--word-lm-order", "2", "--word-list", str(recipe / "other" / "dict.txt"))
    assert "word_lm2_lang_char_dict.txt exists" in again.stderr and "dict.txt_avg_best2 done" in again.stderr
    # --lm-text: rebuilt when the text is newer than the LM (local/data.sh rewrote it), taken as it is otherwise
    lm_text = recipe / "lm.txt"
    lm_text.write_text("HELLO DEAL\nMOSS DEAL\n")
    lm_opts = ("--stage", "5", "--stop-stage", "5", "--decode-methods", "beam_word", "--word-lm-order", "2",
               "--word-list", str(recipe / "other" / "dict.txt"), "--lm-text", str(lm_text))
    first_text = stages(recipe, *lm_opts)
    assert f"{lm_text} is newer than data/word_lm2_lang_char_dict.txt: rebuilding it" in first_text.stderr
    assert "another --word-list" not in first_text.stderr                    # the same list: the text's reason alone
    assert json.loads((widened / "info.json").read_text())["source"] == str(lm_text)
    assert "\tHELLO MOSS" not in (widened / "lm.arpa").read_text()
    assert "word_lm2_lang_char_dict.txt exists" in stages(recipe, *lm_opts).stderr
    lm_text.write_text("HELLO MOSS\n")
    later = (widened / ".done").stat().st_mtime + 5
    os.utime(lm_text, (later, later))
    assert "rebuilding it" in stages(recipe, *lm_opts).stderr
    assert "\tHELLO MOSS" in (widened / "lm.arpa").read_text()                  # the new text's bigram
    cmvn = recipe / "data" / "train" / "cmvn.ark"
    cmvn_bytes, cmvn_mtime = cmvn.read_bytes(), cmvn.stat().st_mtime_ns

    # a new test set alone, decoded with the model dir (a glob), here its final model (--avg 0): no
    # training set is prepared, the training set's CMVN is left as it is
    again = stages(recipe, "--test-only", "true", "--test-sets", "extra", "--model-dir", str(recipe / "exp" / "dnn_*"),
                   "--avg", "0")
    assert "prepared data/extra" in again.stderr and "prepared data/train" not in again.stderr
    assert "Stage 4: skipped" in again.stderr and "training set's data/train/cmvn.ark is left as it is" in again.stderr
    assert (recipe / "data" / "extra" / "feats.scp").is_file() and (recipe / "data" / "extra" / "cmvn_spk.ark").is_file()
    assert cmvn.read_bytes() == cmvn_bytes and cmvn.stat().st_mtime_ns == cmvn_mtime
    extra = json.loads((exp / "decode_extra_greedy" / "summary.json").read_text())
    assert extra["checkpoint"] == "final" and extra["model_file"].endswith("final.pt") and extra["ref_words"] == 15
    table = (recipe / "exp" / "RESULTS.md").read_text()
    assert table.startswith("| run | %WER extra | %CER extra |") and "| extra | greedy | final |" in table
    assert "| test | greedy | avg_best2" in table                    # the earlier decode is still reported
    # stage 2 again (not --test-only): the features are there, the CMVN up to date, not recomputed
    last = stages(recipe, "--stage", "2", "--stop-stage", "2")
    assert "cmvn.ark is up to date" in last.stderr and cmvn.stat().st_mtime_ns == cmvn_mtime

    # stage 6 decodes two runs at once (--decode-jobs 2, each logging to <run>/decode.log); one that fails (no
    # model) is named with the end of its log, the others are decoded all the same
    import shutil
    copy, broken = recipe / "exp" / "dnn_copy-n2", recipe / "exp" / "dnn_broken-n2"
    copy.mkdir()
    for name in ("config.yaml", "final.pt", "results.json"):
        shutil.copy(exp / name, copy / name)
    broken.mkdir()
    shutil.copy(exp / "config.yaml", broken / "config.yaml")
    both = run(["bash", str(recipe / "run.sh"), "--stage", "6", "--stop-stage", "6", "--test-sets", "extra", "--avg", "0",
                "--model-dir", f"{exp} {copy} {broken}"], recipe, check=False)
    assert both.returncode != 0 and f"Stage 6: decoding failed for {broken}" in both.stderr
    assert f"decoding dnn_copy-n2 in the background (log: {copy}/decode.log)" in both.stderr
    assert "Stage 6: dnn_copy-n2 decoded" in both.stderr and (copy / "decode_extra_greedy" / ".done").is_file()
    assert "decoding data/extra with dnn_copy-n2 (greedy, final)" in (copy / "decode.log").read_text()
    assert json.loads((copy / "decode_extra_greedy" / "summary.json").read_text())["ref_words"] == 15
    shutil.rmtree(copy)
    shutil.rmtree(broken)


def test_a_test_set_tuned_on_a_dev_set_of_its_own(recipe):
    """--tune-sets extra:dev_extra (LibriSpeech's test_other:dev_other): stages 0-2 prepare dev_extra, stage 6 tunes
    extra's LM weight and word score on it, test's on --dev-set; a decode tuned on another set is made again."""
    exp = recipe / "exp" / "dnn_bmuf-n2"   # trained by the stages test above
    opts = ("--test-only", "true", "--test-sets", "test extra", "--model-dir", str(exp), "--avg", "0",
            "--decode-methods", "beam_word", "--word-lm-order", "2")
    first = stages(recipe, *opts, "--tune-sets", "extra:dev_extra")
    assert "prepared data/dev_extra" in first.stderr and (recipe / "data" / "dev_extra" / "feats.scp").is_file()
    extra = json.loads((exp / "decode_extra_beam_word" / "summary.json").read_text())
    test = json.loads((exp / "decode_test_beam_word" / "summary.json").read_text())
    assert extra["tuned_on"] == "data/dev_extra" and test["tuned_on"] == "data/dev"
    tuning = json.loads((exp / "word_tuning_final_on_dev_extra.json").read_text())
    assert tuning["chosen"] == [extra["word_lm_weight"], extra["word_score"]] and len(tuning["wer"]) == 9
    made = "LM weights 1 2 3, word scores -1 0 1, tuned on data/dev_extra"
    assert (exp / "decode_extra_beam_word" / ".done").read_text().strip() == made
    again = stages(recipe, *opts, "--tune-sets", "extra:dev_extra")
    assert "decode_extra_beam_word done" in again.stderr and "decode_test_beam_word done" in again.stderr
    # without the pair, extra is tuned on --dev-set: decoded again
    plain = stages(recipe, *opts)
    assert "decode_extra_beam_word done" not in plain.stderr and "decode_test_beam_word done" in plain.stderr
    assert json.loads((exp / "decode_extra_beam_word" / "summary.json").read_text())["tuned_on"] == "data/dev"
    # another grid: both decoded again, tuned on it (the record of each pair's dev WER follows the grid)
    wider = stages(recipe, *opts, "--tune-sets", "extra:dev_extra", "--word-scores", "-1 0 1 2")
    assert "decode_extra_beam_word was made with 'LM weights 1 2 3, word scores -1 0 1, tuned on data/dev', not " \
           "'LM weights 1 2 3, word scores -1 0 1 2, tuned on data/dev_extra': decoding again" in wider.stderr
    assert "beam_word done" not in wider.stderr
    assert len(json.loads((exp / "word_tuning_final_on_dev_extra.json").read_text())["wer"]) == 12
    # one (LM weight, word score) pair: nothing to tune, the pair's dev set is not prepared; a pair of a test set not
    # decoded is left alone; a malformed pair is named
    fixed = stages(recipe, *opts, "--word-lm-weights", "1", "--word-scores", "0", "--tune-sets", "extra:dev_none other:x")
    assert "data/dev_none" not in fixed.stderr and "data/x" not in fixed.stderr
    bad = run(["bash", str(recipe / "run.sh"), *opts, "--tune-sets", "extra"], recipe, check=False)
    assert bad.returncode != 0 and "--tune-sets 'extra': a test:dev pair of data set names" in bad.stderr


def test_stage_2_trains_on_speed_perturbed_and_augmented_copies(recipe):
    """--speed-perturb then --augment: data/train_sp_aug1 holds 2 x 2 x the training set, its own CMVN;
    data/train and its CMVN are left as they are."""
    cmvn = recipe / "data" / "train" / "cmvn.ark"
    before = cmvn.stat().st_mtime_ns if cmvn.exists() else None
    out = stages(recipe, "--stop-stage", "2", "--speed-perturb", "0.9 1.0", "--augment", "1",
                 "--augment-opts", "--noise babble,white --reverb-probability 1")
    aug = recipe / "data" / "train_sp_aug1"
    assert "augment_data: data/train_sp -> data/train_sp_aug1: 96 utterances" in out.stdout
    feats = read_table(aug / "feats.scp")
    assert len(feats) == 96 and {u.split("-")[0] for u in feats} == {"aug1", "sp0.9", "spk0", "spk1", "spk2"}
    assert len(read_table(aug / "utt2augment")) == 48 and (aug / "cmvn.ark").is_file()
    assert (cmvn.stat().st_mtime_ns if cmvn.exists() else None) == before
    bad = run(["bash", str(recipe / "run.sh"), "--stop-stage", "2", "--augment", "x"], recipe, check=False)
    assert bad.returncode != 0 and "--augment x: a number of augmented copies" in bad.stderr


def test_stage_2_remakes_the_features_and_copies_of_a_set_whose_audio_changed(tmp_path):
    """A training set made again with other audio under the same name (another mini corpus in the same
    recipe dir): stage 2 recomputes its features, its CMVN and its speed-perturbed copy, and keeps the
    features of the sets that did not change; a rerun recomputes nothing."""
    rec = make_recipe(tmp_path)
    stages(rec, "--stop-stage", "2", "--speed-perturb", "0.9 1.0")
    data = rec / "data"
    dev_feats = read_table(data / "dev" / "feats.scp")
    old_cmvn = (data / "train_sp" / "cmvn.ark").read_bytes()
    assert len(read_table(data / "train_sp" / "feats.scp")) == 48
    # the corpus rebuilt with 20 other training utterances; local/data.sh copies them over data/train
    chirp_dir(tmp_path / "other", "train", 20, np.random.default_rng(7))
    for f in (tmp_path / "other" / "data" / "train").iterdir():
        (tmp_path / "corpus" / "data" / "train" / f.name).write_bytes(f.read_bytes())
    (data / "train" / "text").unlink()
    out = stages(rec, "--stop-stage", "2", "--speed-perturb", "0.9 1.0")
    assert "data/train_sp was not made from data/train as it is now" in out.stderr
    assert "data/train_sp changed since its features" in out.stderr
    assert "Stage 2: data/dev has features" in out.stderr and read_table(data / "dev" / "feats.scp") == dev_feats
    wavs = read_table(data / "train" / "wav.scp")
    assert all("/other/" in w for w in wavs.values())
    sp = read_table(data / "train_sp" / "feats.scp")
    assert len(sp) == 40 and {u.removeprefix("sp0.9-") for u in sp} == set(wavs)
    assert (data / "train_sp" / "cmvn.ark").read_bytes() != old_cmvn
    # nothing changed since: nothing is made again
    again = stages(rec, "--stop-stage", "2", "--speed-perturb", "0.9 1.0")
    assert "changed since" not in again.stderr and "was not made from" not in again.stderr
    assert "perturb_speed" not in again.stdout and "cmvn.ark is up to date" in again.stderr
    # other fbank options are another key: features made again
    mel = stages(rec, "--stop-stage", "2", "--speed-perturb", "0.9 1.0", "--num-mel-bins", "23")
    assert "data/dev changed since its features" in mel.stderr


def test_phone_units_train_and_decode_to_words_through_the_lexicon(recipe):
    """--unit-type phone --lexicon: stage 3 makes data/lang_phone, stage 4 trains on its phones, stage 5 spells the
    word LM's lexicon in them, stage 6 decodes with beam_word and skips greedy (phones are no words)."""
    lexicon = recipe / "phones.txt"   # a made-up lexicon: each word's letters are its "phones", two for HELLO
    lexicon.write_text("".join(f"{w} {' '.join(w.lower())}\n" for w in WORDS) + "HELLO h e l o\n")
    out = stages(recipe, "--unit-type", "phone", "--lexicon", str(lexicon), "--exp", "exp_phone", "--avg", "0",
                 "--decode-methods", "greedy beam_word", "--word-lm-order", "2", "--word-lm-weights", "1",
                 "--word-scores", "0", "--", *TINY, "train.max_epochs=2", "train.max_steps_per_epoch=3")
    lang = recipe / "data" / "lang_phone"
    meta = json.loads((lang / "units.json").read_text())
    assert meta["type"] == "phone" and meta["train_words"] == len(WORDS) and meta["train_words_without_pronunciation"] == 0
    tokens = [line.split()[0] for line in (lang / "tokens.txt").read_text().splitlines()]
    assert tokens == ["<blk>", "<unk>"] + sorted({c for w in WORDS for c in w.lower()})
    run_dir = recipe / "exp_phone" / "dnn_bmuf-n2"
    assert "lang: data/lang_phone" in (run_dir / "config.yaml").read_text()
    assert "skipping greedy for dnn_bmuf-n2: phone units decode to words through the lexicon only" in out.stderr
    assert not (run_dir / "decode_test_greedy").exists()
    word_lm = recipe / "data" / "word_lm2_lang_phone"
    assert "HELLO h e l o" in (word_lm / "lexicon.txt").read_text().splitlines()   # both pronunciations
    summary = json.loads((run_dir / "decode_test_beam_word" / "summary.json").read_text())
    assert summary["word_lm"] == "data/word_lm2_lang_phone" and summary["ref_words"] == 18
    hyp_lines = (run_dir / "decode_test_beam_word" / "hyp.txt").read_text().splitlines()
    assert len(hyp_lines) == 6 and {w for line in hyp_lines for w in line.split()[1:]} <= set(WORDS)
    assert "| dnn_bmuf-n2 |" in (recipe / "exp_phone" / "RESULTS.md").read_text()
    bad = run(["bash", str(recipe / "run.sh"), "--stage", "3", "--stop-stage", "3", "--unit-type", "phone"], recipe,
              check=False)
    assert bad.returncode != 0 and "--unit-type phone needs --lexicon FILE" in bad.stderr
    # the lang dir made from one lexicon is not silently taken for another's (its models need its phones)
    other = recipe / "other_phones.txt"
    other.write_text(lexicon.read_text())
    again = run(["bash", str(recipe / "run.sh"), "--stage", "3", "--stop-stage", "3", "--unit-type", "phone",
                 "--lexicon", str(lexicon)], recipe)
    assert "data/lang_phone exists" in again.stderr
    moved = run(["bash", str(recipe / "run.sh"), "--stage", "3", "--stop-stage", "3", "--unit-type", "phone",
                 "--lexicon", str(other)], recipe, check=False)
    assert moved.returncode != 0 and f"was made from '{lexicon}', not '{other}'" in moved.stderr
