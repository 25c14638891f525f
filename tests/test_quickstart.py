"""The README's first command, shrunk: ./run.sh end to end, LM and ASR (data, DDP and gossip-BMUF
training, evaluation, report). The ASR part runs in a scratch recipe dir made of links to
recipes/librispeech/asr1, so that the user's own data/ and exp/ there are left alone."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from gossip_accel.train.process_group import free_port


ROOT = Path(__file__).resolve().parent.parent


def run(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(["bash", str(ROOT / "run.sh"), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_run_sh_all_lm_stages(tmp_path):
    data, exp = tmp_path / "data", tmp_path / "exp"
    args = ["--tasks", "lm", "--data", str(data), "--exp", str(exp), "--num-workers", "3", "--epochs", "1",
            "--port", str(free_port()), "--", "train.max_steps_per_epoch=20", "model.hidden_size=64", "model.projection_size=32",
            "sync.components.0.period=12"]  # so that the embedding syncs within 20 steps
    proc = run(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert (data / "vocab.txt").is_file() and (data / "wiki.train.tokens").is_file()
    ddp = json.loads((exp / "ddp-n3" / "results.json").read_text())
    gossip = json.loads((exp / "gossip_bmuf-12_96-n3" / "results.json").read_text())
    assert ddp["workers"] == gossip["workers"] == 3
    assert ddp["steps_per_worker"] == gossip["steps_per_worker"] == 20
    # gossip-BMUF (12,12 here) sends far less than DDP's all-reduce of every gradient
    assert 0 < gossip["bytes_sent_per_step_per_worker"] < ddp["bytes_sent_per_step_per_worker"] / 5
    assert ddp["final_test_ppl"] > 1 and gossip["final_test_ppl"] > 1  # stage 3 (eval) ran
    table = (exp / "compare" / "RESULTS.md").read_text()
    assert "| ddp-n3 | 3 |" in table and "| gossip_bmuf-12_96-n3 | 3 |" in table
    assert (exp / "compare" / "RESULTS.png").stat().st_size > 0
    # stages are idempotent: a rerun skips the finished work
    again = run(args)
    assert again.returncode == 0 and "already trained" in again.stderr


def linked_recipe(src: Path, dst: Path) -> Path:
    """A recipe dir whose files are links to src's (its data/, fbank/ and exp/ are new)."""
    dst.mkdir(parents=True)
    for name in ("run.sh", "path.sh", "conf", "local", "utils"):
        (dst / name).symlink_to(src / name)
    return dst


