"""Glue to training frameworks: Accelerate (DDP, and its DeepSpeed plugin) and DeepSpeed engines."""
