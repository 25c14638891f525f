"""ASR training end to end on a tiny synthetic data dir: 2-worker launch, exact resume, decoding."""
from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from gossip_accel.bin.train_asr import NewBob

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "recipes" / "librispeech" / "asr1" / "conf" / "train_dnn.yaml"
WORDS = ["HELLO", "WORLD", "GOSSIP", "MODEL", "AVERAGE", "SPEECH", "RING", "BLOCK"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def python(*args: str) -> list[str]:
    return [str(Path(os.sys.executable)), *args]


@pytest.fixture(scope="module")
def asr_dir(tmp_path_factory) -> Path:
    """Two Kaldi data dirs of chirps "saying" word sequences, with features, CMVN and char units."""
    root = tmp_path_factory.mktemp("asr")
    rng = np.random.default_rng(0)
    for name, n in (("train", 24), ("dev", 8)):
        d = root / "data" / name
        (root / "wav").mkdir(exist_ok=True)
        d.mkdir(parents=True)
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
        run(python("-m", "gossip_accel.bin.compute_fbank", "--data", str(d), "--out", str(root / "fbank" / name),
                   "--nj", "2", "--num-mel-bins", "40", "--no-progress"), root)
    run(python("-m", "gossip_accel.bin.compute_cmvn", "--data", str(root / "data" / "train")), root)
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
    train(asr_dir, "exp/full", "train.max_epochs=2")
    res = json.loads((asr_dir / "exp/full/results.json").read_text())
    assert res["workers"] == 2 and res["epochs"] == 2 and res["bytes_sent_per_worker"] > 0
    assert [h["epoch"] for h in res["history"]] == [1, 2]
    assert res["history"][0]["steps"] == res["history"][1]["steps"] > 0
    # every epoch validates the replicas (their mean) and their average; the last average is the final model
    assert all({"cv_loss", "cv_loss_replicas"} <= set(h) for h in res["history"])
    assert res["history"][-1]["cv_loss"] == pytest.approx(res["final_cv_loss"], rel=1e-9)
    assert res["sync_settings"]["algorithm"] == "bmuf" and res["sync_settings"]["periods"] == "(2)"

    train(asr_dir, "exp/resumed", "train.max_epochs=1")
    train(asr_dir, "exp/resumed", "train.max_epochs=2")
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
