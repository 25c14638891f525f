"""A training entry point with an injected fault: ``python fault_train.py lm|asr <trainer args>``.

The faults come from the environment: ``GOSSIP_FAULT="<signal>@<step>:rank<r>[,...]"`` (e.g.
``KILL@7:rank1`` or ``KILL@7:rank1,STOP@9:rank2``): in attempt i of the job
(``TORCHELASTIC_RESTART_COUNT`` = i) the i-th fault fires: worker ``r`` sends itself the real
signal right after its optimizer step ``<step>``; attempts after the last fault run clean.
SIGKILL is a worker that dies (``kill -9``), SIGSTOP one that hangs. Everything else is the
unchanged trainer.
"""
from __future__ import annotations

import os
import re
import signal
import sys

from gossip_accel.train import run as trainer_run


def install(specs: str) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    faults = specs.split(",")
    if attempt >= len(faults):
        return
    m = re.fullmatch(r"(KILL|STOP)@(\d+):rank(\d+)", faults[attempt])
    if not m:
        raise SystemExit(f"GOSSIP_FAULT={specs!r}: expected e.g. KILL@7:rank1 or KILL@7:rank1,STOP@9:rank2")
    sig, step, rank = getattr(signal, "SIG" + m.group(1)), int(m.group(2)), int(m.group(3))
    after_step = trainer_run.DistributedRun.after_step

    def faulty_after_step(self) -> None:
        after_step(self)
        if self.rank == rank and self.step == step:
            print(f"[fault] rank {rank} sends itself SIG{m.group(1)} after step {step}", flush=True)
            os.kill(os.getpid(), sig)

    trainer_run.DistributedRun.after_step = faulty_after_step


if __name__ == "__main__":
    if os.environ.get("GOSSIP_FAULT"):
        install(os.environ["GOSSIP_FAULT"])
    which, args = sys.argv[1], sys.argv[2:]
    if which == "lm":
        from gossip_accel.bin.train_lm import main
    elif which == "asr":
        from gossip_accel.bin.train_asr import main
    else:
        raise SystemExit(f"first argument: lm or asr, got {which!r}")
    main(args)
