"""Train an LSTMP language model with the synchronizer, under ``accelerate launch`` or torchrun.

    accelerate launch --multi_gpu --num_processes 4 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no -m gossip_accel.bin.train_lm --config conf/lm.yaml \\
        --exp-dir exp/gossip_bmuf sync.algorithm=gossip_bmuf train.epochs=2

Every worker trains its own replica on its contiguous 1/n of the training stream (D^k).
``sync.enabled=false`` gives the plain DDP baseline (gradient all-reduce every step), whose
bytes are counted by a DDP comm hook with the same ring accounting as the synchronizer.
Writes ``summary.json``, TensorBoard scalars under ``tensorboard/`` and the final averaged
model ``final.pt`` to ``--exp-dir``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .. import shutdown
from ..comm import Counter
from ..config import ConfigError, apply_overrides
from ..data.lm import Vocabulary, batchify, bptt_windows, num_windows, read_lines, shard
from ..models.lstm_lm import LSTMPLanguageModel, frequency_cutoffs


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
class TrainConf:
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
    cpu: Optional[bool] = None


@dataclass
class LMConf:
    data: DataConf = field(default_factory=DataConf)
    model: ModelConf = field(default_factory=ModelConf)
    train: TrainConf = field(default_factory=TrainConf)
    sync: Any = field(default_factory=dict)


def load_conf(path: Optional[str], overrides: list[str]) -> LMConf:
    """YAML + dotlist overrides onto the schema; unknown keys/wrong types name the key."""
    try:
        base = OmegaConf.structured(LMConf)
        loaded = OmegaConf.load(path) if path else OmegaConf.create({})
        return apply_overrides(OmegaConf.merge(base, loaded), overrides)  # type: ignore[return-value]
    except FileNotFoundError as e:
        raise ConfigError(f"config file not found: {path}") from e
    except (OmegaConfBaseException, TypeError) as e:
        raise ConfigError(f"bad config {path or ''}: {e}") from e


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    table = {"adagrad": torch.optim.Adagrad, "sgd": torch.optim.SGD, "adam": torch.optim.Adam}
    if name not in table:
        raise ConfigError(f"train.optimizer={name!r}; choose one of {sorted(table)}")
    return table[name](params, lr=lr)


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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="YAML with data/model/train/sync sections")
    ap.add_argument("--exp-dir", required=True)
    ap.add_argument("overrides", nargs="*", help="dotlist overrides, e.g. sync.period=8 train.epochs=1")
    args = ap.parse_intermixed_args(argv)
    conf = load_conf(args.config, args.overrides)

    from accelerate import Accelerator
    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    from ..integrations.accelerate import AccelerateSynchronizer, counting_allreduce_hook
    from ..config import load_sync_config

    sync_cfg = load_sync_config(OmegaConf.to_container(conf.sync) or None)
    cpu = conf.train.cpu if conf.train.cpu is not None else not torch.cuda.is_available()
    accelerator = Accelerator(cpu=cpu)
    rank, world = accelerator.process_index, accelerator.num_processes
    exp = Path(args.exp_dir)
    if accelerator.is_main_process:
        exp.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(conf, exp / "config.yaml")

    data_dir = Path(conf.data.dir)
    vocab = Vocabulary.load(data_dir / conf.data.vocab)
    train_ids = shard(vocab.encode(read_lines(data_dir / conf.data.train)), rank, world)
    train = batchify(train_ids, conf.train.streams)
    valid = batchify(vocab.encode(read_lines(data_dir / conf.data.valid)), conf.train.streams)

    torch.manual_seed(conf.train.seed)
    m = conf.model
    if not 0 < m.projection_size < m.hidden_size:
        raise ConfigError(f"model.projection_size={m.projection_size} must be in (0, model.hidden_size={m.hidden_size})")
    cutoffs = frequency_cutoffs(vocab.counts, m.head_size, m.num_tails)
    model = LSTMPLanguageModel(len(vocab), cutoffs, m.embedding_dim, m.hidden_size, m.projection_size,
                               m.num_layers, m.dropout, m.div_value)
    n_params = sum(p.numel() for p in model.parameters())
    opt = make_optimizer(conf.train.optimizer, model.parameters(), conf.train.lr)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, conf.train.lr_decay)
    model, opt = accelerator.prepare(model, opt)

    ddp_counter = Counter()
    if sync_cfg.enabled:
        sync = AccelerateSynchronizer(accelerator, model, sync_cfg)
    else:
        sync = None
        if world > 1:
            model.register_comm_hook(ddp_counter, counting_allreduce_hook)

    train_windows = num_windows(train, conf.train.bptt)
    steps_per_epoch = min(train_windows, conf.train.max_steps_per_epoch or train_windows)
    writer = SummaryWriter(str(exp / "tensorboard")) if accelerator.is_main_process else None
    name = sync_cfg.algorithm if sync is not None else "ddp"
    accelerator.print(
        f"[train_lm] {name}: {world} workers, {n_params / 1e6:.2f}M parameters, vocab {len(vocab)}, "
        f"cutoffs {cutoffs}, {steps_per_epoch} steps/epoch/worker"
    )

    step, start, history = 0, time.perf_counter(), []
    for epoch in range(1, conf.train.epochs + 1):
        model.train()
        state, run_loss, run_n = None, 0.0, 0
        bar = tqdm(total=steps_per_epoch, desc=f"{name} epoch {epoch}", disable=not accelerator.is_main_process,
                   mininterval=2.0)
        for i, (x, y) in enumerate(bptt_windows(train, conf.train.bptt)):
            if i >= steps_per_epoch:
                break
            if state is not None:
                state = tuple(s.detach() for s in state)
            loss, state = model(x, y, state)
            opt.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), conf.train.clip_norm)
            opt.step()
            if sync is not None:
                sync.step()
            step += 1
            run_loss += float(loss.detach())
            run_n += 1
            bar.update(1)
            if writer is not None and step % conf.train.log_every == 0:
                writer.add_scalar("train/loss", run_loss / run_n, step)
                writer.add_scalar("train/lr", sched.get_last_lr()[0], step)
                for k, v in (sync.metrics() if sync else {"sync/bytes_sent": ddp_counter.bytes_sent}).items():
                    writer.add_scalar(k, v, step)
                bar.set_postfix(loss=f"{run_loss / run_n:.3f}")
        bar.close()
        sched.step()
        train_loss = torch.tensor([run_loss / max(run_n, 1)])
        replica_ppl = torch.tensor([perplexity(accelerator.unwrap_model(model), valid, conf.train.bptt)])
        if world > 1:
            torch.distributed.all_reduce(train_loss)
            torch.distributed.all_reduce(replica_ppl)
        row = {"epoch": epoch, "train_loss": float(train_loss) / world, "valid_ppl_replicas": float(replica_ppl) / world}
        history.append(row)
        accelerator.print(f"[train_lm] {name} epoch {epoch}: train loss {row['train_loss']:.4f}, "
                          f"valid ppl (mean of replicas) {row['valid_ppl_replicas']:.2f}")
        if writer is not None:
            writer.add_scalar("valid/ppl_replicas", row["valid_ppl_replicas"], step)

    train_seconds = time.perf_counter() - start
    if sync is not None:
        sync.finalize()  # Algorithm 1, line 20
        traffic = sync.comm.stats.total() if sync.comm else Counter()
    else:
        traffic = ddp_counter
    # mean over workers (gossip senders differ per rank; receivers get exactly q copies)
    moved = torch.tensor([traffic.bytes_sent, traffic.bytes_recv, traffic.seconds], dtype=torch.float64)
    if world > 1:
        torch.distributed.all_reduce(moved)
        moved /= world
    final = accelerator.unwrap_model(model)
    valid_ppl = perplexity(final, valid, conf.train.bptt)
    test_path = data_dir / conf.data.test
    test_ppl = perplexity(final, batchify(vocab.encode(read_lines(test_path)), conf.train.streams),
                          conf.train.bptt) if test_path.is_file() else None
    summary = {
        "algorithm": name, "workers": world, "parameters": n_params, "steps_per_worker": step,
        "train_seconds": train_seconds, "steps_per_second": step / train_seconds,
        "bytes_sent_per_step_per_worker": float(moved[0]) / max(step, 1),
        "bytes_recv_per_step_per_worker": float(moved[1]) / max(step, 1),
        "comm_seconds_per_worker": float(moved[2]), "final_valid_ppl": valid_ppl, "final_test_ppl": test_ppl,
        "history": history, "sync": OmegaConf.to_container(conf.sync),
    }
    if accelerator.is_main_process:
        (exp / "summary.json").write_text(json.dumps(summary, indent=2))
        torch.save(final.state_dict(), exp / "final.pt")
        if writer is not None:
            writer.add_scalar("valid/ppl_final", valid_ppl, step)
            writer.close()
    accelerator.print(
        f"[train_lm] {name} done: valid ppl {valid_ppl:.2f}"
        + (f", test ppl {test_ppl:.2f}" if test_ppl else "")
        + f", {summary['bytes_sent_per_step_per_worker'] / 1e6:.3f} MB sent/step/worker, "
        f"{summary['steps_per_second']:.2f} steps/s"
    )
    shutdown()


if __name__ == "__main__":
    main()
