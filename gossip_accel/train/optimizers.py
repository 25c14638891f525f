"""``train.optimizer``: the inner optimizer of every worker, by name."""
from __future__ import annotations

import torch

from ..sync.config import ConfigError

OPTIMIZERS = ("adagrad", "adam", "adamw", "ngsgd", "sgd")


def make_optimizer(name: str, model, lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """The optimizer ``train.optimizer`` names, for ``model`` (an ``nn.Module``; the torch
    optimizers also take an iterable of parameters). ``ngsgd`` is Kaldi's NG-SGD
    (:class:`gossip_accel.train.ngsgd.NGSGD`) on the model's ``nn.Linear`` layers, plain SGD elsewhere."""
    if name not in OPTIMIZERS:
        raise ConfigError(f"train.optimizer={name!r}; choose one of {', '.join(OPTIMIZERS)}")
    if name == "ngsgd":
        from .ngsgd import NGSGD

        if not isinstance(model, torch.nn.Module):
            raise ConfigError("train.optimizer=ngsgd needs the model (its nn.Linear layers), not a parameter list")
        return NGSGD(model, lr=lr, weight_decay=weight_decay)
    params = model.parameters() if isinstance(model, torch.nn.Module) else model
    table = {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
    return table[name](params, lr=lr, weight_decay=weight_decay)
