"""Command-line entry points called by the recipes (python -m gossip_accel.bin.<name>)."""
