"""Glue to training frameworks: Accelerate (DDP) now; DeepSpeed and hierarchical later."""
