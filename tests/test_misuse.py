"""Ranks that disagree and a training loop that misuses the synchronizer get a clear error or warning.

The distributed scenarios run in 4 real gloo processes (one spawn for all of them): ranks with
different sync settings or parameter shapes, two synchronizers on one model (also through DDP),
step() after finalize(), step() twice per optimizer step, Accelerate seeing 1 process while
torch.distributed has 4, a resume whose restored weights the initial broadcast overwrote, a
resume on ranks that loaded different steps, and a rank that never builds its synchronizer.
docs/RELIABILITY.md ("Misuse and disagreeing ranks") lists them.
"""
from __future__ import annotations

import copy
import json
import os
import re
import time
import types
import warnings

import pytest
import torch
import torch.distributed as dist

from harness import spawn_with_timeout
from gossip_accel import Synchronizer, shutdown
from gossip_accel.sync import toy
from gossip_accel.sync.agreement import AgreementError, disagreement
from gossip_accel.sync.config import ConfigError
from gossip_accel.sync.synchronizer import SyncedOptimizer
from gossip_accel.sync.usage import UsageError, UsageWarning

WORLD = 4
BASE = {"components": toy.TOY_COMPONENTS, "period": 4, "algorithm": "bmuf"}
AGREEMENT_TIMEOUT_S = 3.0


