"""The benchmark's workloads: the LM recipe's mini LM, and a synthetic model of any size.

``lm``: the model of ``recipes/wikitext103/lm1/conf/mini.yaml`` (LSTMP 256/128, embedding 128,
adaptive softmax; 2.6M parameters) built by the recipe's own ``train_lm.build_model``, trained
on the embedded ``local/data/wiki_mini`` text (each worker on its 1/n of the stream, as the
recipe does), with the recipe's optimizer; its sync split is the paper's
(``conf/lm/period_16_128.yaml``). It has a quality measure: validation perplexity.

``synthetic:SIZE`` (``synthetic:10M``): an embedding table that holds almost all of SIZE
parameters, and a fixed MLP body (``width`` x ``depth``) on a fixed batch of token ids, regressed
onto random targets. The body's compute per step does not depend on SIZE; what grows with
SIZE is what any training step pays per parameter (the dense gradient and the SGD update,
memory-bound) and what the network has to move. Its sync split mirrors the LM's: the
embedding in 8 row shards (``components.0``), the body the rest.

Both expose the same interface (:class:`Workload`) to the worker.
"""
from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]
SYNC_COMMON = {"block_momentum": 0.9, "block_lr": 1.0, "nesterov": True}  # the recipes' BMUF settings


class Workload:
    """What the worker needs from a workload."""

    name: str
    tokens_per_step: int  # per worker
    clip_norm: Optional[float] = None
    has_quality = False

    def build(self) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """Model and optimizer, identical on every rank (fixed seed)."""
        raise NotImplementedError

    def sync_base(self) -> dict:
        """The sync config the settings' overrides apply to: (16,128), ``components.0`` = embedding."""
        raise NotImplementedError

    def batches(self, rank: int, world: int, device: torch.device) -> Iterator[Any]:
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        raise NotImplementedError

    def quality(self, model: torch.nn.Module) -> Optional[float]:
        """Validation perplexity (lower is better), or None when the workload has no quality."""
        return None

    def describe(self, n_params: int) -> str:
        return f"{self.name}: {n_params / 1e6:.2f}M parameters, {self.tokens_per_step} tokens/step/worker"


class MiniLM(Workload):
    """The LM recipe's mini LSTMP LM on wiki_mini."""

    has_quality = True

    def __init__(self, data_dir: Path, streams: int, bptt: int, min_count: int = 3):
        from bench.sync_traffic import CONFS  # the recipe's mini.yaml + the paper's (16,128) split
        from gossip_accel.bin.train_lm import load_conf
        from gossip_accel.data.lm import Vocabulary, read_lines

        self.name = "lm"
        self.conf = load_conf([str(c) for c in CONFS], [f"train.streams={streams}", f"train.bptt={bptt}"])
        self.data_dir = Path(data_dir)
        self.vocab = Vocabulary.build(read_lines(self.data_dir / "wiki.train.tokens"), min_count=min_count)
        self.train_ids = self.vocab.encode(read_lines(self.data_dir / "wiki.train.tokens"))  # once, for all settings
        self.tokens_per_step = streams * bptt
        self.clip_norm = self.conf.train.clip_norm
        self._valid: Optional[torch.Tensor] = None
        self._state = None

    def build(self):
        from gossip_accel.bin.train_lm import build_model
        from gossip_accel.train.optimizers import make_optimizer

        torch.manual_seed(self.conf.train.seed)
        model = build_model(self.conf, self.vocab)
        return model, make_optimizer(self.conf.train.optimizer, model.parameters(), self.conf.train.lr)

    def sync_base(self) -> dict:
        return OmegaConf.to_container(self.conf.sync)

    def batches(self, rank, world, device):
        from gossip_accel.data.lm import batchify, bptt_windows, shard

        data = batchify(shard(self.train_ids, rank, world), self.conf.train.streams).to(device)
        self._state = None
        for _ in itertools.count():
            for x, y in bptt_windows(data, self.conf.train.bptt):
                yield x, y
            self._state = None  # a new pass over the stream starts without carried state

    def loss(self, model, batch):
        x, y = batch
        state = None if self._state is None else tuple(s.detach() for s in self._state)
        loss, self._state = model(x, y, state)
        return loss

    def quality(self, model):
        from gossip_accel.bin.train_lm import perplexity
        from gossip_accel.data.lm import batchify, read_lines

        if self._valid is None:
            ids = self.vocab.encode(read_lines(self.data_dir / "wiki.valid.tokens"))
            self._valid = batchify(ids, 16)  # the recipe's evaluation layout, whatever the training batch
        device = next(model.parameters()).device
        return perplexity(model, self._valid.to(device), self.conf.train.bptt)


