"""gossip_accel."""
