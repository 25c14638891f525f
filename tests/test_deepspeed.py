"""DeepSpeed engines in real gloo processes (CPU accelerator) against the simulator.

Two spawns of WORLD processes (tests/scripts/ds_worker.py): ``train`` runs ZeRO-0 fp32, bf16,
fp16 and an fp16 overflow on one rank, the refused combinations, and ZeRO-1/2 inside replica groups,
and saves a DeepSpeed checkpoint; ``resume`` is a new set of processes that loads it and trains
on. One ``accelerate launch`` of 2 processes with the DeepSpeed plugin.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
import ds_worker  # noqa: E402
from harness import assert_matches_oracle, simulate_scenario, spawn_with_timeout  # noqa: E402
from test_launchers import BIN, free_port  # noqa: E402

WORLD = 4  # ZeRO-1 inside replica groups needs 2 groups of 2
ACC_WORLD = 2  # the accelerate launch
STEPS = ds_worker.STEPS
# unit roundoff of the model weights' dtype: |master - weight| <= u * max|master| after a sync
UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
# max |theta - theta_fp32 simulator| of the final parameters after 14 steps, measured (docs/DEEPSPEED.md):
# bf16 3.4e-3, fp16 5.8e-4; the bounds leave a factor of ~4.5
CLOSE_TO_FP32 = {"bf16": 0.015, "fp16": 0.0025}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds")
    for phase in ("train", "resume"):
        spawn_with_timeout(ds_worker.worker, (WORLD, str(out / f"init_{phase}"), str(out), phase), WORLD,
                           timeout=300)
    return {phase: [torch.load(out / f"{phase}{r}.pt", weights_only=True) for r in range(WORLD)]
            for phase in ("train", "resume")}


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a if a[k].is_floating_point())


def params_only(state: dict) -> dict:
    return {k: v for k, v in state.items() if "running" not in k and "num_batches" not in k}


@pytest.mark.parametrize("name", ["fp32", "fp32_accum"])
def test_fp32_zero0_equals_simulator(runs, name):
    """BMUF, and gossip-BMUF under gradient accumulation (sync.step() after every engine.step())."""
    overrides, extra = ds_worker.SCENARIOS[name]
    accum = extra.get("gradient_accumulation_steps", 1)
    sim_before, sim_final = simulate_scenario(overrides, STEPS, world=WORLD, accum=accum)
    for r in range(WORLD):
        got = runs["train"][r][name]
        assert got["allreduce_off"] and got["t"] == STEPS  # optimizer steps, not micro-batches
        assert_matches_oracle(got, sim_before[r], sim_final[r], f"{name} rank {r} ")
    assert max_diff(params_only(runs["train"][0][name]["before"]), params_only(runs["train"][1][name]["before"])) > 1e-3


def test_checkpoint_resume_is_exact(runs):
    for r in range(WORLD):
        resumed, whole = runs["resume"][r], runs["train"][r]["fp32"]
        assert resumed["t_loaded"] == ds_worker.RESUME_AT
        assert resumed["client"]["note"] == "mine"  # the caller's client state comes back
        for key in ("before", "final"):
            for name, v in whole[key].items():
                assert torch.equal(resumed[key][name], v), f"rank {r} {key} {name}"


@pytest.mark.parametrize("kind", ["bf16", "fp16"])
def test_low_precision_syncs_the_fp32_master(runs, kind):
    got = [runs["train"][r][kind] for r in range(WORLD)]
    overrides, _ = ds_worker.SCENARIOS[kind]
    _, sim_final = simulate_scenario(overrides, STEPS, world=WORLD)
    for r, g in enumerate(got):
        assert g["optimizer"] == "FP16_UnfusedOptimizer" and g["masters_fp32"] and g["allreduce_off"]
        assert g["skipped"] == 0 and all(g["applied"])
        # every sync rewrote the model weights from the synchronized masters
        assert len(g["master_gap"]) == STEPS // 4 and max(g["master_gap"]) <= UNIT_ROUNDOFF[kind]
        # and the final average too, on the masters and on the weights
        for name, m in g["final_master"].items():
            w = g["final"][name].float()
            assert float((m - w).abs().max()) <= UNIT_ROUNDOFF[kind] * float(m.abs().max()), name
        assert max_diff(params_only(g["final"]), params_only(sim_final[r])) < CLOSE_TO_FP32[kind]
    assert max_diff(params_only(got[0]["before"]), params_only(got[1]["before"])) > 1e-3  # replicas diverged
    for name, m in got[0]["final_master"].items():
        assert torch.equal(m, got[1]["final_master"][name]), name
    assert max_diff(params_only(got[0]["final"]), params_only(got[1]["final"])) == 0.0


def test_fp16_overflow_on_one_rank_skips_everywhere(runs):
    got = [runs["train"][r]["fp16_overflow"] for r in range(WORLD)]
    i = ds_worker.OVERFLOW_STEP - 1
    for g in got:
        assert g["skipped"] == 1 and g["applied"][i] is False and all(a for j, a in enumerate(g["applied"]) if j != i)
        assert g["scale"][i] == g["scale"][i - 1] / 2  # dynamic loss scale halved on the overflow
        assert max(g["scale"]) > g["scale"][0]  # and it really is dynamic (grows after a clean window)
    assert got[0]["scale"] == got[1]["scale"]
    for name, m in got[0]["final_master"].items():
        assert torch.equal(m, got[1]["final_master"][name]), name


def simulate_groups(steps: int) -> tuple[list[dict], list[dict]]:
    """The oracle of ``zero_groups``: HierarchicalCluster (gradients averaged inside each group, BMUF
    between the groups), each rank its own torch SGD."""
    from harness import DATA_SEED, initial_model, make_optimizer, model_state

    from gossip_accel.sync import toy
    from gossip_accel.sync.simulate import HierarchicalCluster

    models = [initial_model(k) for k in range(WORLD)]
    cluster = HierarchicalCluster(models, ds_worker.GROUPS_CONFIG, ds_worker.GROUPS_OVERRIDES,
                                  group_size=ds_worker.GROUP_SIZE)
    opts = [make_optimizer(m) for m in models]
    for t in range(1, steps + 1):
        for k, (model, opt) in enumerate(zip(models, opts)):
            opt.zero_grad(set_to_none=True)
            ids, y = toy.batch(DATA_SEED, k, t)
            torch.nn.functional.mse_loss(model(ids), y).backward()
        cluster.allreduce_gradients()
        for opt in opts:
            opt.step()
        cluster.step()
    before = [model_state(m) for m in models]
    cluster.finalize()
    return before, [model_state(m) for m in models]


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_inside_replica_groups_equals_hierarchical_simulator(runs, stage):
    got = [runs["train"][r][f"zero{stage}_groups"] for r in range(WORLD)]
    sim_before, sim_final = simulate_groups(STEPS)
    for r, g in enumerate(got):
        # DeepSpeed's data-parallel group is the group; the synchronizer's world is the groups
        assert g["dp_world_size"] == ds_worker.GROUP_SIZE and g["sync_world"] == WORLD // ds_worker.GROUP_SIZE
        assert g["allreduce_on"]  # ZeRO keeps reducing gradients inside the group
        assert_matches_oracle(g, sim_before[r], sim_final[r], f"rank {r} ")
    before = [params_only(g["before"]) for g in got]
    assert max_diff(before[0], before[1]) == 0.0 and max_diff(before[2], before[3]) == 0.0  # a group is one replica
    assert max_diff(before[0], before[2]) > 1e-3  # the groups differ until the final average


def test_refused_combinations_say_what_works(runs):
    msgs = runs["train"][0]["refused"]
    assert "stage=1" in msgs["zero1"] and "stage=0" in msgs["zero1"] and "replica group" in msgs["zero1"]
    assert "adpsgd_fixed" in msgs["fp16_async"] and "synchronous algorithm" in msgs["fp16_async"]
    assert "sync.hierarchy.group_size=null" in msgs["hierarchy"]


def test_load_checkpoint_without_latest_names_the_file(tmp_path):
    from gossip_accel.sync.integrations.deepspeed import load_checkpoint

    with pytest.raises(FileNotFoundError, match="latest"):
        load_checkpoint(None, None, str(tmp_path))


ACC_YAML = """compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  deepspeed_config_file: {ds_json}
  deepspeed_multinode_launcher: standard
