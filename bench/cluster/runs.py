"""One training set-up per benchmark setting, behind one interface.

* ``no-comm``: each worker trains its own model alone, no DDP wrapper, no synchronizer: the
  physical limit of the emulated cluster (its speed is what the hardware gives without a network).
* ``ddp``: :class:`gossip_accel.train.run.DistributedRun` with ``sync.enabled=false``: DDP's gradient
  all-reduce every step, counted by the same ring accounting as the synchronizer.
* every name of ``bench/sync_traffic.py``'s ``SETTINGS`` (``ma-(8)``, ``gossip_bmuf-(16,128)``, ...),
  and ``local_bmuf-(8)``: ``DistributedRun`` with the synchronizer, the workload's (16,128) split
  plus the setting's overrides.

So the benchmark trains exactly as ``gossip_accel.bin.train_lm`` does (Accelerate, the no-op DDP
hook, ``after_step`` after each optimizer step).
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable, Optional

import torch

from bench.sync_traffic import SETTINGS as SYNC_SETTINGS  # name -> sync overrides
from gossip_accel.sync.comm import Counter
from gossip_accel.sync.config import load_sync_config

NO_COMM, DDP = "no-comm", "ddp"
SETTINGS = {**SYNC_SETTINGS,  # local-BMUF at the period of the (8) settings, beside gossip-BMUF (8)
            "local_bmuf-(8)": [*SYNC_SETTINGS["local_bmuf-(16,128)"], *SYNC_SETTINGS["gossip_bmuf-(8)"][1:]]}
ALL_SETTINGS = (NO_COMM, DDP, *SETTINGS)
DEFAULT_SETTINGS = (NO_COMM, DDP, "ma-(8)", "bmuf-(8)", "local_bmuf-(8)", "gossip_bmuf-(8)", "gossip_bmuf-(16,128)")


def check_settings(names: list[str]) -> None:
    unknown = [n for n in names if n not in ALL_SETTINGS]
    if unknown:
        raise ValueError(f"unknown settings {unknown}; choose from {', '.join(ALL_SETTINGS)}")


class SettingRun:
    """Model, optimizer and communication of one setting; :meth:`step` is one optimizer step."""

    def __init__(self, setting: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sync_base: dict,
                 exp_dir: Path, device: torch.device, clip_norm: Optional[float] = None,
                 ddp_wrapper: Optional[bool] = None):
        self.setting = setting
        self.clip_norm = clip_norm
        self.run = None
        if setting == NO_COMM:
            self.model = self.core = model.to(device)
            self.optimizer = optimizer
        else:
            from gossip_accel.train.run import DistributedRun

            # every rank builds the same model from the same seed, so Algorithm 1's initial broadcast
            # (line 1) is a no-op here; skipping it saves a full-model broadcast per setting on slow links
            # (a setting may ask for it: the int8/int4 wire's references start at the broadcast model)
            cfg = (load_sync_config({"enabled": False}) if setting == DDP
                   else load_sync_config(sync_base, ["broadcast_initial=false", *SETTINGS[setting]]))
            self.run = DistributedRun(model, optimizer, cfg, exp_dir, cpu=device.type == "cpu", checkpoint=False,
                                      ddp_wrapper=ddp_wrapper)
            self.model, self.core, self.optimizer = self.run.model, self.run.core, self.run.optimizer
        self.sync = self.run.sync if self.run is not None else None

    @property
    def cycle(self) -> int:
        """Steps after which the traffic pattern repeats: the longest sync period (1 without sync)."""
        return max(c.period for c in self.sync.components) if self.sync is not None else 1

    def step(self, loss: torch.Tensor, lap: Optional[Callable[[str], None]] = None) -> None:
        """Backward, clip, optimizer step, synchronization (as train_lm does); ``lap(phase)`` is called
        at the end of each phase ("backward", "optimizer", "sync"; bench/step_profile.py times them)."""
        lap = lap or (lambda phase: None)
        self.optimizer.zero_grad(set_to_none=True)
        if self.run is None:
            loss.backward()
            if self.clip_norm:
                torch.nn.utils.clip_grad_norm_(self.core.parameters(), self.clip_norm)
        else:
            self.run.accelerator.backward(loss)
            if self.clip_norm:
                self.run.accelerator.clip_grad_norm_(self.model.parameters(), self.clip_norm)
        lap("backward")
        self.optimizer.step()
        lap("optimizer")
        if self.run is not None:
            self.run.after_step()
        lap("sync")

    def traffic(self) -> Counter:
        """Periodic traffic of this worker so far (bytes sent/received, seconds in comm calls)."""
        if self.sync is not None:
            return copy.copy(self.sync.comm.stats.total())
        if self.run is not None:
            return copy.copy(self.run.ddp_counter)
        return Counter()

    def close(self) -> None:
        """End the setting. Algorithm 1's family holds nothing open, and its ``finalize()`` (a full-model
        all-reduce) is not needed here; any other algorithm gets its ``finalize()``, where the
        asynchronous ones close their RPC session, and so does an overlapped sync (``sync.overlap_steps``):
        its exchanges still in flight complete before their buffers are freed (a setting that left them
        in flight on a 100 Mbit link was followed by a hang in the next collective, rank 0's gloo TCP
        loop spinning)."""
        if self.sync is not None and (self.sync.cfg.spec.family != "periodic" or self.sync.cfg.overlap_steps > 0):
            self.run.finish()
