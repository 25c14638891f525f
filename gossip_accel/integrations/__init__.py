"""Moved to :mod:`gossip_accel.sync.integrations`; ``gossip_accel.integrations.accelerate`` and
``gossip_accel.integrations.deepspeed`` still import (they are the same module objects)."""
