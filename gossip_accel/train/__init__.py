"""The training toolkit's room: what every trainer (gossip_accel.bin.train_lm, train_asr) shares.

    config.py         load_structured (YAML + dotlist onto a dataclass), RunConf (the shared
                      ``train.*`` keys), entry_args (the command line), warm-up in epochs
    optimizers.py     make_optimizer: ``train.optimizer`` by name (torch optimizers, NG-SGD)
    ngsgd.py, natural_gradient.py   Kaldi's NG-SGD (003)
    process_group.py  joining the launcher's process group, the Accelerator
    collectives.py    the trainer's own collectives, each under faults.guard (steps agreement,
                      epoch statistics, the replicas' average for validation)
    checkpoint.py     per-rank checkpoint files: atomic, checksummed, pruned, agreed on
    run.py            DistributedRun: the prepared model, the synchronizer (or DDP), checkpoints
    describe.py       the sync settings of a run (log line, results.json), the periods label
    loop.py           the epoch loop (Task: what a trainer supplies; train(): everything else)

Nothing is imported here, so that ``import gossip_accel.train.config`` stays light.
"""
