"""The comparison reports (gossip_accel.bin.compare_runs, asr_report) on synthetic results.json:
an explicit baseline (DDP, else the single run, else none), never a run against itself, and
the plots against epoch, MB sent per worker and training time."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gossip_accel.bin.compare_runs import choose_baseline, curve, epoch_ends, table


def result(name: str, workers: int = 4, sent: float = 1e6, enabled: bool = True, ppl: float = 100.0,
           history: list | None = None, **extra) -> dict:
    steps = 20
    return {"name": name, "algorithm": name.split("-")[0], "workers": workers, "periods": "(16,128)", "epochs": 2,
            "steps_per_worker": steps, "train_seconds": 40.0, "bytes_sent_per_worker": sent * steps,
            "bytes_sent_per_step_per_worker": sent, "final_valid_ppl": ppl, "final_test_ppl": ppl * 0.9,
            "sync": {"enabled": enabled},
            "history": history if history is not None else [
                {"epoch": 1, "step": 10, "valid_ppl_replicas": ppl * 1.5},
                {"epoch": 2, "step": 20, "valid_ppl_replicas": ppl * 1.1}], **extra}


DDP = result("ddp-n4", sent=8e6, enabled=False, ppl=100.0)
SINGLE = result("single-n1", workers=1, sent=0.0, enabled=False, ppl=90.0)
GOSSIP = result("gossip_bmuf-16_128-n4", sent=1e5, ppl=110.0)
TAGGED = result("gossip_bmuf-16_128-n4-eta075", sent=1e5, ppl=95.0)


def cells(lines: list[str], name: str) -> list[str]:
    row = next(line for line in lines if line.startswith(f"| {name} |"))
    return [c.strip() for c in row.strip("|").split("|")]


def header(lines: list[str]) -> list[str]:
    return [c.strip() for c in lines[0].strip("|").split("|")]


def test_ddp_is_the_default_baseline_and_never_compared_with_itself():
    rows = [GOSSIP, DDP, TAGGED]
    base, said = choose_baseline(rows, "ddp")
    assert base is DDP and said == "Baseline: ddp-n4."
    lines = table(rows, base)
    head = header(lines)
    assert "ppl vs ddp-n4" in head and "traffic vs ddp-n4" in head
    ddp = dict(zip(head, cells(lines, "ddp-n4")))
    assert ddp["ppl vs ddp-n4"] == "baseline" and ddp["traffic vs ddp-n4"] == "baseline"
    gossip = dict(zip(head, cells(lines, "gossip_bmuf-16_128-n4")))
    assert gossip["traffic vs ddp-n4"] == "0.013"          # 1e5 / 8e6
    assert gossip["ppl vs ddp-n4"] == "+10.0%"             # test ppl 99 vs 90
    tagged = dict(zip(head, cells(lines, "gossip_bmuf-16_128-n4-eta075")))
    assert tagged["ppl vs ddp-n4"] == "-5.0%"


def test_of_several_ddp_runs_the_untagged_one_is_the_baseline_and_the_others_are_named():
    tagged_ddp = [result("ddp-n4-s2", sent=8e6, enabled=False), result("ddp-n4-keep16", sent=8e6, enabled=False)]
    base, said = choose_baseline([GOSSIP, *tagged_ddp, DDP], "ddp")
    assert base is DDP
    assert said == ("Baseline: ddp-n4 (of 3 ddp runs: ddp-n4-s2, ddp-n4-keep16, ddp-n4; "
                    "--baseline NAME picks another).")
    assert choose_baseline([GOSSIP, *tagged_ddp, DDP], "ddp-n4-s2")[0] is tagged_ddp[0]


def test_without_ddp_the_single_run_is_the_baseline():
    base, said = choose_baseline([GOSSIP, SINGLE], "ddp")
    assert base is SINGLE and "single-n1" in said and "no DDP run" in said
    lines = table([GOSSIP, SINGLE], base)
    head = header(lines)
    assert "ppl vs single-n1" in head
    assert not any(h.startswith("traffic vs") for h in head)   # the single run sends nothing: no ratio to it
    assert dict(zip(head, cells(lines, "single-n1")))["ppl vs single-n1"] == "baseline"


def test_without_a_reference_run_there_is_no_baseline_and_no_vs_column():
    base, said = choose_baseline([GOSSIP, TAGGED], "ddp")
    assert base is None and said.startswith("No baseline")
    lines = table([GOSSIP, TAGGED], None)
    assert not any(" vs " in h for h in header(lines))
    assert len(cells(lines, "gossip_bmuf-16_128-n4")) == len(header(lines))


def test_baseline_by_run_name_or_algorithm():
    rows = [DDP, GOSSIP, TAGGED]
    assert choose_baseline(rows, "gossip_bmuf-16_128-n4-eta075")[0] is TAGGED
    assert choose_baseline(rows, "gossip_bmuf")[0] is GOSSIP           # the first run of that algorithm
    assert choose_baseline(rows, "single")[0] is None
    assert choose_baseline(rows, "none")[0] is None
    assert choose_baseline(rows, "nope")[1] == "No baseline: no run named 'nope' (nor of that algorithm)."


def test_curves_prefer_the_averaged_model_and_put_epochs_on_bytes_and_time():
    avg = result("bmuf-8-n4", sent=2e6, history=[
        {"epoch": 1, "step": 5, "valid_ppl": 150.0, "valid_ppl_replicas": 160.0},
        {"epoch": 2, "step": 20, "valid_ppl": 120.0, "valid_ppl_replicas": 125.0}])
    h, used = curve(avg, "valid_ppl", "valid_ppl_replicas")
    assert used == "valid_ppl" and [e[used] for e in h] == [150.0, 120.0]
    assert curve(GOSSIP, "valid_ppl", "valid_ppl_replicas")[1] == "valid_ppl_replicas"
    mb, secs = epoch_ends(avg, h)
    assert mb == [10.0, 40.0]                   # 2 MB per step x steps 5 and 20
    assert secs == [10.0, 40.0]                 # 40 s for 20 steps, pro rata
    logged = result("x", history=[{"epoch": 1, "step": 10, "train_seconds": 33.0, "valid_ppl_replicas": 1.0}])
    assert epoch_ends(logged, logged["history"])[1] == [33.0]
    # a row's own bytes win over the run's mean rate: a DDP warm-up sends more early than late
    warm = result("pl", sent=2e6, history=[{"epoch": 1, "step": 5, "bytes_sent_per_worker": 30e6, "valid_ppl": 9.0},
                                           {"epoch": 2, "step": 20, "bytes_sent_per_worker": 40e6, "valid_ppl": 8.0}])
    assert epoch_ends(warm, warm["history"])[0] == [30.0, 40.0]


def write_run(root: Path, r: dict, decodes: dict[tuple[str, str], float] = {}, **summary) -> Path:
    d = root / r["name"]
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps(r))
    for (test_set, method), wer in decodes.items():
        out = d / f"decode_{test_set}_{method}"
        out.mkdir()
        (out / "summary.json").write_text(json.dumps({
            "method": method, "data": f"data/{test_set}", "wer": wer, "cer": wer / 2, "errors": int(wer),
            "ref_words": 100, "ins": 1, "del": 1, "sub": int(wer) - 2, **summary}))
    return d


def test_compare_runs_cli_writes_table_json_and_plots(tmp_path):
    runs = [write_run(tmp_path / "exp", r) for r in (GOSSIP, TAGGED)]
    out = tmp_path / "exp" / "compare" / "RESULTS"
    proc = subprocess.run([sys.executable, "-m", "gossip_accel.bin.compare_runs", "--out", str(out), *map(str, runs)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "exp" / "compare" / "RESULTS.md").read_text()
    assert "No baseline: no ddp or single run among the 2 compared." in md and " vs " not in md
    assert "| gossip_bmuf-16_128-n4-eta075 | 4 |" in md
    assert (tmp_path / "exp" / "compare" / "RESULTS.png").stat().st_size > 0
    assert len(json.loads((tmp_path / "exp" / "compare" / "RESULTS.json").read_text())) == 2


def test_asr_report_compares_wer_with_the_baseline_run(tmp_path):
    asr = {"model": "dnn", "history": [{"epoch": 1, "step": 10, "cv_loss_replicas": 2.0}]}
    ddp = write_run(tmp_path, {**result("dnn_ddp-n4", sent=8e6, enabled=False), **asr}, {("test", "greedy"): 20.0})
    gossip = write_run(tmp_path, {**result("dnn_gossip_bmuf-n4"), **asr}, {("test", "greedy"): 22.0})
    out = tmp_path / "RESULTS.md"
    proc = subprocess.run([sys.executable, "-m", "gossip_accel.bin.asr_report", "--out", str(out), str(gossip), str(ddp)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = out.read_text().splitlines()
    assert "%WER vs dnn_ddp-n4" in header(lines)
    assert dict(zip(header(lines), cells(lines, "dnn_gossip_bmuf-n4")))["%WER vs dnn_ddp-n4"] == "+10.0%"
    assert dict(zip(header(lines), cells(lines, "dnn_ddp-n4")))["%WER vs dnn_ddp-n4"] == "baseline"
    assert lines[-1] == "Baseline: dnn_ddp-n4."
    every = lines[next(i for i, line in enumerate(lines) if line.startswith("| run | model |")):]   # a row per decode
    assert dict(zip(header(every), cells(every, "dnn_ddp-n4")))["LM weight / word score (tuned on)"] == "-"   # greedy
    # a word decode names its LM weight and word score, and the dev set they were tuned on
    word = write_run(tmp_path / "w", {**result("dnn_single-n1"), **asr}, {("test_other", "word"): 30.0},
                     word_lm="data/word_lm3", word_lm_weight=3.0, word_score=-1.0, tuned_on="data/dev_other")
    assert subprocess.run([sys.executable, "-m", "gossip_accel.bin.asr_report", "--out", str(out), str(word)]).returncode == 0
    lines = out.read_text().splitlines()
    every = lines[next(i for i, line in enumerate(lines) if line.startswith("| run | model |")):]
    assert dict(zip(header(every), cells(every, "dnn_single-n1")))["LM weight / word score (tuned on)"] == "3 / -1 (dev_other)"
    alone = subprocess.run([sys.executable, "-m", "gossip_accel.bin.asr_report", "--out", str(out), str(gossip)],
                           capture_output=True, text=True)
    assert alone.returncode == 0 and "vs" not in out.read_text().splitlines()[0]


LM_RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "wikitext103" / "lm1"


@pytest.mark.parametrize("bad", ["-x", "x-", "a--b", "a b", "x/y"])
def test_bad_tag_is_refused_by_the_stage_scripts(tmp_path, bad):
    proc = subprocess.run(["bash", str(LM_RECIPE / "run.sh"), "--stage", "4", "--tag", bad, "--exp", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and f"--tag '{bad}'" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_tag_with_dashes_is_accepted_and_its_runs_compared(tmp_path):
    """``--tag lr-3e-3``: the run names <run>-lr-3e-3 sit beside the untagged ones, and the
    comparison stage still takes the untagged DDP run as the baseline."""
    exp = tmp_path / "exp"
    for r in (DDP, result("ddp-n4-lr-3e-3", sent=8e6, enabled=False, ppl=80.0),
              result("gossip_bmuf-16_128-n4-lr-3e-3", sent=1e5, ppl=110.0)):
        write_run(exp, r)
    proc = subprocess.run(["bash", str(LM_RECIPE / "run.sh"), "--stage", "4", "--tag", "lr-3e-3", "--exp", str(exp)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    md = (exp / "compare" / "RESULTS.md").read_text().splitlines()
    lines = md[md.index(next(line for line in md if line.startswith("| run |"))):]   # the table, below the title
    assert "ppl vs ddp-n4" in header(lines)
    assert dict(zip(header(lines), cells(lines, "gossip_bmuf-16_128-n4-lr-3e-3")))["ppl vs ddp-n4"] == "+10.0%"
    assert dict(zip(header(lines), cells(lines, "ddp-n4-lr-3e-3")))["ppl vs ddp-n4"] == "-20.0%"
