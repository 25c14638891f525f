"""Checkpoint averaging (gossip_accel.train.average_checkpoints, bin/average_checkpoints): the exact
mean of model states (integer buffers kept, not averaged), the last-N and best-N-by-CV-loss
selections, epoch models saved by the run or, for older runs, the epoch-end checkpoints' replicas
averaged over ranks first; the command line and its one-line errors."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from gossip_accel.bin import average_checkpoints
from gossip_accel.train import average_checkpoints as avg
from gossip_accel.train import checkpoint as ckpt


def state(seed: int, tracked: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g, dtype=torch.float64),
            "half": torch.randn(5, generator=g).to(torch.bfloat16),
            "bn.num_batches_tracked": torch.tensor(tracked, dtype=torch.int64)}


def exact_mean(states: list[dict], key: str) -> torch.Tensor:
    return torch.stack([s[key].double() for s in states]).mean(0).to(states[0][key].dtype)


def test_mean_state_is_the_exact_mean_and_keeps_integer_buffers():
    states = [state(i, tracked=10 * (i + 1)) for i in range(3)]
    mean = ckpt.mean_state(states, integers_from=-1)
    for k in ("w", "b", "half"):
        assert mean[k].dtype == states[0][k].dtype
        assert torch.equal(mean[k], exact_mean(states, k)), k
    # a count is not a weight: the newest state's (30), not a mean (20)
    assert mean["bn.num_batches_tracked"].dtype == torch.int64 and int(mean["bn.num_batches_tracked"]) == 30
    assert int(ckpt.mean_state(states)["bn.num_batches_tracked"]) == 10          # default: the first's
    assert torch.equal(ckpt.mean_state(states[:1])["w"], states[0]["w"])         # one state: itself
    mean["w"] += 1                                                                # a new tensor, inputs untouched
    assert torch.equal(states[0]["w"], state(0)["w"])


def test_mean_state_of_equal_states_is_that_state_in_new_tensors():
    """mean_tree's rule: identical weights come out bit for bit (a float64 sum of 3 copies / 3 is not)."""
    wide = torch.randn(1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    states = [{**state(0), "b": wide.clone()} for _ in range(3)]
    mean = ckpt.mean_state(states)
    for k, v in mean.items():
        assert torch.equal(v, states[0][k]) and v.dtype == states[0][k].dtype, k
        assert all(v.data_ptr() != s[k].data_ptr() for s in states), k  # copies: the inputs stay untouched


def test_mean_state_refuses_another_model_naming_the_file():
    a, b = state(0), state(1)
    b["extra"] = torch.zeros(1)
    with pytest.raises(ckpt.CheckpointError, match="e2.pt holds another model than e1.pt"):
        ckpt.mean_state([a, b], names=["e1.pt", "e2.pt"])
    c = state(2)
    c["w"] = torch.zeros(4, 3)
    with pytest.raises(ckpt.CheckpointError, match=r"shape of w: \(4, 3\) vs \(3, 4\)"):
        ckpt.mean_state([a, c], names=["e1.pt", "e3.pt"])


def test_select_last_and_best_by_cv_loss():
    epochs = [1, 2, 3, 4, 5, 6]
    losses = {1: 5.0, 2: 3.0, 3: 2.5, 4: 2.0, 5: 2.2, 6: 2.0}
    assert avg.select_epochs(epochs, 3, "last") == [4, 5, 6]
    assert avg.select_epochs(epochs, 3, "best", losses) == [4, 5, 6]          # 2.0, 2.0 (tie), 2.2
    assert avg.select_epochs(epochs, 2, "best", {**losses, 5: 1.0}) == [5, 6]  # tie 4/6: the later
    assert avg.select_epochs(epochs, 10, "last") == epochs                     # fewer exist: all of them
    assert avg.select_epochs([2, 3], 5, "best", losses) == [2, 3]              # only epochs with a model
    assert avg.checkpoint_name(5, "best") == "avg_best5" and avg.checkpoint_name(0, "last") == "final"
    with pytest.raises(ValueError, match="--avg-mode"):
        avg.select_epochs(epochs, 2, "worst", losses)
    with pytest.raises(ValueError, match="final model"):
        avg.select_epochs(epochs, 0, "best", losses)


def write_results(exp: Path, losses: dict[int, float]) -> None:
    exp.mkdir(parents=True, exist_ok=True)
    history = [{"epoch": e, "cv_loss": v, "cv_loss_replicas": v + 1} for e, v in losses.items()]
    (exp / "results.json").write_text(json.dumps({"history": history}))


def test_average_run_of_epoch_models(tmp_path):
    exp = tmp_path / "run"
    losses = {1: 4.0, 2: 2.0, 3: 3.0, 4: 1.5}
    write_results(exp, losses)
    models = {e: state(e, tracked=e) for e in losses}
    for e, s in models.items():
        ckpt.atomic_save(s, avg.epoch_model_path(exp, e))
    out, rec = avg.average_run(exp, 2, "best")
    assert out == exp / "avg_best2.pt" and rec["epochs"] == [2, 4] and rec["cv_loss"] == {"2": 2.0, "4": 1.5}
    got = torch.load(out, weights_only=True)
    assert torch.equal(got["w"], exact_mean([models[2], models[4]], "w"))
    assert int(got["bn.num_batches_tracked"]) == 4                                 # the newest epoch's count
    assert json.loads((exp / "avg_best2.json").read_text())["epochs"] == [2, 4]
    out, rec = avg.average_run(exp, 3, "last")
    assert out.name == "avg_last3.pt" and rec["epochs"] == [2, 3, 4]
    assert torch.equal(torch.load(out, weights_only=True)["b"], exact_mean([models[e] for e in (2, 3, 4)], "b"))


def test_without_epoch_models_the_epoch_end_checkpoints_are_averaged_over_ranks_first(tmp_path):
    """A run trained before epoch models: each kept epoch's replicas (one file per rank, different
    under gossip) -> their mean, the globally averaged model; then the mean over epochs."""
    exp = tmp_path / "old_run"
    write_results(exp, {1: 3.0, 2: 2.0, 3: 1.0})
    replicas = {e: [state(10 * e + r) for r in range(3)] for e in (2, 3)}           # epoch 1 was pruned
    for e, states in replicas.items():
        where = ckpt.checkpoint_dir(exp / "checkpoints", e, 10 * e, epoch_end=True)
        for r, s in enumerate(states):
            ckpt.atomic_save({"model": s, "world_size": 3}, where / f"rank{r}.pt", checksum=True)
        ckpt.mark_done(where, e, 10 * e, 3, epoch_end=True)
    mid = ckpt.checkpoint_dir(exp / "checkpoints", 3, 25, epoch_end=False)          # a mid-epoch one: not an epoch model
    ckpt.atomic_save({"model": state(99), "world_size": 3}, mid / "rank0.pt", checksum=True)
    ckpt.mark_done(mid, 3, 25, 3, epoch_end=False)
    assert list(avg.available_epochs(exp)) == [2, 3]
    (exp / "checkpoints" / "epoch2" / "rank2.pt").rename(exp / "rank2.pt")     # another node's file: not here
    assert list(avg.available_epochs(exp)) == [3]                             # not a global average: left out
    (exp / "rank2.pt").rename(exp / "checkpoints" / "epoch2" / "rank2.pt")
    out, rec = avg.average_run(exp, 5, "best")
    assert rec["epochs"] == [2, 3] and rec["epochs_with_a_model"] == [2, 3]
    per_epoch = [{k: exact_mean(replicas[e], k) for k in ("w",)} for e in (2, 3)]
    assert torch.equal(torch.load(out, weights_only=True)["w"], exact_mean(per_epoch, "w"))
    # an epoch model, where there is one, is preferred to the checkpoint
    ckpt.atomic_save(state(7), avg.epoch_model_path(exp, 3))
    assert "epoch_models" in avg.available_epochs(exp)[3][0]


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """(exit status, stdout, error message) of the command line, run in this process."""
    try:
        average_checkpoints.main(list(args))
        code, err = 0, ""
    except SystemExit as e:
        code, err = 1, str(e.code)
    return code, capsys.readouterr().out, err


def test_cli_writes_the_average_and_names_what_is_missing(tmp_path, capsys):
    exp = tmp_path / "run"
    write_results(exp, {1: 2.0, 2: 1.0})
    code, _, err = cli(capsys, "--exp-dir", str(exp), "--avg", "2")
    assert code == 1 and "\n" not in err and err.startswith("average_checkpoints: ")
    assert "no epoch models" in err and "--avg 0" in err
    for e in (1, 2):
        ckpt.atomic_save(state(e), avg.epoch_model_path(exp, e))
    code, out, err = cli(capsys, "--exp-dir", str(exp), "--avg", "3", "--avg-mode", "best")
    assert code == 0, err
    assert "avg_best3.pt: mean of epochs 1 2 (only 2 of 3 exist), CV loss 2.0000, 1.0000" in out
    (exp / "results.json").unlink()
    code, _, err = cli(capsys, "--exp-dir", str(exp), "--avg", "2", "--avg-mode", "best")
    assert code == 1 and "results.json not found" in err
    assert cli(capsys, "--exp-dir", str(exp), "--avg", "2", "--avg-mode", "last")[0] == 0   # last needs no CV loss


def test_an_lm_run_is_averaged_and_ranked_by_its_valid_perplexity(tmp_path):
    """The LM trainer's history holds valid_ppl, not cv_loss: best-N ranks by ln ppl, last-N works too."""
    exp = tmp_path / "lm"
    exp.mkdir()
    ppl = {1: 90.0, 2: 70.0, 3: 75.0}
    (exp / "results.json").write_text(json.dumps({"history": [{"epoch": e, "valid_ppl": p} for e, p in ppl.items()]}))
    models = {e: state(e, tracked=e) for e in ppl}
    for e, s in models.items():
        ckpt.atomic_save(s, avg.epoch_model_path(exp, e))
    out, rec = avg.average_run(exp, 2, "best")
    assert rec["epochs"] == [2, 3] and rec["cv_loss"] == {"2": math.log(70.0), "3": math.log(75.0)}
    assert avg.average_run(exp, 2, "last")[1]["epochs"] == [2, 3]
