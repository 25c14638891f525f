"""Train an LSTMP language model with the synchronizer, under ``accelerate launch`` or torchrun.

    accelerate launch --multi_gpu --num_processes 4 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no -m gossip_accel.bin.train_lm --config conf/lm.yaml \\
        --exp-dir exp/gossip_bmuf sync.algorithm=gossip_bmuf train.epochs=2

Every worker trains its own replica on its contiguous 1/n of the training stream (D^k).
``sync.enabled=false`` gives the plain DDP baseline (gradient all-reduce every step), whose
bytes are counted by a DDP comm hook with the same ring accounting as the synchronizer.
Writes ``results.json`` (perplexities, traffic, time, per-epoch history), TensorBoard
scalars under ``tensorboard/``, per-rank checkpoints under ``checkpoints/`` at epoch ends and
every ``train.checkpoint_every_steps`` steps (a rerun with the same ``--exp-dir``, or a
restart by the launcher, resumes from the newest complete one exactly: data position, LSTM
state, RNG states) and the final averaged model ``final.pt`` to ``--exp-dir``.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import OmegaConf

from .. import shutdown
from ..sync.config import ConfigError
from ..data.lm import Vocabulary, batchify, bptt_windows, num_windows, read_lines, shard
from ..models.lstm_lm import LSTMPLanguageModel, frequency_cutoffs
from ..trainer import RunConf, make_optimizer  # noqa: F401  (also the name bench/cluster imports from here)


@dataclass
class DataConf:
    dir: str = "data/lm"
    train: str = "wiki.train.tokens"
    valid: str = "wiki.valid.tokens"
    test: str = "wiki.test.tokens"
    vocab: str = "vocab.txt"


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
    streams: int = 16
    bptt: int = 40
    optimizer: str = "adagrad"
    lr: float = 0.1
    lr_decay: float = 0.9
    clip_norm: float = 10.0
    seed: int = 1
    max_steps_per_epoch: Optional[int] = None
    log_every: int = 50


@dataclass
class LMConf:
    data: DataConf = field(default_factory=DataConf)
    model: ModelConf = field(default_factory=ModelConf)
    train: TrainConf = field(default_factory=TrainConf)
    sync: Any = field(default_factory=dict)


def load_conf(paths: list[str], overrides: list[str]) -> LMConf:
    """YAML files (merged in order) + dotlist overrides; errors name the file and the key."""
    from ..trainer import load_structured

    return load_structured(LMConf, paths, overrides)


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
    return math.exp(total / max(count, 1))


def main(argv: Optional[list[str]] = None) -> None:
    from ..trainer import entry_args

    args = entry_args(__doc__, argv)
    conf = load_conf(args.config, args.overrides)

    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    from ..sync.config import load_sync_config
    from ..data.asr import agree_on_steps
    from ..trainer import DistributedRun, run_options

    sync_cfg = load_sync_config(OmegaConf.to_container(conf.sync) or None)
    data_dir = Path(conf.data.dir)
    vocab = Vocabulary.load(data_dir / conf.data.vocab)
    torch.manual_seed(conf.train.seed)
    model = build_model(conf, vocab)
    cutoffs = model.softmax.cutoffs[:-1]
    n_params = sum(p.numel() for p in model.parameters())
    opt = make_optimizer(conf.train.optimizer, model, conf.train.lr)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, conf.train.lr_decay)
    run = DistributedRun(model, opt, sync_cfg, Path(args.exp_dir), scheduler=sched, **run_options(conf.train))
    if run.is_main:
        OmegaConf.save(conf, run.exp / "config.yaml")
    train = batchify(shard(vocab.encode(read_lines(data_dir / conf.data.train)), run.rank, run.world),
                     conf.train.streams)
    valid = batchify(vocab.encode(read_lines(data_dir / conf.data.valid)), conf.train.streams)

    train_windows = num_windows(train, conf.train.bptt)
    # equal shards give equal counts; the all-reduce keeps any rank from waiting in a sync round
    steps_per_epoch = agree_on_steps(min(train_windows, conf.train.max_steps_per_epoch or train_windows))
    name = args.name or run.default_name()
    first_epoch, extra = run.resume(conf.train.resume)
    history, train_seconds = extra.get("history", []), extra.get("train_seconds", 0.0)
    writer = SummaryWriter(str(run.exp / "tensorboard")) if run.is_main else None
    run.accelerator.print(
        f"[train_lm] {name}: {run.world} workers, {n_params / 1e6:.2f}M parameters, vocab {len(vocab)}, "
        f"cutoffs {cutoffs}, {steps_per_epoch} steps/epoch/worker, {run.describe_sync()}"
    )

    for epoch in range(first_epoch, conf.train.epochs + 1):
        start = time.perf_counter()
        run.model.train()
        skip = run.start_batch(epoch)
        mid = extra.get("epoch_state", {}) if skip else {}  # resumed inside this epoch
        state, run_loss, run_n = mid.get("hidden"), mid.get("loss", 0.0), mid.get("n", 0)
        bar = tqdm(total=steps_per_epoch, initial=skip, desc=f"{name} epoch {epoch}", disable=not run.is_main,
                   mininterval=2.0)
        for i, (x, y) in enumerate(bptt_windows(train, conf.train.bptt)):
            if i >= steps_per_epoch:
                break
            if i < skip:
                continue
            if state is not None:
                state = tuple(s.detach() for s in state)
            loss, state = run.model(x, y, state)
            opt.zero_grad(set_to_none=True)
            run.accelerator.backward(loss)
            run.accelerator.clip_grad_norm_(run.model.parameters(), conf.train.clip_norm)
            run.optimizer.step()
            run.after_step()
            run_loss += float(loss.detach())
            run_n += 1
            bar.update(1)
            if writer is not None and run.step % conf.train.log_every == 0:
                writer.add_scalar("train/loss", run_loss / run_n, run.step)
                writer.add_scalar("train/lr", sched.get_last_lr()[0], run.step)
                for k, v in run.metrics().items():
                    writer.add_scalar(k, v, run.step)
                bar.set_postfix(loss=f"{run_loss / run_n:.3f}")
            run.save_step(epoch, i + 1, steps_per_epoch, lambda: {
                "history": history, "train_seconds": train_seconds + time.perf_counter() - start,
                "epoch_state": {"hidden": tuple(s.detach() for s in state), "loss": run_loss, "n": run_n}})
        bar.close()
        sched.step()
        train_seconds += time.perf_counter() - start
        train_loss, replica_ppl = run.all_mean([run_loss / max(run_n, 1), perplexity(run.core, valid, conf.train.bptt)])
        row = {"epoch": epoch, "step": run.step, "train_loss": train_loss, "valid_ppl_replicas": replica_ppl}
        history.append(row)
        run.accelerator.print(f"[train_lm] {name} epoch {epoch}: train loss {train_loss:.4f}, "
                              f"valid ppl (mean of replicas) {replica_ppl:.2f}")
        if writer is not None:
            writer.add_scalar("valid/ppl_replicas", replica_ppl, run.step)
        run.save(epoch, {"history": history, "train_seconds": train_seconds})

    run.finish()
    valid_ppl = perplexity(run.core, valid, conf.train.bptt)
    results = {**run.results(name, n_params, conf.train.epochs, train_seconds, history), "final_valid_ppl": valid_ppl}
    run.save_final()
    if run.is_main:
        (run.exp / "results.json").write_text(json.dumps(results, indent=2))
        if writer is not None:
            writer.add_scalar("valid/ppl_final", valid_ppl, run.step)
            writer.close()
    run.accelerator.print(
        f"[train_lm] {name} done: valid ppl of the averaged model {valid_ppl:.2f}, "
        f"{results['bytes_sent_per_step_per_worker'] / 1e6:.3f} MB sent/step/worker, "
        f"{results['steps_per_second']:.2f} steps/s"
    )
    shutdown()


if __name__ == "__main__":
    main()
