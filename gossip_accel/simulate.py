"""Moved to :mod:`gossip_accel.sync.simulate`; kept for the ``gossip-simulate`` entry point of
pyproject.toml and ``python -m gossip_accel.simulate``."""
from .sync.simulate import main

if __name__ == "__main__":
    main()
