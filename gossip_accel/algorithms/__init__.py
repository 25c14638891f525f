"""Pure update rules: tensors in, tensors out; no I/O and no torch.distributed.

Each rule is applied per component i on the flat vector theta_i once the (neighbourhood)
average theta_bar_i of Algorithm 1 line 8 is known. See docs/ALGORITHMS.md.
"""
from .bmuf import BMUFSlots, bmuf_update, block_momentum_from_rule
from .ma import ma_update
from .rule import new_local_model

__all__ = ["BMUFSlots", "bmuf_update", "block_momentum_from_rule", "ma_update", "new_local_model"]
