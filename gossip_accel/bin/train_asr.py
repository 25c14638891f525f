"""Train a CTC acoustic model with the synchronizer, under ``accelerate launch`` or torchrun.

    utils/launch.sh --num-workers 4 -- -m gossip_accel.bin.train_asr --config conf/train_dnn.yaml \\
        --config conf/sync_bmuf.yaml --exp-dir exp/dnn_bmuf_n4 sync.algorithm=gossip_bmuf

Data: Kaldi dirs with ``feats.scp``, ``utt2num_frames`` and ``text`` (features of
gossip_accel.bin.compute_fbank), global CMVN (compute_cmvn) and a units dir (train_units).
Batches by length within a frame budget, deterministic per rank; ranks agree on the number
of steps of every epoch (one all-reduce) so that no sync round waits for a rank that ran out
of data. Learning-rate schedule of 001_3db6b3ddf1f13045.txt (section 3, "newbob"): keep the
rate while the CV loss drops by at least ``start_halving_impr`` (1%), then halve it every
epoch, stop when the CV loss drops by less than ``end_halving_impr`` (0.1%) or at
``max_epochs``; ``keep_lr_epochs`` first epochs keep the rate whatever the CV loss does
(Kaldi's ``keep_lr_iters``: the replicas of a distributed run need a few epochs before the
CV loss of their average is a fair signal), ``min_epochs`` is the fewest epochs before a stop. Writes ``results.json``, TensorBoard scalars, per-rank checkpoints at
epoch ends and every ``train.checkpoint_every_steps`` steps (a rerun or a launcher restart
resumes exactly: batch position, SpecAugment generator, RNG states) and the worker-averaged
``final.pt`` to ``--exp-dir``.
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
from ..data.asr import agree_on_steps, collate, epoch_batches, load_utterances, make_batches, spec_augment
from ..trainer import RunConf


@dataclass
class ASRDataConf:
    train: str = "data/train_clean_100"
    valid: str = "data/dev_clean"
    lang: str = "data/lang_bpe"
    cmvn: Optional[str] = None  # default: <train>/cmvn.ark
    max_frames: int = 20000  # padded frames per batch and worker
    max_utt_frames: int = 3000


@dataclass
class SpecAugmentConf:
    enabled: bool = False
    freq_masks: int = 2
    freq_width: int = 15
    time_masks: int = 2
    time_width: int = 40


@dataclass
class ASRModelConf:
    type: str = "dnn"  # dnn | cldnn | conformer
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ASRTrainConf(RunConf):
    max_epochs: int = 20
    min_epochs: int = 1
    keep_lr_epochs: int = 0
    optimizer: str = "adam"            # adam | adamw | sgd | adagrad | ngsgd (Kaldi NG-SGD)
    lr: float = 1e-3
    weight_decay: float = 0.0
    clip_norm: float = 5.0
    start_halving_impr: float = 0.01
    end_halving_impr: float = 0.001
    halving_factor: float = 0.5
    seed: int = 1
    max_steps_per_epoch: Optional[int] = None
    log_every: int = 20


@dataclass
class ASRConf:
    data: ASRDataConf = field(default_factory=ASRDataConf)
    specaugment: SpecAugmentConf = field(default_factory=SpecAugmentConf)
    model: ASRModelConf = field(default_factory=ASRModelConf)
    train: ASRTrainConf = field(default_factory=ASRTrainConf)
    sync: Any = field(default_factory=dict)


def load_conf(paths: list[str], overrides: list[str]) -> ASRConf:
    from ..trainer import load_structured

    return load_structured(ASRConf, paths, overrides)


def build_model(conf: ASRConf, feat_dim: int, vocab_size: int) -> torch.nn.Module:
    from ..models.asr import build_acoustic_model

    return build_acoustic_model(conf.model.type, feat_dim, vocab_size, OmegaConf.to_container(conf.model.options))


def feature_dim(utt) -> int:
    import kaldiio

    return int(kaldiio.load_mat(utt.feats).shape[1])


def load_cmvn(conf: ASRConf) -> tuple[torch.Tensor, torch.Tensor]:
    from ..data.features import load_global_cmvn

    path = Path(conf.data.cmvn or Path(conf.data.train) / "cmvn.ark")
    mean, std = load_global_cmvn(path)
    return torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(std, dtype=torch.float32)


def ctc_loss_sum(model, batch: dict, ctc: torch.nn.CTCLoss, feats: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Summed CTC loss of a batch (divide by ``batch['target_lengths'].sum()`` for per-token)."""
    logp, olens = model(batch["feats"] if feats is None else feats, batch["lengths"])
    return ctc(logp.transpose(0, 1), batch["targets"], olens, batch["target_lengths"])


