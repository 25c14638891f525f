"""Train an LSTMP language model with the synchronizer, under ``accelerate launch`` or torchrun.

    accelerate launch --multi_gpu --num_processes 4 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no -m gossip_accel.bin.train_lm --config conf/lm.yaml \\
        --exp-dir exp/gossip_bmuf sync.algorithm=gossip_bmuf train.epochs=2

Every worker trains its own replica on its 1/n of the training stream (D^k): a contiguous part of
the text, or with ``data.shard_layout=interleaved`` every n-th of n x ``train.streams`` streams.
``sync.enabled=false`` gives the plain DDP baseline (gradient all-reduce every step), whose
bytes are counted by a DDP comm hook with the same ring accounting as the synchronizer.
Writes ``results.json`` (perplexities, traffic, time, the sync settings, per-epoch history
with the validation perplexity of the averaged model, ``valid_ppl``, and the mean of the
replicas', ``valid_ppl_replicas``), TensorBoard scalars under ``tensorboard/``, per-rank
checkpoints under ``checkpoints/`` at epoch ends and every ``train.checkpoint_every_steps``
steps (a rerun with the same ``--exp-dir``, or a restart by the launcher, resumes from the
newest complete one exactly: data position, LSTM state, RNG states) and the final averaged
model ``final.pt`` to ``--exp-dir``. The epoch loop is gossip_accel.train.loop's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from ..sync.config import ConfigError
from ..data.lm import SHARD_LAYOUTS, Vocabulary, batchify, bptt_windows, read_lines, rest_of_stream, worker_streams
from ..models.lstm_lm import LSTMPLanguageModel, frequency_cutoffs
from ..train import loop
from ..train.config import RunConf, load_structured
from ..train.optimizers import make_optimizer


@dataclass
class DataConf:
    dir: str = "data/lm"
    train: str = "wiki.train.tokens"
    valid: str = "wiki.valid.tokens"
    test: str = "wiki.test.tokens"
    vocab: str = "vocab.txt"
    shard_layout: str = "contiguous"  # how the training text is dealt out to workers: contiguous | interleaved


@dataclass
class ModelConf:
    embedding_dim: int = 512
    hidden_size: int = 2048
    projection_size: int = 512
    num_layers: int = 1
    dropout: float = 0.1
    div_value: float = 2.0
    head_size: int = 8192
    num_tails: int = 5


@dataclass
class TrainConf(RunConf):
    epochs: int = 20
    streams: int = 16  # parallel streams of the training text (the batch size)
    bptt: int = 40
    lr_decay: float = 0.9  # ExponentialLR per epoch
    optimizer: str = "adagrad"
    lr: float = 0.1
    clip_norm: float = 10.0
    log_every: int = 50


@dataclass
class LMConf:
    data: DataConf = field(default_factory=DataConf)
    model: ModelConf = field(default_factory=ModelConf)
    train: TrainConf = field(default_factory=TrainConf)
    sync: Any = field(default_factory=dict)


def load_conf(paths: list[str], overrides: list[str]) -> LMConf:
    """YAML files (merged in order) + dotlist overrides; errors name the file and the key."""
    conf = load_structured(LMConf, paths, overrides)
    if conf.data.shard_layout not in SHARD_LAYOUTS:
        raise ConfigError(f"data.shard_layout={conf.data.shard_layout!r}: expected one of {', '.join(SHARD_LAYOUTS)}")
    return conf


def build_model(conf: LMConf, vocab: Vocabulary) -> LSTMPLanguageModel:
    """The LSTMP LM of ``conf.model`` for ``vocab`` (adaptive-softmax cutoffs by frequency)."""
    m = conf.model
    if not 0 < m.projection_size < m.hidden_size:
        raise ConfigError(f"model.projection_size={m.projection_size} must be in (0, model.hidden_size={m.hidden_size})")
    cutoffs = frequency_cutoffs(vocab.counts, m.head_size, m.num_tails)
    return LSTMPLanguageModel(len(vocab), cutoffs, m.embedding_dim, m.hidden_size, m.projection_size,
                              m.num_layers, m.dropout, m.div_value)


@torch.no_grad()
def perplexity(model: torch.nn.Module, data: torch.Tensor, bptt: int) -> float:
    """exp(mean NLL) over all windows of a (streams, L) matrix."""
    was = model.training
    model.eval()
    total, count, state = 0.0, 0, None
    for x, y in bptt_windows(data, bptt):
        loss, state = model(x, y, state)
        total += float(loss) * y.numel()
        count += y.numel()
    model.train(was)
    mean = total / max(count, 1)
    return math.exp(mean) if mean < 700 else math.inf  # a diverged run reports inf instead of OverflowError


class LMTask(loop.Task):
    """Truncated BPTT over this worker's shard of the stream; the LSTM state carries across windows."""

    tag, loss_label, loss_scalar = "train_lm", "loss", "train/loss"
    valid_key, valid_label, valid_scalar, valid_format = "valid_ppl", "valid ppl", "valid/ppl", ".2f"
    validates_whole_set = True  # every worker's perplexity is on the whole valid set

    def __init__(self, conf: LMConf, rank: int, world: int):
        data_dir = Path(conf.data.dir)
        self.vocab = Vocabulary.load(data_dir / conf.data.vocab)
        torch.manual_seed(conf.train.seed)
        self.model = build_model(conf, self.vocab)
        self.optimizer = make_optimizer(conf.train.optimizer, self.model, conf.train.lr, conf.train.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.ExponentialLR(self.optimizer, conf.train.lr_decay)
        self.ids = self.vocab.encode(read_lines(data_dir / conf.data.train))
        self.rank, self.world, self.streams, self.bptt = rank, world, conf.train.streams, conf.train.bptt
        self.layout = conf.data.shard_layout
        self.windows = self.windows_of(self.ids)  # the same every epoch
        self.valid = batchify(self.vocab.encode(read_lines(data_dir / conf.data.valid)), conf.train.streams)

    def windows_of(self, ids: torch.Tensor) -> list:
        """This rank's BPTT windows of a token stream: its 1/n (D^k), as ``streams`` parallel streams."""
        return list(bptt_windows(worker_streams(ids, self.rank, self.world, self.streams, self.layout), self.bptt))

    def describe(self) -> str:
        return f"vocab {len(self.vocab)}, cutoffs {self.model.softmax.cutoffs[:-1]}"

    def batches(self, epoch: int) -> list:
        return self.windows

    def rest_of_epoch(self, epoch: int, segments) -> list:
        """Elastic resume: the tokens each segment's workers have not fed yet (``rest_of_stream``),
        sharded over this world; the LSTM state starts at zero."""
        rest = self.ids
        for world, done in segments:
            rest = rest_of_stream(rest, world, self.streams, done * self.bptt, self.layout)
        return self.windows_of(rest)

    def begin_epoch(self, epoch: int, saved: dict) -> None:
        self.state, self.loss_sum, self.n = saved.get("hidden"), saved.get("loss", 0.0), saved.get("n", 0)

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        if self.state is not None:
            self.state = tuple(s.detach() for s in self.state)
        loss, self.state = model(x, y, self.state)
        self.loss_sum += float(loss.detach())
        self.n += 1
        return loss

    def running_loss(self) -> float:
        return self.loss_sum / max(self.n, 1)

    def epoch_state(self) -> dict:
        return {"hidden": tuple(s.detach() for s in self.state), "loss": self.loss_sum, "n": self.n}

    def train_measure(self) -> float:
        return self.running_loss()

    def validate(self, model: torch.nn.Module) -> float:
        return perplexity(model, self.valid, self.bptt)

    def end_epoch(self, epoch: int, row: dict) -> None:
        self.scheduler.step()


def main(argv: Optional[list[str]] = None) -> None:
    loop.main(__doc__, argv, load_conf, LMTask, epochs=lambda conf: conf.train.epochs)


if __name__ == "__main__":
    main()
