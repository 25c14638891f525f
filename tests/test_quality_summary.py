"""bench/quality.py's summary file accumulates over calls (bench/quality_summary.py), on tiny fake runs:
a second --settings call adds its settings instead of overwriting the first call's, a re-run seed replaces
its row, a redefined setting drops its old rows, and a file of the older format keeps its rows."""
from __future__ import annotations

import json

import pytest

from bench.quality_summary import merge, plot_series, seed_row

HEADER = {"date": "2026-12-01 17:00", "corpus": "gutenberg", "epochs": 6, "workers": 4}


def fake(algorithm: str, test_ppl: float, mb: float, quiet: bool = True) -> dict:
    """A results.json of a finished run, with what the summary reads."""
    load = {"quiet": quiet, "other_cores": 0.1 if quiet else 0.9, "before": {"loadavg": [1.0, 1.0, 1.0]},
            "after": {"loadavg": [3.0, 2.0, 1.0]}, "why": []}
    return {"workers": 4, "algorithm": algorithm, "periods": "(16,128)", "sync": {"block_momentum": 0.75},
            "final_valid_ppl": test_ppl - 5, "final_test_ppl": test_ppl, "bytes_sent_per_step_per_worker": mb * 1e6,
            "steps_per_worker": 20, "history": [{"epoch": 1, "step": 10, "valid_ppl": test_ppl + 10},
                                                {"epoch": 2, "step": 20, "valid_ppl": test_ppl}],
            "bench": {"load": load}}


def rows_of(name: str, seed: int, res: dict, definition: tuple = ()) -> dict:
    return seed_row(name, f"what {name}", seed, [f"def {name}", *definition], res)


def by_setting(summary: dict) -> dict:
    return {r["setting"]: r for r in summary["rows"]}


@pytest.fixture
def first() -> dict:
    """``--settings bmuf gossip --seeds 1 2``."""
    runs = [rows_of("bmuf", 1, fake("bmuf", 80, 0.1)), rows_of("bmuf", 2, fake("bmuf", 82, 0.1)),
            rows_of("gossip", 1, fake("gossip_bmuf", 90, 0.05)), rows_of("gossip", 2, fake("gossip_bmuf", 94, 0.05))]
    return json.loads(json.dumps(merge(None, runs, HEADER, "python bench/quality.py --settings bmuf gossip")))


def test_a_second_call_adds_its_settings_and_the_ratios_use_the_whole_file(first):
    out = merge(first, [rows_of("ddp", 1, fake("ddp", 100, 8.0), ), rows_of("ma", 1, fake("ma", 85, 0.1, quiet=False))],
                HEADER, "python bench/quality.py --settings ddp ma")
    rows = by_setting(out)
    assert list(rows) == ["bmuf", "gossip", "ddp", "ma"]
    assert rows["bmuf"]["seeds"] == 2 and rows["bmuf"]["test_ppl"] == 81 and rows["bmuf"]["test_ppl_sd"] == pytest.approx(2 ** 0.5)
    assert rows["bmuf"]["ppl_vs_ddp"] == pytest.approx(0.81)       # the first call's setting against the second's DDP
    assert rows["gossip"]["bytes_vs_ddp"] == pytest.approx(0.05 / 8)
    assert out["commands"] == ["python bench/quality.py --settings bmuf gossip", "python bench/quality.py --settings ddp ma"]
    assert out["seeds"] == [1, 2] and list(out["curves"]) == ["bmuf", "gossip", "ddp", "ma"]
    assert len(out["curves"]["bmuf"]) == 2 and out["curves"]["ddp"] == [[(1, 80e6, 110), (2, 160e6, 100)]]
    assert out["load"] == {"settings": 6, "not_quiet": 1, "max_loadavg_1min": 3.0, "max_other_cores": 0.9}
    assert [s[0] for s in plot_series(out)] == ["bmuf", "gossip", "ddp", "ma"]
    assert plot_series(out)[0][1:] == ("bmuf-(16,128)", first["seed_rows"][0]["curve"], [10, 20])


def test_a_rerun_seed_replaces_its_row_and_a_new_seed_joins(first):
    out = merge(first, [rows_of("bmuf", 2, fake("bmuf", 78, 0.1)), rows_of("bmuf", 3, fake("bmuf", 79, 0.1))],
                HEADER, "python bench/quality.py --settings bmuf --seeds 2 3")
    rows = by_setting(out)
    assert rows["bmuf"]["seeds"] == 3 and rows["bmuf"]["test_ppl"] == pytest.approx((80 + 78 + 79) / 3)
    assert rows["gossip"] == by_setting(first)["gossip"]             # untouched
    assert [(r["setting"], r["seed"]) for r in out["seed_rows"]] == [("bmuf", 1), ("bmuf", 2), ("bmuf", 3),
                                                                      ("gossip", 1), ("gossip", 2)]
    assert out["seeds"] == [1, 2, 3]