@torch.no_grad()
def cv_loss(model, batches, cmvn, ctc) -> tuple[float, float]:
    """(summed CTC loss, number of target tokens) over ``batches``."""
    was = model.training
    model.eval()
    total, tokens = 0.0, 0.0
    for b in batches:
        batch = collate(b, cmvn)
        total += float(ctc_loss_sum(model, batch, ctc))
        tokens += float(batch["target_lengths"].sum())
    model.train(was)
    return total, tokens


class NewBob:
    """The learning-rate schedule of 001 section 3 (Kaldi's "newbob"), with Kaldi's keep_lr_iters."""

    def __init__(self, start_impr: float, end_impr: float, factor: float, min_epochs: int, keep_lr_epochs: int = 0):
        self.start_impr, self.end_impr, self.factor, self.min_epochs = start_impr, end_impr, factor, min_epochs
        self.keep_lr_epochs = keep_lr_epochs
        self.best: Optional[float] = None
        self.halving = False

    def update(self, epoch: int, cv: float, optimizer) -> bool:
        """Record the epoch's CV loss, adjust the rate; returns True when training should stop."""
        impr = math.inf if self.best is None else (self.best - cv) / abs(self.best)
        self.best = cv if self.best is None else min(self.best, cv)
        stop = False
        if self.halving:
            stop = impr < self.end_impr and epoch >= self.min_epochs
        elif impr < self.start_impr and epoch > self.keep_lr_epochs:
            self.halving = True
        if self.halving and not stop:
            for g in optimizer.param_groups:
                g["lr"] *= self.factor
        return stop

    def state_dict(self) -> dict:
        return {"best": self.best, "halving": self.halving}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.halving = state["best"], state["halving"]


