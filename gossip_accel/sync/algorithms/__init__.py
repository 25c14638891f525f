"""Pure update rules: tensors in, tensors out; no I/O and no torch.distributed.

Each rule is applied per component i on the flat vector theta_i once the (neighbourhood)
average theta_bar_i of Algorithm 1 line 8 is known (MA, BMUF, an outer optimizer), or with the server's centre
variable (EASGD, ASGD) or the ring partner's copy (ADPSGD). See docs/ALGORITHMS.md.
"""
from .adpsgd import delayed_average, pair_average, passive_absorb
from .asgd import StalenessStats, asgd_delta, asgd_server_update, ssp_may_proceed, staleness_bound
from .bmuf import BMUFSlots, bmuf_update, block_momentum_from_rule
from .easgd import elastic_center_update_sync, elastic_exchange, elastic_worker_update
from .ma import ma_update
from .outer import OuterSlots, outer_update
from .rule import Slots, new_local_model, start_slots

__all__ = [
    "BMUFSlots", "StalenessStats", "asgd_delta", "asgd_server_update", "block_momentum_from_rule", "bmuf_update",
    "delayed_average", "elastic_center_update_sync", "elastic_exchange", "elastic_worker_update", "ma_update",
    "new_local_model", "OuterSlots", "outer_update", "pair_average", "passive_absorb", "Slots", "ssp_may_proceed",
    "staleness_bound", "start_slots",
]
