"""Moved to :mod:`gossip_accel.sync.integrations.deepspeed`; this name is the same module object."""
import sys

from ..sync.integrations import deepspeed as _moved

sys.modules[__name__] = _moved