def main(argv: Optional[list[str]] = None) -> None:
    from ..trainer import entry_args

    args = entry_args(__doc__, argv)
    conf = load_conf(args.config, args.overrides)

    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    from ..sync.config import load_sync_config
    from ..trainer import DistributedRun, make_optimizer, run_options

    sync_cfg = load_sync_config(OmegaConf.to_container(conf.sync) or None)
    from ..data.units import Tokenizer

    tok = Tokenizer(conf.data.lang)  # its error names the missing bpe.model and the stage to run
    train_utts, dropped = load_utterances(Path(conf.data.train), tok.encode, conf.data.max_utt_frames)
    valid_utts, _ = load_utterances(Path(conf.data.valid), tok.encode, conf.data.max_utt_frames)
    cmvn = load_cmvn(conf)
    torch.manual_seed(conf.train.seed)
    model = build_model(conf, feature_dim(train_utts[0]), tok.vocab_size)
    n_params = sum(p.numel() for p in model.parameters())
    opt = make_optimizer(conf.train.optimizer, model, conf.train.lr, conf.train.weight_decay)
    run = DistributedRun(model, opt, sync_cfg, Path(args.exp_dir), **run_options(conf.train))
    if run.is_main:
        OmegaConf.save(conf, run.exp / "config.yaml")
    name = args.name or run.default_name()
    ctc = torch.nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)
    train_batches = make_batches(train_utts, conf.data.max_frames)
    valid_batches = make_batches(valid_utts, conf.data.max_frames)[run.rank::run.world]
    schedule = NewBob(conf.train.start_halving_impr, conf.train.end_halving_impr, conf.train.halving_factor,
                      conf.train.min_epochs, conf.train.keep_lr_epochs)
    first_epoch, extra = run.resume(conf.train.resume)
    history, train_seconds = extra.get("history", []), extra.get("train_seconds", 0.0)
    if "schedule" in extra:
        schedule.load_state_dict(extra["schedule"])
    stopped = extra.get("stopped", False)
    writer = SummaryWriter(str(run.exp / "tensorboard")) if run.is_main else None
    run.accelerator.print(
        f"[train_asr] {name}: {run.world} workers, {conf.model.type} {n_params / 1e6:.2f}M parameters, "
        f"{tok.vocab_size} units, {len(train_utts)} training utterances in {len(train_batches)} batches "
        f"(left out: {dropped}), {run.describe_sync()}")

    for epoch in range(first_epoch, conf.train.max_epochs + 1):
        if stopped:
            break
        start = time.perf_counter()
        mine = epoch_batches(train_batches, epoch, conf.train.seed, run.rank, run.world)
        steps = agree_on_steps(min(len(mine), conf.train.max_steps_per_epoch or len(mine)))
        gen = torch.Generator().manual_seed(conf.train.seed * 1_000_003 + epoch * 101 + run.rank)
        run.model.train()
        skip = run.start_batch(epoch)
        mid = extra.get("epoch_state", {}) if skip else {}  # resumed inside this epoch
        loss_sum, tok_sum = mid.get("loss", 0.0), mid.get("tokens", 0.0)
        if "generator" in mid:
            gen.set_state(mid["generator"])
        bar = tqdm(total=steps, initial=skip, desc=f"{name} epoch {epoch}", disable=not run.is_main, mininterval=2.0)
        for i, b in enumerate(mine[:steps]):
            if i < skip:
                continue
            batch = collate(b, cmvn)
            x = batch["feats"]
            if conf.specaugment.enabled:
                s = conf.specaugment
                x = spec_augment(x, batch["lengths"], s.freq_masks, s.freq_width, s.time_masks, s.time_width, gen)
            loss = ctc_loss_sum(run.model, batch, ctc, x)
            ntok = float(batch["target_lengths"].sum())
            run.optimizer.zero_grad(set_to_none=True)
            run.accelerator.backward(loss / ntok)
            run.accelerator.clip_grad_norm_(run.model.parameters(), conf.train.clip_norm)
            run.optimizer.step()
            run.after_step()
            loss_sum += float(loss.detach())
            tok_sum += ntok
            bar.update(1)
            if writer is not None and run.step % conf.train.log_every == 0:
                writer.add_scalar("train/ctc_per_token", loss_sum / tok_sum, run.step)
                writer.add_scalar("train/lr", run.optimizer.param_groups[0]["lr"], run.step)
                for k, v in run.metrics().items():
                    writer.add_scalar(k, v, run.step)
                bar.set_postfix(loss=f"{loss_sum / tok_sum:.3f}")
            run.save_step(epoch, i + 1, steps, lambda: {
                "history": history, "train_seconds": train_seconds + time.perf_counter() - start,
                "schedule": schedule.state_dict(), "stopped": False,
                "epoch_state": {"loss": loss_sum, "tokens": tok_sum, "generator": gen.get_state()}})
        bar.close()
        train_seconds += time.perf_counter() - start
        cv_total, cv_tokens = cv_loss(run.core, valid_batches, cmvn, ctc)
        tr_total, tr_tokens, cv_total, cv_tokens = run.all_mean([loss_sum, tok_sum, cv_total, cv_tokens])
        cv = cv_total / max(cv_tokens, 1)
        lr = run.optimizer.param_groups[0]["lr"]
        row = {"epoch": epoch, "step": run.step, "steps": steps, "lr": lr,
               "train_loss": tr_total / max(tr_tokens, 1), "cv_loss_replicas": cv}
        stopped = schedule.update(epoch, cv, run.optimizer)
        history.append(row)
        run.accelerator.print(f"[train_asr] {name} epoch {epoch}: {steps} steps, lr {lr:.2e}, train CTC/token "
                              f"{row['train_loss']:.4f}, CV CTC/token (mean of replicas) {cv:.4f}"
                              + (" -> stop" if stopped else ""))
        if writer is not None:
            writer.add_scalar("valid/ctc_per_token_replicas", cv, run.step)
        run.save(epoch, {"history": history, "train_seconds": train_seconds, "schedule": schedule.state_dict(),
                         "stopped": stopped})

    run.finish()
    cv_total, cv_tokens = run.all_mean(list(cv_loss(run.core, valid_batches, cmvn, ctc)))
    results = {**run.results(name, n_params, len(history), train_seconds, history), "model": conf.model.type,
               "final_cv_loss": cv_total / max(cv_tokens, 1)}
    run.save_final()
    if run.is_main:
        (run.exp / "results.json").write_text(json.dumps(results, indent=2))
        if writer is not None:
            writer.close()
    run.accelerator.print(f"[train_asr] {name} done: CV CTC/token of the averaged model {results['final_cv_loss']:.4f}, "
                          f"{results['bytes_sent_per_step_per_worker'] / 1e6:.3f} MB sent/step/worker")
    shutdown()


if __name__ == "__main__":
    main()
