"""Trainer configuration: YAML files + dotlist overrides onto a dataclass schema, the ``train.*``
keys every trainer shares, the command line, and warm-up given in epochs."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..sync import registry
from ..sync.config import ConfigError, SyncConfig, apply_overrides, validate


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


@dataclass
class RunConf:
    """The ``train.*`` keys every trainer shares (the epoch loop's and DistributedRun's options);
    a trainer's own section subclasses it and may change the defaults."""

    cpu: Optional[bool] = None
    checkpoint: bool = True  # per-rank checkpoints under <exp-dir>/checkpoints
    resume: bool = True  # continue from the newest complete checkpoint in <exp-dir>
    elastic: bool = True  # resume a checkpoint of another number of workers (replicas averaged); false: refuse it
    keep_checkpoints: int = 3  # the newest K complete checkpoints stay, older ones are removed
    checkpoint_every_steps: int = 0  # also inside epochs, every N steps (0: epoch ends only)
    save_epoch_models: bool = False  # rank 0 saves the replicas' average of every epoch to <exp-dir>/epoch_models
                                     # (for checkpoint averaging: gossip_accel.bin.average_checkpoints)
    collective_timeout: float = 1800.0  # seconds a collective waits for a peer before CollectiveTimeout
    warmup_epochs: Optional[float] = None  # sync.warmup_steps given in epochs (see warmup_in_steps)
    optimizer: str = "adam"  # adam | adamw | sgd | adagrad | ngsgd (Kaldi NG-SGD)
    lr: float = 1e-3
    weight_decay: float = 0.0
    clip_norm: float = 5.0
    seed: int = 1
    max_steps_per_epoch: Optional[int] = None  # steps per worker of an epoch at most (the rest of its batches unused)
    max_batches_per_epoch: Optional[int] = None  # the same cap counted over all workers: each runs ceil(N / workers)
                                                 # steps, so an epoch is N batches whatever the number of workers
    log_every: int = 20  # TensorBoard scalars every N steps


def run_options(train: Any) -> dict:
    """DistributedRun's keyword arguments from a ``train`` section (a :class:`RunConf`)."""
    return {"cpu": train.cpu, "checkpoint": train.checkpoint, "keep_checkpoints": train.keep_checkpoints,
            "checkpoint_every_steps": train.checkpoint_every_steps, "collective_timeout": train.collective_timeout,
            "elastic": train.elastic, "save_epoch_models": train.save_epoch_models}


def check_epoch_caps(train: Any) -> None:
    """A ConfigError naming both keys when ``train.max_steps_per_epoch`` and ``train.max_batches_per_epoch``
    are both set, or naming the one that is not a positive number of steps or batches."""
    steps, batches = train.max_steps_per_epoch, train.max_batches_per_epoch
    if steps and batches:
        raise ConfigError(f"train.max_steps_per_epoch={steps} and train.max_batches_per_epoch={batches}: "
                          "give one cap of an epoch (steps per worker, or batches of all workers)")
    for key, value in (("max_steps_per_epoch", steps), ("max_batches_per_epoch", batches)):
        if value is not None and value < 1:
            raise ConfigError(f"train.{key}={value}: must be >= 1 (or null: no cap)")


def warmup_in_steps(sync_cfg: SyncConfig, warmup_epochs: Optional[float], steps_per_epoch: int) -> SyncConfig:
    """``sync_cfg`` with ``sync.warmup_steps = round(train.warmup_epochs * steps per epoch)``.

    ``train.warmup_epochs`` is the warm-up (full averages every ``sync.warmup_period`` steps,
    docs/ALGORITHMS.md) in epochs; ``null`` leaves ``sync.warmup_steps`` as it is. Giving both
    is an error naming the two keys.
    """
    if warmup_epochs is None:
        return sync_cfg
    if sync_cfg.warmup_steps:
        raise ConfigError(f"train.warmup_epochs={warmup_epochs} and sync.warmup_steps={sync_cfg.warmup_steps} "
                          "both set the warm-up: give one of them (add sync.warmup_steps=0 when a conf sets steps)")
    if warmup_epochs < 0:
        raise ConfigError(f"train.warmup_epochs={warmup_epochs} must be >= 0 (or null: use sync.warmup_steps)")
    if warmup_epochs and sync_cfg.enabled and not sync_cfg.spec.warmup:
        raise ConfigError(f"train.warmup_epochs={warmup_epochs}: a warm-up is defined for "
                          f"{', '.join(registry.names(warmup=True))}; add train.warmup_epochs=null for "
                          f"{sync_cfg.algorithm}")
    cfg = dataclasses.replace(sync_cfg, warmup_steps=int(round(warmup_epochs * steps_per_epoch)))
    try:
        validate(cfg)
    except ConfigError as e:
        raise ConfigError(f"train.warmup_epochs={warmup_epochs} ({cfg.warmup_steps} steps): {e}") from None
    return cfg


def entry_args(doc: str, argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The command line every training entry point takes: --config (repeatable), --exp-dir,
    --name, and dotlist overrides."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--config", action="append", default=[],
                    help="YAML with data/model/train/sync sections; repeat to merge several, later wins")
    ap.add_argument("--exp-dir", required=True)
    ap.add_argument("--name", help="run name in results.json (default: the algorithm, or ddp/single)")
    ap.add_argument("overrides", nargs="*", help="dotlist overrides, e.g. sync.period=8 train.lr=0.05")
    return ap.parse_intermixed_args(argv)
