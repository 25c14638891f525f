"""Optimizers: :class:`NGSGD`, SGD with Kaldi's online natural gradient for affine layers (003)."""
from .natural_gradient import OnlineNaturalGradient
from .ngsgd import NGSGD, kaldi_rank

__all__ = ["NGSGD", "OnlineNaturalGradient", "kaldi_rank"]
