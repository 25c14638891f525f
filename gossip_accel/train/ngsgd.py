"""NG-SGD: SGD whose affine layers (``nn.Linear``) take Kaldi's natural-gradient step.

    opt = NGSGD(model, lr=0.01, momentum=0.9)      # Kaldi's defaults: ranks 20/80, alpha 4, S 2000, period 4
    loss.backward(); opt.step(); opt.zero_grad()

For every ``nn.Linear`` of ``model`` a forward hook keeps the layer's input X (rows: every
position of every sequence of the minibatch) and a hook on its output keeps the derivative
dY of the loss. At ``step()`` the two are preconditioned separately by the layer's input and
output :class:`~gossip_accel.train.natural_gradient.OnlineNaturalGradient` (the input gets a
column of ones for the bias, as Kaldi's NaturalGradientAffineComponent does), and the
layer's gradient is replaced by

    [dW  db] = gamma_in gamma_out  dY^^T [X^  1^]

(dY^T [X 1] without preconditioning: the ordinary gradient). The step itself is torch's SGD
(momentum, weight decay, Nesterov), so every other parameter (embeddings, LSTMs, norms) takes a
plain SGD step, as Kaldi's non-affine components do. Each worker preconditions its own local
gradient: this is how Kaldi nnet2/nnet3 trains with periodic model averaging (003) and how it
combines with MA, BMUF and gossip here. Do not combine it with DDP's gradient all-reduce (the
hooks see the local activations only): use it with a synchronizer.

Layers whose weight is also used outside their own ``forward`` (tied weights) must be
excluded (``exclude=[...]``): their gradient is not dY^T X.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn

from .natural_gradient import OnlineNaturalGradient


def kaldi_rank(dim: int, rank: int) -> int:
    """Kaldi nnet3: rank = min(rank, (dim + 1) / 2)."""
    return max(1, min(rank, (dim + 1) // 2))


class _LayerState:
    def __init__(self, layer: nn.Linear, rank_in: int, rank_out: int, update_period: int,
                 num_samples_history: float, alpha: float):
        self.layer = layer
        self.pre_in = OnlineNaturalGradient(kaldi_rank(layer.in_features, rank_in), update_period,
                                            num_samples_history, alpha)
        self.pre_out = OnlineNaturalGradient(kaldi_rank(layer.out_features, rank_out), update_period,
                                             num_samples_history, alpha)
        self.captured: list[list] = []  # [input rows, output-derivative rows or None]


class NGSGD(torch.optim.SGD):
    """torch.optim.SGD with Kaldi's online natural gradient for the ``nn.Linear`` layers of ``model``."""

    def __init__(self, model: nn.Module, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, rank_in: int = 20, rank_out: int = 80,
                 alpha: float = 4.0, num_samples_history: float = 2000.0, update_period: int = 4,
                 max_change: Optional[float] = None, exclude: Iterable[nn.Module] = (),
                 params: Optional[Iterable[torch.nn.Parameter]] = None):
        super().__init__(model.parameters() if params is None else params, lr=lr, momentum=momentum,
                         dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)
        self.defaults.update(rank_in=rank_in, rank_out=rank_out, alpha=alpha, num_samples_history=num_samples_history,
                             update_period=update_period, max_change=max_change)
        self.max_change = max_change
        skip = {id(m) for m in exclude}
        in_opt = {id(p) for g in self.param_groups for p in g["params"]}
        self._layers: list[_LayerState] = []
        self._handles = []
        for module in model.modules():
            if (isinstance(module, nn.Linear) and id(module) not in skip and module.weight.requires_grad
                    and id(module.weight) in in_opt):
                st = _LayerState(module, rank_in, rank_out, update_period, num_samples_history, alpha)
                self._layers.append(st)
                self._handles.append(module.register_forward_hook(self._make_hook(st)))

    @staticmethod
    def _make_hook(st: _LayerState):
        def hook(module, inputs, output):
            if not torch.is_grad_enabled() or not output.requires_grad:
                return
            entry = [inputs[0].detach(), None]
            st.captured.append(entry)

            def grad_hook(grad):
                entry[1] = grad.detach() if entry[1] is None else entry[1] + grad.detach()

            output.register_hook(grad_hook)
        return hook

    @property
    def layers(self) -> list[nn.Linear]:
        return [st.layer for st in self._layers]

    def preconditioners(self, layer: nn.Linear) -> tuple[OnlineNaturalGradient, OnlineNaturalGradient]:
        """(input, output) preconditioners of ``layer``."""
        for st in self._layers:
            if st.layer is layer:
                return st.pre_in, st.pre_out
        raise KeyError("not a natural-gradient layer of this optimizer")

    @torch.no_grad()
    def precondition_gradients(self) -> None:
        """Replace each layer's gradient by the natural-gradient direction of its captured minibatch."""
        for st in self._layers:
            pairs = [(x, g) for x, g in st.captured if g is not None]
            st.captured.clear()
            layer = st.layer
            if not pairs or layer.weight.grad is None:
                continue
            X = torch.cat([x.reshape(-1, layer.in_features) for x, _ in pairs]).float()
            dY = torch.cat([g.reshape(-1, layer.out_features) for _, g in pairs]).float()
            X1 = torch.cat([X, torch.ones(X.shape[0], 1, dtype=X.dtype, device=X.device)], dim=1)
            X_hat, scale_in = st.pre_in.precondition(X1)
            dY_hat, scale_out = st.pre_out.precondition(dY)
            scale = scale_in * scale_out
            grad = (dY_hat.T @ X_hat).mul_(scale)          # out x (in + 1)
            if self.max_change is not None:
                lr = self.param_groups[0]["lr"]
                norm = float(torch.linalg.vector_norm(grad)) * lr
                if norm > self.max_change:
                    grad.mul_(self.max_change / norm)
            layer.weight.grad.copy_(grad[:, :-1].to(layer.weight.grad.dtype))
            if layer.bias is not None and layer.bias.grad is not None:
                layer.bias.grad.copy_(grad[:, -1].to(layer.bias.grad.dtype))

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.precondition_gradients()
        super().step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Also forget the captured minibatches whose gradients are being discarded; keep those whose
        backward has not run yet (``out = model(x); opt.zero_grad(); out.backward()`` is common)."""
        for st in self._layers:
            st.captured[:] = [e for e in st.captured if e[1] is None]
        super().zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["natural_gradient"] = [{"in": st.pre_in.state_dict(), "out": st.pre_out.state_dict()}
                                     for st in self._layers]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        ng = state_dict.pop("natural_gradient", None)
        super().load_state_dict(state_dict)
        if ng is not None:
            if len(ng) != len(self._layers):
                raise ValueError(f"checkpoint has {len(ng)} natural-gradient layers, this model {len(self._layers)}")
            for st, s in zip(self._layers, ng):
                st.pre_in.load_state_dict(s["in"])
                st.pre_out.load_state_dict(s["out"])

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