num_machines: 1
num_processes: {world}
machine_rank: 0
rdzv_backend: static
same_network: true
use_cpu: false
"""


def test_accelerate_deepspeed_plugin_equals_simulator(tmp_path):
    import json

    ds_json = tmp_path / "ds.json"
    ds_json.write_text(json.dumps(ds_worker.ds_config({})))
    acc_yaml = tmp_path / "acc.yaml"
    acc_yaml.write_text(ACC_YAML.format(ds_json=ds_json, world=ACC_WORLD))
    overrides, _ = ds_worker.SCENARIOS["fp32"]
    cmd = [str(BIN / "accelerate"), "launch", "--config_file", str(acc_yaml), "--main_process_port", str(free_port()),
           str(Path(__file__).parent / "scripts" / "ds_accelerate.py"), str(tmp_path), "--steps", str(STEPS),
           *overrides]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    sim_before, sim_final = simulate_scenario(overrides, STEPS, world=ACC_WORLD)
    for r in range(ACC_WORLD):
        got = torch.load(tmp_path / f"rank{r}.pt", weights_only=True)
        assert got["world_size"] == ACC_WORLD and got["t"] == STEPS
        assert got["engine"] == "DeepSpeedEngine" and got["kind"] == "DeepSpeedSynchronizer" and got["allreduce_off"]
        assert_matches_oracle(got, sim_before[r], sim_final[r], f"rank {r} ")