def test_a_failed_rerun_replaces_the_seed_and_a_redefined_setting_drops_its_old_rows(first):
    out = merge(first, [rows_of("gossip", 1, {"failed": "exp/gossip-s1/train.log"}, ("train.lr=0.1",))],
                HEADER, "python bench/quality.py --settings gossip -- train.lr=0.1")
    gossip = [r for r in out["rows"] if r["setting"] == "gossip"]
    assert gossip == [{"setting": "gossip", "what": "what gossip", "seeds": 1, "failed": True}]
    assert "gossip" not in out["curves"] and by_setting(out)["bmuf"]["seeds"] == 2
    again = merge(first, [rows_of("gossip", 1, {"failed": "exp/gossip-s1/train.log"})], HEADER, "same definition")
    assert [r["seeds"] for r in again["rows"] if r["setting"] == "gossip"] == [1, 1]   # 1 failed, seed 2 kept


def test_the_rows_of_a_file_of_the_older_format_are_kept_unless_rerun():
    old = {"command": "python bench/quality.py --corpus gutenberg --settings bmuf x --epochs 6", "seeds": [1, 2, 3],
           "rows": [{"setting": "bmuf", "what": "BMUF", "seeds": 3, "test_ppl": 75.0, "algorithm": "bmuf",
                     "periods": "(16,128)"},
                    {"setting": "x", "what": "X", "seeds": 3, "test_ppl": 76.0, "algorithm": "x", "periods": "(1)"}],
           "curves": {"bmuf": [[[1, 1.0, 90.0]]], "x": [[[1, 2.0, 91.0]]]},
           "load": {"settings": 6, "not_quiet": 6, "max_loadavg_1min": 7.8}}
    out = merge(old, [rows_of("x", 1, fake("x", 70, 0.1))], HEADER, "python bench/quality.py --settings x")
    rows = by_setting(out)
    assert rows["bmuf"] == old["rows"][0] and rows["x"]["test_ppl"] == 70 and list(rows) == ["bmuf", "x"]
    assert out["curves"]["bmuf"] == old["curves"]["bmuf"] and len(out["curves"]["x"]) == 1
    assert out["commands"][0] == old["command"] and out["seeds"] == [1, 2, 3]
    assert out["load"] == {"settings": 7, "not_quiet": 6, "max_loadavg_1min": 7.8, "max_other_cores": 0.1}
    assert plot_series(out)[0] == ("bmuf", "bmuf-(16,128)", [[1, 1.0, 90.0]], None)   # an old-format row has no step counts (None)


def test_two_report_only_calls_leave_one_file_with_both_settings(tmp_path):
    """bench/quality.py itself (no training: --report-only reads the runs on disk)."""
    from bench import quality

    for name, res in (("ddp", fake("ddp", 100, 8.0)), ("bmuf", fake("bmuf", 80, 0.1))):
        run = tmp_path / "work" / "gutenberg" / "e6-n4" / f"{name}-s1"
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps(res))
    common = ["--corpus", "gutenberg", "--epochs", "6", "--report-only", "--no-plots",
              "--work", str(tmp_path / "work"), "--out", str(tmp_path / "results")]
    quality.main([*common, "--settings", "ddp"])
    quality.main([*common, "--settings", "bmuf"])
    out = json.loads((tmp_path / "results" / "quality_gutenberg_settings_e6-n4.json").read_text())
    assert [r["setting"] for r in out["rows"]] == ["ddp", "bmuf"] and by_setting(out)["bmuf"]["ppl_vs_ddp"] == 0.8
    table = (tmp_path / "results" / "quality_gutenberg_settings_e6-n4.md").read_text()
    assert "| ddp |" in table and "| bmuf |" in table


def test_a_legacy_row_plots_against_wall_clock_from_its_steps_per_worker():
    # a file written before the per-seed rows: summary rows and curves only
    legacy = {"epochs": 3, "rows": [{"setting": "bmuf", "algorithm": "bmuf", "periods": "(16,128)", "steps_per_worker": 528},
                                    {"setting": "old", "algorithm": "ma", "periods": "(8)"}],
              "curves": {"bmuf": [[[1, 1e6, 200.0], [2, 2e6, 170.0], [3, 3e6, 160.0]]], "old": [[[1, 0.0, 300.0]]]}}
    out = merge(legacy, [], {**HEADER, "epochs": 3}, "python bench/quality.py --report-only")
    assert plot_series(out) == [("bmuf", "bmuf-(16,128)", [[1, 1e6, 200.0], [2, 2e6, 170.0], [3, 3e6, 160.0]], [176, 352, 528]),
                                ("old", "ma-(8)", [[1, 0.0, 300.0]], None)]


def test_relative_work_and_out_dirs_are_resolved_before_the_trainings_change_directory(tmp_path, monkeypatch):
    """The trainings run with the recipe as their working directory: a relative --work must name the
    caller's directory, not one under the recipe (where results.json would never be found)."""
    from bench import quality

    monkeypatch.chdir(tmp_path)
    args = quality.parse_args(["--settings", "ddp", "--work", "exp/q", "--out", "res", "--plots", "img"])
    assert (args.work, args.out, args.plots) == (tmp_path / "exp" / "q", tmp_path / "res", tmp_path / "img")
