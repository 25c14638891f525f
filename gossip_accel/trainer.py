"""What every training entry point shares: Accelerate set-up, the synchronizer (or the DDP
baseline with its byte counter), per-epoch per-rank checkpoints with exact resume, and the
traffic summary.

    run = DistributedRun(model, optimizer, sync_cfg, exp_dir)
    start_epoch, extra = run.resume()          # newest complete checkpoint, if any
    for epoch in range(start_epoch, epochs + 1):
        for batch in ...:
            loss = run.model(...); run.accelerator.backward(loss); run.optimizer.step(); run.after_step()
        run.save(epoch, extra={...})
    run.finish()                               # final average (Algorithm 1, line 20)
    traffic = run.traffic()                    # bytes per worker, mean over workers
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from . import checkpoint as ckpt
from .comm import Counter
from .config import ConfigError, SyncConfig, apply_overrides


def load_structured(schema: Any, paths: list[str], overrides: list[str]) -> Any:
    """YAML files (merged in order) + dotlist overrides onto a dataclass schema.

    Unknown keys and wrong types are errors that name the file and the key.
    """
    conf = OmegaConf.structured(schema)
    for path in paths:
        try:
            conf = OmegaConf.merge(conf, OmegaConf.load(path))
        except FileNotFoundError as e:
            raise ConfigError(f"config file not found: {path}") from e
        except (OmegaConfBaseException, TypeError, ValueError) as e:
            raise ConfigError(f"bad config {path}: {e}") from e
    return apply_overrides(conf, overrides)


OPTIMIZERS = ("adagrad", "adam", "adamw", "ngsgd", "sgd")


def make_optimizer(name: str, model, lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """The optimizer ``train.optimizer`` names, for ``model`` (an ``nn.Module``; the torch
    optimizers also take an iterable of parameters). ``ngsgd`` is Kaldi's NG-SGD
    (gossip_accel.optim.NGSGD) on the model's ``nn.Linear`` layers, plain SGD elsewhere."""
    if name not in OPTIMIZERS:
        raise ConfigError(f"train.optimizer={name!r}; choose one of {', '.join(OPTIMIZERS)}")
    if name == "ngsgd":
        from .optim import NGSGD

        if not isinstance(model, torch.nn.Module):
            raise ConfigError("train.optimizer=ngsgd needs the model (its nn.Linear layers), not a parameter list")
        return NGSGD(model, lr=lr, weight_decay=weight_decay)
    params = model.parameters() if isinstance(model, torch.nn.Module) else model
    table = {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
    return table[name](params, lr=lr, weight_decay=weight_decay)


def periods_label(sync_cfg: SyncConfig) -> str:
    """The paper's notation of the sync periods, e.g. ``(16,128)``."""
    periods = {r.period or sync_cfg.period for r in sync_cfg.components}
    return "(" + ",".join(str(p) for p in sorted(periods)) + ")"


def entry_args(doc: str, argv: Optional[list[str]] = None):
    """The command line every training entry point takes: --config (repeatable), --exp-dir,
    --name, and dotlist overrides."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--config", action="append", default=[],
                    help="YAML with data/model/train/sync sections; repeat to merge several, later wins")
    ap.add_argument("--exp-dir", required=True)
    ap.add_argument("--name", help="run name in results.json (default: the algorithm, or ddp/single)")
    ap.add_argument("overrides", nargs="*", help="dotlist overrides, e.g. sync.period=8 train.lr=0.05")
    return ap.parse_intermixed_args(argv)


class DistributedRun:
    """Accelerator + prepared model/optimizer + synchronizer or DDP counter + checkpoints."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sync_cfg: SyncConfig,
                 exp_dir: Path, cpu: Optional[bool] = None, scheduler: Any = None, checkpoint: bool = True):
        from accelerate import Accelerator

        from .integrations.accelerate import AccelerateSynchronizer, counting_allreduce_hook

        cpu = cpu if cpu is not None else not torch.cuda.is_available()
        self.accelerator = Accelerator(cpu=cpu)
        self.rank, self.world = self.accelerator.process_index, self.accelerator.num_processes
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.core = self.accelerator.unwrap_model(self.model)
        self.scheduler = scheduler
        self.exp = Path(exp_dir)
        self.ckpt_root = self.exp / "checkpoints"
        self.checkpoint = checkpoint
        self.ddp_counter = Counter()
        self.sync = None
        if sync_cfg.enabled:
            self.sync = AccelerateSynchronizer(self.accelerator, self.model, sync_cfg)
        elif self.world > 1:
            self.model.register_comm_hook(self.ddp_counter, counting_allreduce_hook)
        self.sync_cfg = sync_cfg
        self.step = 0
        if self.accelerator.is_main_process:
            self.exp.mkdir(parents=True, exist_ok=True)

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def default_name(self) -> str:
        return self.sync_cfg.algorithm if self.sync is not None else ("ddp" if self.world > 1 else "single")

    def describe_sync(self) -> str:
        return f"sync periods {periods_label(self.sync_cfg)}" if self.sync is not None else "no model sync"

    def after_step(self) -> None:
        """Call after every optimizer step."""
        if self.sync is not None:
            self.sync.step()
        self.step += 1

    def metrics(self) -> dict[str, float]:
        return self.sync.metrics() if self.sync is not None else {"sync/bytes_sent": self.ddp_counter.bytes_sent}

    def all_mean(self, values: list[float]) -> list[float]:
        """Mean over workers of a few scalars (every rank gets the same numbers)."""
        t = torch.tensor(values, dtype=torch.float64)
        if self.world > 1:
            dist.all_reduce(t)
            t /= self.world
        return t.tolist()

    # -- checkpoints ----------------------------------------------------------------------
    def save(self, epoch: int, extra: dict) -> None:
        """This rank's state after ``epoch``; the epoch counts as complete once all ranks wrote."""
        if not self.checkpoint:
            return
        ckpt.atomic_save({
            "world_size": self.world, "epoch": epoch, "step": self.step, "model": self.core.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else {},
            "sync": self.sync.state_dict() if self.sync is not None else {},
            "ddp_counter": vars(self.ddp_counter).copy(), "rng": ckpt.rng_state(), "extra": extra,
        }, ckpt.epoch_dir(self.ckpt_root, epoch) / f"rank{self.rank}.pt")
        self.accelerator.wait_for_everyone()
        if self.is_main:
            (ckpt.epoch_dir(self.ckpt_root, epoch) / "done").write_text(f"{self.step}\n")

    def resume(self, enabled: bool = True) -> tuple[int, dict]:
        """Load the newest complete checkpoint; returns (first epoch to run, extra state)."""
        epoch = ckpt.latest_complete(self.ckpt_root) if enabled else None
        if epoch is None:
            return 1, {}
        state = ckpt.load_rank(self.ckpt_root, epoch, self.rank, self.world)
        self.core.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.sync is not None:
            self.sync.load_state_dict(state["sync"])
        self.ddp_counter = Counter(**state["ddp_counter"])
        ckpt.set_rng_state(state["rng"])
        self.step = state["step"]
        self.accelerator.print(f"[train] resumed from {ckpt.epoch_dir(self.ckpt_root, epoch)} (step {self.step})")
        return epoch + 1, state["extra"]

    # -- the end ----------------------------------------------------------------------------
    def finish(self) -> None:
        """Final average over all workers (Algorithm 1, line 20)."""
        if self.sync is not None:
            self.sync.finalize()

    def traffic(self) -> dict[str, float]:
        """Bytes sent/received and comm seconds per worker (mean over workers), and per step."""
        c = self.sync.comm.stats.total() if (self.sync is not None and self.sync.comm) else self.ddp_counter
        sent, recv, seconds = self.all_mean([c.bytes_sent, c.bytes_recv, c.seconds])
        steps = max(self.step, 1)
        return {"bytes_sent_per_worker": sent, "bytes_recv_per_worker": recv, "comm_seconds_per_worker": seconds,
                "bytes_sent_per_step_per_worker": sent / steps, "bytes_recv_per_step_per_worker": recv / steps}

    def results(self, name: str, n_params: int, epochs: int, train_seconds: float, history: list) -> dict:
        """The part of results.json every trainer writes (who, how long, how much traffic)."""
        return {
            "name": name, "algorithm": self.sync_cfg.algorithm if self.sync is not None else name,
            "periods": periods_label(self.sync_cfg) if self.sync is not None else "(1)",
            "workers": self.world, "parameters": n_params, "epochs": epochs, "steps_per_worker": self.step,
            "train_seconds": train_seconds, "steps_per_second": self.step / max(train_seconds, 1e-9),
            **self.traffic(), "history": history, "sync": OmegaConf.to_container(OmegaConf.structured(self.sync_cfg)),
        }

    def save_final(self, name: str = "final.pt") -> None:
        if self.is_main:
            ckpt.atomic_save(self.core.state_dict(), self.exp / name)