def test_run_sh_all_asr_stages(tmp_path):
    recipe = linked_recipe(ROOT / "recipes" / "librispeech" / "asr1", tmp_path / "asr1")
    words = tmp_path / "words.txt"   # a small dictionary in place of wamerican-huge's 338k words (decoding time)
    words.write_text("gossip\nbmuf\ndiloco\n")
    args = ["--tasks", "asr", "--num-workers", "3", "--port", str(free_port()), "--asr-dir", str(recipe),
            "--asr-opts", f"--mini-train-utts 40 --mini-eval-utts 8 --word-list {words}",
            "--asr-overrides", "train.max_epochs=1 train.max_steps_per_epoch=4 model.options.hidden=32 "
                               "model.options.layers=1 sync.period=2 sync.warmup_steps=0"]
    proc = run(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    # stage 0-1: the mini corpus in LibriSpeech's layout, its LM text, Kaldi data dirs
    corpus = recipe / "data" / "mini_librispeech"
    assert len(list((corpus / "train-clean-100").glob("*/*/*.flac"))) == 40
    lm_text = (corpus / "librispeech-lm-norm.txt").read_text().splitlines()
    test_text = (recipe / "data" / "test_clean" / "text").read_text().splitlines()
    assert len(test_text) == 8 and not {t.split(" ", 1)[1] for t in test_text} & set(lm_text)
    # stage 4: both runs trained with 3 workers; gossip-BMUF sent less than DDP
    exp = recipe / "exp" / "quickstart"
    ddp = json.loads((exp / "tdnn_ddp-n3" / "results.json").read_text())
    gossip = json.loads((exp / "tdnn_gossip_bmuf-n3" / "results.json").read_text())
    assert ddp["workers"] == gossip["workers"] == 3
    assert 0 < gossip["bytes_sent_per_step_per_worker"] < ddp["bytes_sent_per_step_per_worker"]
    # stage 3: phone units, every training word pronounced by flite's G2P
    units = json.loads((recipe / "data" / "lang_phone" / "units.json").read_text())
    assert units["g2p"] == "flite" and units["train_words"] == units["train_words_by_g2p"] > 0
    assert "lang: data/lang_phone" in (exp / "tdnn_ddp-n3" / "config.yaml").read_text()
    # stage 5-7: the word LM was made of the LM text, its lexicon spelled in phones (no unit LM: beam_lm is
    # not decoded, and a phone model decodes with beam_word alone); every run x test set has a row
    info = json.loads((recipe / "data" / "word_lm3_lang_phone_words.txt" / "info.json").read_text())
    assert info["source"] == "data/mini_librispeech/librispeech-lm-norm.txt" and info["sentences"] == len(lm_text)
    assert info["word_list"] == str(words) and info["word_list_added"] >= 2   # BMUF, DILOCO (GOSSIP is the LM's)
    assert not (exp / "lm_lang_phone").exists()
    table = (exp / "RESULTS.md").read_text()
    assert "%CER" in table.splitlines()[0]
    for run_name in ("tdnn_ddp-n3", "tdnn_gossip_bmuf-n3"):
        for test_set in ("test_clean", "test_other"):
            assert f"| {test_set} | word (beam 400, 6 units a frame) + word LM + words.txt |" in table and f"| {run_name} |" in table
    assert "| greedy |" not in table
    summary = json.loads((exp / "tdnn_ddp-n3" / "decode_test_clean_beam_word_words.txt_avg_best5" / "summary.json").read_text())
    assert (summary["word_lm_weight"], summary["word_score"], summary["tuned_on"]) == (3.0, 1.0, None)   # fixed
    assert "EDMONTON" in lm_text and "THE CAPITAL OF THE PROVINCE OF ALBERTA" in lm_text    # WordNet's words, glosses
    # at a glance: one row per run (its %WER and %CER of each test set, MB/step, vs DDP), first
    head = table.splitlines()[0]
    assert head.startswith("| run | %WER test_clean | %WER test_other | %CER test_clean |") and "vs tdnn_ddp-n3" in head
    assert [line.split(" | ")[0] for line in table.splitlines()[2:4]] == ["| tdnn_ddp-n3", "| tdnn_gossip_bmuf-n3"]
    # then every decode, of the average of the best epochs (one epoch here) the decode stage made by default
    assert len([line for line in table.splitlines()
                if line.startswith("| tdnn_") and "| avg_best5: epochs 1 |" in line]) == 4
    assert table in proc.stdout  # the quick start prints the WER table
    assert (exp / "RESULTS.png").stat().st_size > 0  # and plots the CV loss of each run
    # stages are idempotent: a rerun skips the finished work
    again = run(args)
    assert again.returncode == 0 and "already trained" in again.stderr and "up to date" in again.stdout


def test_run_sh_help_and_unknown_option():
    ok = run(["--help"])
    assert ok.returncode == 0 and "--num-workers" in ok.stdout + ok.stderr
    bad = run(["--num-wrokers", "3"])
    assert bad.returncode == 1 and "--num-wrokers" in bad.stderr
    task = run(["--tasks", "tts"])
    assert task.returncode == 1 and "unknown task 'tts'" in task.stderr


def test_librispeech_recipe_default_is_the_full_mini_recipe(tmp_path):
    """recipes/librispeech/asr1/run.sh without --mini (the full mini recipe), shrunk: espeak-ng speakers read a
    third and fourth copy of the training sentences in train-clean-100 alone, the speed-perturbed copy is trained
    on, with conf/train_tdnn512.yaml (per-speaker mean and variance, a step's frames shared by the workers)."""
    recipe = linked_recipe(ROOT / "recipes" / "librispeech" / "asr1", tmp_path / "asr1")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    shown = subprocess.run(["bash", str(recipe / "run.sh"), "--help"], cwd=recipe, env=env, capture_output=True,
                           text=True, timeout=120).stdout
    assert "--mini <mini> # default: full (full | quick)" in shown
    assert "default: conf/train_tdnn512.yaml" in shown and "# default: single ddp gossip_bmuf" in shown
    proc = subprocess.run(["bash", str(recipe / "run.sh"), "--stop-stage", "4", "--mini-train-utts", "24",
                           "--mini-eval-utts", "8", "--mini-speakers-per-voice", "1", "--mini-train-only-speakers", "2",
                           "--algorithms", "ddp", "--num-workers", "2", "--port", str(free_port()), "--",
                           "train.max_epochs=1", "train.max_steps_per_epoch=3", "model.options.hidden=32",
                           "model.options.layers=1"], cwd=recipe, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    stats = json.loads((recipe / "data" / "mini_librispeech" / "mini_librispeech.json").read_text())["stats"]
    train_voices = stats["subsets"]["train-clean-100"]["voices"]
    assert sum(v.startswith("espeak-") for v in train_voices) == 2 and len(train_voices) == 6
    assert stats["subsets"]["train-clean-100"]["utterances"] == 96                 # 24 sentences x 4 readings
    assert not any(v.startswith("espeak-") for v in stats["subsets"]["test-clean"]["voices"])
    # dev-other: voices heard neither in training nor in test-other, prepared for tuning test_other's decoding on
    dev_other = stats["subsets"]["dev-other"]["voices"]
    assert len(dev_other) == 8 and not set(dev_other) & set(train_voices) and "awb" not in dev_other
    assert (recipe / "data" / "dev_other" / "feats.scp").is_file()
    lm_text = (recipe / "data" / "mini_librispeech" / "librispeech-lm-norm.txt").read_text().splitlines()
    assert "EDMONTON" in lm_text and "THE CAPITAL OF THE PROVINCE OF ALBERTA" in lm_text   # WordNet's words and glosses
    run_dir = recipe / "exp" / "tdnn512_ddp-n2"
    conf = (run_dir / "config.yaml").read_text()
    assert "speaker_cmvn: true" in conf and "frames_per_step: 16000" in conf and "train_clean_100_sp" in conf
    assert (recipe / "data" / "train_clean_100_sp" / "cmvn_spk.ark").is_file()
    res = json.loads((run_dir / "results.json").read_text())
    assert res["workers"] == 2 and res["history"][0]["steps"] == 3