class SyntheticModel(torch.nn.Module):
    """An embedding table holding ~``n_params`` parameters and a fixed-size MLP body."""

    def __init__(self, n_params: int, width: int, depth: int):
        super().__init__()
        self.body = torch.nn.Sequential(*[m for _ in range(depth) for m in (torch.nn.Linear(width, width), torch.nn.Tanh())])
        self.embedding = torch.nn.Embedding(self.rows_for(n_params, width, depth), width)

    @staticmethod
    def rows_for(n_params: int, width: int, depth: int) -> int:
        """Embedding rows so that table + body hold ~``n_params`` parameters."""
        return max(8, (n_params - depth * (width * width + width)) // width)

    def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.body(self.embedding(ids)), target)


class Synthetic(Workload):
    """``synthetic:SIZE``: SGD on :class:`SyntheticModel` with random ids and targets."""

    def __init__(self, n_params: int, batch: int, width: int, depth: int, lr: float = 0.05, seed: int = 1):
        self.n_params, self.batch, self.width, self.depth, self.lr, self.seed = n_params, batch, width, depth, lr, seed
        self.name = f"synthetic-{format_count(n_params)}"
        self.tokens_per_step = batch

    def build(self):
        torch.manual_seed(self.seed)
        model = SyntheticModel(self.n_params, self.width, self.depth)
        return model, torch.optim.SGD(model.parameters(), lr=self.lr)

    def sync_base(self) -> dict:
        return {**SYNC_COMMON, "algorithm": "gossip_bmuf", "period": 16, "components": [
            {"name": "embedding", "pattern": r"^embedding\.", "period": 128, "shards": 8}, {"name": "body"}]}

    def batches(self, rank, world, device):
        rows = SyntheticModel.rows_for(self.n_params, self.width, self.depth)
        g = torch.Generator().manual_seed(self.seed * 1000 + rank)
        while True:
            ids = torch.randint(0, rows, (self.batch,), generator=g)
            yield ids.to(device), torch.randn(self.batch, self.width, generator=g).to(device)

    def loss(self, model, batch):
        return model(*batch)


def parse_count(text: str) -> int:
    """``10M`` -> 10_000_000, ``500k``, ``0.2M``, ``1e6``."""
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kKmMgG]?)", text.strip())
    if not m:
        raise ValueError(f"parameter count {text!r}: expected e.g. 10M, 500k, 0.2M")
    return int(float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()])


def format_count(n: int) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return str(n)


def make_workload(spec: str, lm_data: Path, lm_streams: int, lm_bptt: int, synth_batch: int, synth_width: int,
                  synth_depth: int) -> Workload:
    """``lm`` or ``synthetic:SIZE``."""
    kind, _, size = spec.partition(":")
    if kind == "lm" and not size:
        return MiniLM(lm_data, lm_streams, lm_bptt)
    if kind == "synthetic" and size:
        return Synthetic(parse_count(size), synth_batch, synth_width, synth_depth)
    raise ValueError(f"workload {spec!r}: expected lm or synthetic:SIZE (e.g. synthetic:10M)")
