"""Every setting of bench/sync_traffic.py (and so of bench/cluster_bench.py) is a valid SyncConfig.

Builds and validates each setting's config on the bench's own bases without running it (the bench
itself takes minutes): a setting the config refuses would stop the bench only when it reaches it.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bench import sync_traffic
from bench.cluster import runs
from bench.cluster.workloads import Synthetic
from gossip_accel.sync import registry
from gossip_accel.sync.config import load_sync_config

LM_BASE = OmegaConf.to_container(sync_traffic.load_conf().sync)  # the quick-start conf: mini.yaml + (16,128)


@pytest.mark.parametrize("name", list(sync_traffic.SETTINGS))
def test_sync_traffic_setting_is_valid_and_warms_up_where_it_can(name):
    overrides = sync_traffic.SETTINGS[name]
    cfg = load_sync_config(LM_BASE, overrides)
    # the quick start's warm-up and bf16 wire are kept wherever the algorithm defines them, and off elsewhere
    spec = registry.get(cfg.algorithm)
    assert LM_BASE["warmup_steps"] > 0 and cfg.warmup_steps == (LM_BASE["warmup_steps"] if spec.warmup else 0)
    if not spec.low_precision_wire:
        assert cfg.exchange_dtype == "float32"
    elif "exchange_dtype=" not in " ".join(overrides):
        assert cfg.exchange_dtype == LM_BASE["exchange_dtype"] == "bfloat16"
    assert name.startswith(cfg.algorithm + "-")


@pytest.mark.parametrize("name", list(runs.SETTINGS))
def test_cluster_bench_setting_is_valid_on_both_workloads(name):
    synthetic = Synthetic(n_params=1000, batch=2, width=4, depth=1).sync_base()
    for base in (LM_BASE, synthetic):
        cfg = load_sync_config(base, ["broadcast_initial=false", *runs.SETTINGS[name]])  # as runs.SettingRun
        assert name.startswith(cfg.algorithm + "-")


SCRIPTS = sorted(p for p in (Path(__file__).resolve().parent.parent / "bench").glob("*.py")
                 if re.search(r"^def main\(", p.read_text(), re.M))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_bench_script_with_a_main_runs_it_as_a_script(script):
    # a lost `if __name__ == "__main__": main()` makes `python bench/x.py ...` exit 0 having done nothing
    guard = script.read_text().partition('\nif __name__ == "__main__":\n')[2]
    assert re.search(r"\bmain\(", "\n".join(guard.splitlines()[:3])), \
        f"{script.name} defines main() but never calls it as a script"


def test_quality_help_prints_its_usage():
    out = subprocess.run([sys.executable, "bench/quality.py", "--help"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent, check=True).stdout
    assert out.startswith("usage: quality.py")