def _error(fn) -> str:
    """The one-line message of the ConfigError / UsageError / RuntimeError ``fn`` raises ('' if none)."""
    try:
        fn()
    except (ConfigError, UsageError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return ""


def _warnings(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if issubclass(w.category, UsageWarning)]


def _train(model, opt, sync, steps, rank, start=1) -> None:
    for t in range(start, start + steps):
        toy.train_step(model, opt, 7, rank, t)
        sync.step()


def _params(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _disagreeing_ranks(rank: int) -> dict:
    out = {}
    period = 8 if rank == 0 else 16
    out["period"] = _error(lambda: Synchronizer(toy.ToyModel(0), BASE, [f"sync.period={period}"]))
    out["seed"] = _error(lambda: Synchronizer(toy.ToyModel(0), BASE, [f"sync.seed={rank}"]))
    wide = torch.nn.Sequential(torch.nn.Linear(5 if rank == 0 else 4, 3))
    out["shape"] = _error(lambda: Synchronizer(wide, {"algorithm": "ma"}))
    return out


def _two_synchronizers(rank: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gossip_accel.sync.integrations.accelerate import AccelerateSynchronizer

    out = {}
    model = toy.ToyModel(rank)
    first = Synchronizer(model, BASE)
    out["second_live"] = _error(lambda: Synchronizer(model, BASE))
    first.finalize()
    out["after_finalize_ok"] = _error(lambda: Synchronizer(model, BASE).finalize())
    # through DDP (torch allows one comm hook): a stand-in Accelerator that sees the 4 processes
    ddp = DDP(toy.ToyModel(rank))
    acc = types.SimpleNamespace(num_processes=dist.get_world_size(), unwrap_model=lambda m: m.module,
                                sync_gradients=True, _optimizers=[])
    first = AccelerateSynchronizer(acc, ddp, BASE)
    out["ddp_second_live"] = _error(lambda: AccelerateSynchronizer(acc, ddp, BASE))
    first.finalize()
    out["ddp_after_finalize_ok"] = _error(lambda: AccelerateSynchronizer(acc, ddp, BASE).finalize())
    hooked = DDP(toy.ToyModel(rank))
    hooked.register_comm_hook(None, lambda state, bucket: torch.futures.Future())
    out["ddp_user_hook"] = _error(lambda: AccelerateSynchronizer(acc, hooked, BASE))
    return out


def _step_misuse(rank: int) -> dict:
    out = {}
    model = toy.ToyModel(rank)
    sync = Synchronizer(model, BASE)
    sync.finalize()
    out["step_after_finalize"] = _error(sync.step)

    model = toy.ToyModel(rank)
    sync = Synchronizer(model, BASE)
    opt = SyncedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), sync)

    def twice():
        for t in range(1, 4):
            toy.train_step(model, opt, 7, rank, t)  # opt.step() runs sync.step() ...
            sync.step()                             # ... and the loop calls it again
    out["twice"] = _warnings(twice)
    out["twice_t"] = sync.t
    sync.finalize()

    model = toy.ToyModel(rank)
    sync = Synchronizer(model, BASE)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sync.watch(opt)

    def before():
        for t in range(1, 5):
            sync.step()                             # before opt.step(): the first call has no step behind it
            toy.train_step(model, opt, 7, rank, t)
    out["before"] = _warnings(before)
    sync.finalize()

    model = toy.ToyModel(rank)
    sync = Synchronizer(model, BASE)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sync.watch(opt)
    out["once_per_step"] = _warnings(lambda: _train(model, opt, sync, 6, rank))
    sync.finalize()
    return out


def _accelerate_alone(rank: int) -> dict:
    from accelerate import Accelerator

    from gossip_accel.sync.integrations.accelerate import AccelerateSynchronizer

    accelerator = Accelerator()  # no launcher environment: Accelerate believes it is alone
    model = accelerator.prepare(toy.ToyModel(rank))
    return {"accelerate_alone": _error(lambda: AccelerateSynchronizer(accelerator, model, BASE)),
            "accelerate_processes": accelerator.num_processes}


def _resume(rank: int, tmp: str) -> dict:
    """Train 6 steps, save; resume three ways; 10 steps in all, against the uninterrupted run."""
    out = {}
    model = toy.ToyModel(rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    sync = Synchronizer(model, BASE)
    _train(model, opt, sync, 6, rank)
    checkpoint = copy.deepcopy({"model": _params(model), "opt": opt.state_dict(), "sync": sync.state_dict()})
    _train(model, opt, sync, 4, rank, start=7)
    sync.finalize()
    reference = _params(model)

    def resumed(order: str, overrides=()):
        saved = copy.deepcopy(checkpoint)  # opt.load_state_dict keeps the momentum tensors it is given
        model = toy.ToyModel(rank + 100)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
        if order == "load_first":
            model.load_state_dict(saved["model"])
        sync = Synchronizer(model, BASE, list(overrides))
        if order == "build_first":
            model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        caught = _warnings(lambda: sync.load_state_dict(saved["sync"]))
        _train(model, opt, sync, 4, rank, start=7)
        sync.finalize()
        final = _params(model)
        return caught, max(float((final[k] - reference[k]).abs().max()) for k in reference)

    out["load_first"] = resumed("load_first")
    out["load_first_no_broadcast"] = resumed("load_first", ["sync.broadcast_initial=false"])
    out["build_first"] = resumed("build_first")

    model = toy.ToyModel(rank)
    sync = Synchronizer(model, BASE)
    state = dict(checkpoint["sync"], t=checkpoint["sync"]["t"] + (1 if rank == 3 else 0))
    out["other_step"] = _error(lambda: sync.load_state_dict(state))
    sync.close()
    return out


def _rank_missing(rank: int) -> dict:
    """Rank 3 never builds its synchronizer: the others time out within sync.agreement_timeout."""
    if rank == 3:
        time.sleep(AGREEMENT_TIMEOUT_S + 2)
        dist.all_gather([torch.empty(32, dtype=torch.uint8) for _ in range(WORLD)], torch.zeros(32, dtype=torch.uint8))
        return {}
    start = time.monotonic()
    msg = _error(lambda: Synchronizer(toy.ToyModel(0), BASE, [f"sync.agreement_timeout={AGREEMENT_TIMEOUT_S}"]))
    return {"missing": msg, "missing_waited": time.monotonic() - start}


def _worker(rank: int, world: int, init_file: str, outdir: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    out: dict = {}
    for part in (_disagreeing_ranks, _two_synchronizers, _step_misuse, _accelerate_alone):
        out.update(part(rank))
        dist.barrier()
    out.update(_resume(rank, outdir))
    dist.barrier()
    out.update(_rank_missing(rank))
    dist.barrier()
    with open(os.path.join(outdir, f"misuse{rank}.json"), "w") as f:
        json.dump(out, f)
    shutdown()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    outdir = tmp_path_factory.mktemp("misuse")
    spawn_with_timeout(_worker, (WORLD, str(outdir / "gloo_init"), str(outdir)), WORLD, timeout=600)
    return [json.loads((outdir / f"misuse{r}.json").read_text()) for r in range(WORLD)]


def _same_one_line_everywhere(results, key) -> str:
    msgs = [r[key] for r in results]
    assert msgs[0] and all(m == msgs[0] for m in msgs), msgs
    assert "\n" not in msgs[0]
    return msgs[0]


def test_ranks_with_different_sync_settings_get_one_error_naming_key_and_ranks(results):
    msg = _same_one_line_everywhere(results, "period")
    assert msg.startswith("AgreementError: ranks disagree on sync.period")
    assert "rank 0 has 8; ranks 1-3 have 16" in msg
    msg = _same_one_line_everywhere(results, "seed")
    assert "ranks disagree on sync.seed" in msg and "rank 0 has 0; rank 1 has 1; rank 2 has 2; rank 3 has 3" in msg


def test_parameter_shapes_differing_across_ranks_are_named_not_a_gloo_abort(results):
    msg = _same_one_line_everywhere(results, "shape")
    assert "ranks disagree on param[0.weight]" in msg
    assert "rank 0 has (3, 5) float32; ranks 1-3 have (3, 4) float32" in msg
    assert "component[all]" in msg  # named among the other differences


def test_two_synchronizers_on_one_model(results):
    for r in results:
        assert r["second_live"].startswith("UsageError: this model already has a live Synchronizer"), r["second_live"]
        assert r["after_finalize_ok"] == ""  # a finalized one releases the model
        assert r["ddp_second_live"].startswith("UsageError: this model already has a live AccelerateSynchronizer")
        assert r["ddp_after_finalize_ok"] == ""  # the no-op hook of the first one is kept, not registered twice
        assert "already has a communication hook" in r["ddp_user_hook"]
        assert "can only be called once" not in r["ddp_user_hook"]


def test_step_after_finalize_is_refused(results):
    for r in results:
        assert r["step_after_finalize"].startswith("UsageError: Synchronizer.step() after finalize()")


def test_step_twice_per_optimizer_step_or_before_it_warns_once(results):
    for r in results:
        assert len(r["twice"]) == 1 and "called twice per optimizer step" in r["twice"][0], r["twice"]
        assert r["twice_t"] == 6  # still counted: every rank's counter drives the same collectives
        assert len(r["before"]) == 1 and "step() number 1 came with no SGD step" in r["before"][0]
        assert r["once_per_step"] == []


def test_accelerate_alone_while_torch_distributed_has_4_processes(results):
    for r in results:
        assert r["accelerate_processes"] == 1
        msg = r["accelerate_alone"]
        assert msg.startswith("ConfigError: Accelerate runs 1 process(es)") and "torch.distributed has 4" in msg
        assert "Accelerator(cpu=True)" in msg


def test_restored_model_overwritten_by_the_initial_broadcast_warns_and_the_resume_paths_are_exact(results):
    for rank, r in enumerate(results):
        caught, diff = r["load_first"]
        assert len(caught) == 1 and "holds the weights of the initial broadcast" in caught[0]
        assert "sync.broadcast_initial=false" in caught[0]
        if rank:
            assert diff > 1e-3  # rank 0's replica replaced the others': the run resumed to another result
        for path in ("load_first_no_broadcast", "build_first"):
            caught, diff = r[path]
            assert caught == [] and diff == 0.0, (path, rank, diff)


def test_ranks_resuming_at_different_steps_are_refused(results):
    msg = _same_one_line_everywhere(results, "other_step")
    assert "ranks disagree on state.t" in msg and "ranks 0-2 have 6; rank 3 has 7" in msg


def test_a_rank_that_never_builds_its_synchronizer_is_a_timeout_not_a_hang(results):
    for r in results[:3]:
        msg = r["missing"]
        assert re.match(r"CollectiveTimeout: agreement of 'sync config and model layout' timed out on rank \d "
                        r"after 3 s, waiting for ranks", msg), msg
        assert "sync.agreement_timeout" in msg
        assert r["missing_waited"] < 60


# -- single process ------------------------------------------------------------------------------
def test_disagreement_message_orders_cause_before_effect():
    views = [{"sync.period": "8", "component[all]": "period 8"}, {"sync.period": "16", "component[all]": "period 16"}]
    msg = disagreement(views, [0, 1], "x")
    assert msg.startswith("ranks disagree on sync.period (x): rank 0 has 8; rank 1 has 16 (1 more differ: component[all])")
    assert disagreement([{"a": "1"}, {"a": "1"}], [0, 1], "x") is None
    assert "rank 1 has no such entry" in disagreement([{"a": "1"}, {}], [0, 1], "x")


def test_single_process_misuse():
    model = toy.ToyModel(0)
    with pytest.warns(UserWarning):
        sync = Synchronizer(model, BASE)
    with pytest.raises(UsageError, match="already has a live Synchronizer"):
        Synchronizer(model, BASE)
    sync.finalize()
    with pytest.raises(UsageError, match=r"step\(\) after finalize\(\)"):
        sync.step()
    del sync
    with pytest.warns(UserWarning):
        Synchronizer(model, BASE)  # an unreferenced (collected) one does not hold the model


def test_agreement_error_is_a_config_error():
    assert issubclass(AgreementError, ConfigError)
