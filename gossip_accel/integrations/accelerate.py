"""Moved to :mod:`gossip_accel.sync.integrations.accelerate`; this name is the same module object."""
import sys

from ..sync.integrations import accelerate as _moved

sys.modules[__name__] = _moved
