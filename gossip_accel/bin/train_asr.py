"""Train a CTC acoustic model with the synchronizer, under ``accelerate launch`` or torchrun.

    utils/launch.sh --num-workers 4 -- -m gossip_accel.bin.train_asr --config conf/train_dnn.yaml \\
        --config conf/sync_bmuf.yaml --exp-dir exp/dnn_bmuf_n4 sync.algorithm=gossip_bmuf

Data: Kaldi dirs with ``feats.scp``, ``utt2num_frames`` and ``text`` (features of
gossip_accel.bin.compute_fbank), global CMVN (compute_cmvn) and a units dir (train_units).
Batches by length within a frame budget, deterministic per rank; ranks agree on the number
of steps of every epoch (one all-reduce, gossip_accel.train.loop) so that no sync round waits
for a rank that ran out of data. Learning-rate schedule of 001_3db6b3ddf1f13045.txt (section
3, "newbob"): keep the rate while the CV loss drops by at least ``start_halving_impr`` (1%),
then halve it every epoch, stop when the CV loss drops by less than ``end_halving_impr``
(0.1%) or at ``max_epochs``; ``keep_lr_epochs`` first epochs keep the rate whatever the CV
loss does (Kaldi's ``keep_lr_iters``: the replicas of a distributed run need a few epochs
before the CV loss of their average is a fair signal), ``min_epochs`` is the fewest epochs
before a stop; the schedule reads the mean of the replicas' CV losses. Writes
``results.json`` (per-epoch history with the CV loss of the replicas' average, ``cv_loss``,
and the mean of the replicas', ``cv_loss_replicas``), TensorBoard scalars, per-rank
checkpoints at epoch ends and every ``train.checkpoint_every_steps`` steps (a rerun or a
launcher restart resumes exactly: batch position, the SpecAugment and VTLP generator, RNG states) and the
worker-averaged ``final.pt`` to ``--exp-dir``. The epoch loop is gossip_accel.train.loop's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import OmegaConf

from ..data.asr import collate, epoch_batches, load_utterances, make_batches, spec_augment, vtlp
from ..data.cmvn import FeatureNorm, load_global_cmvn
from ..sync.config import ConfigError
from ..train import loop
from ..train.elastic import batches_done, steps_done
from ..train.config import RunConf, load_structured
from ..train.optimizers import make_optimizer


@dataclass
class ASRDataConf:
    train: str = "data/train_clean_100"
    valid: str = "data/dev_clean"
    lang: str = "data/lang_bpe"
    cmvn: Optional[str] = None  # default: <train>/cmvn.ark
    utterance_cmn: bool = False  # after the global CMVN, subtract each utterance's mean (data.cmvn.FeatureNorm)
    utterance_cvn: bool = False  # and divide by each utterance's standard deviation (needs utterance_cmn)
    # the mean (and standard deviation) above over all the utterance's speaker's utterances instead (utt2spk; Kaldi's
    # apply-cmvn --utt2spk), from each data dir's cmvn_spk.ark (compute_cmvn --per-speaker, stage 2)
    speaker_cmvn: bool = False
    max_frames: int = 20000  # padded frames per batch and worker
    # padded frames of one step of all the workers together (ESPnet's global batch_bins): each worker's batches hold
    # frames_per_step / workers instead of max_frames, so one worker learns from DDP's batch of N workers
    frames_per_step: Optional[int] = None
    max_utt_frames: int = 3000


@dataclass
class SpecAugmentConf:
    enabled: bool = False
    freq_masks: int = 2
    freq_width: int = 15
    time_masks: int = 2
    time_width: int = 40


@dataclass
class VTLPConf:
    """Vocal tract length perturbation of the training features (``data.asr.vtlp``): each utterance warped by a
    factor drawn uniformly from [1 - max_warp, 1 + max_warp] (Jaitly & Hinton 2013: 0.9-1.1)."""

    enabled: bool = False
    max_warp: float = 0.1
    sample_rate: float = 16000.0  # the features' (8000 for Switchboard); the fbank's default band, 20 Hz to Nyquist


@dataclass
class ASRModelConf:
    type: str = "dnn"  # dnn | cldnn | conformer
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ASRTrainConf(RunConf):
    """The newbob schedule's keys (see the module docstring); the rest are RunConf's."""

    max_epochs: int = 20
    min_epochs: int = 1
    keep_lr_epochs: int = 0
    start_halving_impr: float = 0.01
    end_halving_impr: float = 0.001
    halving_factor: float = 0.5
    save_epoch_models: bool = True  # for checkpoint averaging (the ASR recipes' stage 6: --avg, --avg-mode)


@dataclass
class ASRConf:
    data: ASRDataConf = field(default_factory=ASRDataConf)
    specaugment: SpecAugmentConf = field(default_factory=SpecAugmentConf)
    vtlp: VTLPConf = field(default_factory=VTLPConf)
    model: ASRModelConf = field(default_factory=ASRModelConf)
    train: ASRTrainConf = field(default_factory=ASRTrainConf)
    sync: Any = field(default_factory=dict)


def load_conf(paths: list[str], overrides: list[str]) -> ASRConf:
    conf = load_structured(ASRConf, paths, overrides)
    if conf.data.frames_per_step is not None and conf.data.frames_per_step < 1:
        raise ConfigError(f"data.frames_per_step={conf.data.frames_per_step}: must be >= 1 (or null: data.max_frames "
                          "per worker)")
    return conf


def worker_frames(data: ASRDataConf, world: int) -> int:
    """Padded frames of one worker's batch: ``data.frames_per_step`` shared by the ``world`` workers when set
    (at least one frame each), else ``data.max_frames``."""
    return max(1, data.frames_per_step // world) if data.frames_per_step else data.max_frames


def build_model(conf: ASRConf, feat_dim: int, vocab_size: int) -> torch.nn.Module:
    from ..models.asr import build_acoustic_model

    return build_acoustic_model(conf.model.type, feat_dim, vocab_size, OmegaConf.to_container(conf.model.options))


def feature_dim(utt) -> int:
    import kaldiio

    return int(kaldiio.load_mat(utt.feats).shape[1])


def load_cmvn(conf: ASRConf) -> FeatureNorm:
    """The feature normalization of a run: its training set's global CMVN, per utterance (or speaker: call its
    ``add_speakers`` for each data dir) mean and variance if set."""
    mean, std = load_global_cmvn(Path(conf.data.cmvn or Path(conf.data.train) / "cmvn.ark"))
    try:
        return FeatureNorm(mean, std, conf.data.utterance_cmn, conf.data.utterance_cvn,
                           per_speaker=conf.data.speaker_cmvn)
    except ValueError as e:
        key = "data.speaker_cmvn" if conf.data.speaker_cmvn and not conf.data.utterance_cvn else "data.utterance_cvn"
        raise ConfigError(f"{key}: {e}") from None


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


class ASRTask(loop.Task):
    """CTC on length-sorted batches (every n-th of a seeded shuffle per epoch), VTLP, SpecAugment, newbob."""

    tag, loss_label, loss_scalar = "train_asr", "CTC/token", "train/ctc_per_token"
    valid_key, valid_label, valid_scalar, valid_format = "cv_loss", "CV CTC/token", "valid/ctc_per_token", ".4f"

    def __init__(self, conf: ASRConf, rank: int, world: int):
        from ..data.units import load_units

        tok = load_units(conf.data.lang)  # its error names the missing bpe.model and the stage to run
        train_utts, self.dropped = load_utterances(Path(conf.data.train), tok.encode, conf.data.max_utt_frames)
        valid_utts, _ = load_utterances(Path(conf.data.valid), tok.encode, conf.data.max_utt_frames)
        self.cmvn = load_cmvn(conf)
        for data_dir in (conf.data.train, conf.data.valid):
            self.cmvn.add_speakers(data_dir)
        torch.manual_seed(conf.train.seed)
        self.model = build_model(conf, feature_dim(train_utts[0]), tok.vocab_size)
        self.optimizer = make_optimizer(conf.train.optimizer, self.model, conf.train.lr, conf.train.weight_decay)
        self.ctc = torch.nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)
        frames = worker_frames(conf.data, world)
        self.train_batches = make_batches(train_utts, frames)
        self.valid_batches = make_batches(valid_utts, frames)[rank::world]
        t = conf.train
        self.schedule = NewBob(t.start_halving_impr, t.end_halving_impr, t.halving_factor, t.min_epochs,
                               t.keep_lr_epochs)
        self.conf, self.rank, self.world, self.vocab_size, self.n_train = conf, rank, world, tok.vocab_size, len(train_utts)

    def describe(self) -> str:
        return (f"{self.conf.model.type}, {self.vocab_size} units, {self.n_train} training utterances in "
                f"{len(self.train_batches)} batches (left out: {self.dropped})")

    def batches(self, epoch: int) -> list:
        return epoch_batches(self.train_batches, epoch, self.conf.train.seed, self.rank, self.world)

    def rest_of_epoch(self, epoch: int, segments) -> list:
        """Elastic resume: the shuffled list after the n x d batches each segment consumed, every m-th. With
        ``data.frames_per_step`` a batch's size depends on the workers: the list resumes after d x m of this run's
        batches, the frames the segments consumed (exact when m = n; across worker counts the two lists differ,
        so some utterances of that epoch are seen twice or not at all)."""
        start = steps_done(segments) * self.world if self.conf.data.frames_per_step else batches_done(segments)
        return epoch_batches(self.train_batches, epoch, self.conf.train.seed, self.rank, self.world, start=start)

    def begin_epoch(self, epoch: int, saved: dict) -> None:
        self.gen = torch.Generator().manual_seed(self.conf.train.seed * 1_000_003 + epoch * 101 + self.rank)
        if "generator" in saved:
            self.gen.set_state(saved["generator"])
        self.loss_sum, self.tokens = saved.get("loss", 0.0), saved.get("tokens", 0.0)

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        b = collate(batch, self.cmvn, self.warp_features if self.conf.vtlp.enabled else None)
        x = b["feats"]
        if self.conf.specaugment.enabled:
            s = self.conf.specaugment
            x = spec_augment(x, b["lengths"], s.freq_masks, s.freq_width, s.time_masks, s.time_width, self.gen)
        loss = ctc_loss_sum(model, b, self.ctc, x)
        ntok = float(b["target_lengths"].sum())
        self.loss_sum += float(loss.detach())
        self.tokens += ntok
        return loss / ntok

    def warp_features(self, feats: torch.Tensor) -> torch.Tensor:
        """One utterance's features warped by VTLP with a factor drawn from the epoch's generator."""
        v = self.conf.vtlp
        factor = 1.0 + v.max_warp * (2.0 * float(torch.rand((), generator=self.gen)) - 1.0)
        return vtlp(feats, factor, sample_rate=v.sample_rate)

    def running_loss(self) -> float:
        return self.loss_sum / max(self.tokens, 1)

    def epoch_state(self) -> dict:
        return {"loss": self.loss_sum, "tokens": self.tokens, "generator": self.gen.get_state()}

    def train_measure(self) -> tuple[float, float]:
        return self.loss_sum, self.tokens

    def validate(self, model: torch.nn.Module) -> tuple[float, float]:
        return cv_loss(model, self.valid_batches, self.cmvn, self.ctc)

    def end_epoch(self, epoch: int, row: dict) -> None:
        # newbob reads the replicas' mean CV loss, as it did before the averaged model was validated too
        self.stopped = self.schedule.update(epoch, row["cv_loss_replicas"], self.optimizer)

    def state_dict(self) -> dict:
        return {"schedule": self.schedule.state_dict(), "stopped": self.stopped}

    def load_state_dict(self, extra: dict) -> None:
        if "schedule" in extra:
            self.schedule.load_state_dict(extra["schedule"])
        self.stopped = extra.get("stopped", False)

    def results(self) -> dict:
        return {"model": self.conf.model.type}


def main(argv: Optional[list[str]] = None) -> None:
    loop.main(__doc__, argv, load_conf, ASRTask, epochs=lambda conf: conf.train.max_epochs)


if __name__ == "__main__":
    main()
