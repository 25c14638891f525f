"""Exit bench: how often a 4-worker gloo launch fails at exit, after its work is done.

    . path.sh
    nice -n 5 python bench/exit_loop.py --label before                 # 100 launches of the user loop
    nice -n 5 python bench/exit_loop.py --label after --runs 200 --variants user_loop lm_trainer --lm-runs 20

A process that exits right after a gloo collective can abort (``terminate called without an active
exception``, SIGABRT; /work/shared/ENVIRONMENT.md). Each launch here finishes its work and then
exits; a launch is counted by its launcher's exit status and classified:

* ``ok``: rc 0;
* ``abort``: a worker died of SIGABRT or printed ``terminate called`` (the exit crash);
* ``timeout``: the launch did not end within ``--timeout`` seconds (killed);
* ``other``: any other failure (its log tail is kept in the JSON).

Variants:

* ``user_loop``: ``torchrun --nproc_per_node 4`` of this file's worker, a user's loop as README.md
  shows it: ``Accelerator(cpu=True)``, ``AccelerateSynchronizer`` with gossip-BMUF (period 4,
  12 steps), the final average when the ``with`` block ends, ``gossip_accel.shutdown()``;
* ``user_loop_fork``: the same loop in 4 processes forked from this one after it imported torch,
  accelerate and gossip_accel (a launch costs a process start and ``import torch`` less: on a
  loaded 2-core machine a torchrun launch took 30-50 s, a forked one a few). Each worker sets the
  launcher's variables (RANK, WORLD_SIZE, MASTER_ADDR/PORT), runs the loop and then leaves through
  the interpreter's normal exit (finalization, atexit, C++ static destructors), as a launched
  script does; its exit status (a signal: SIGABRT) comes from ``os.waitpid``;
* ``lm_trainer``: ``utils/launch.sh --num-workers 4`` (accelerate launch) of
  ``gossip_accel.bin.train_lm`` on a tiny generated corpus (1 epoch of 6 steps).

Every launch gets a free port. Output: a table per variant and ``bench/results/exit_loop.json``
(one entry per ``--label``, kept across calls, with the machine's load before and after each
variant: bench/machine_load.py). The machine is shared: other jobs make the exit race more or less
likely, so the load is part of the result. Benchmarks assert nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import machine_load  # noqa: E402
from gossip_accel.train.process_group import free_port  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "exit_loop.json"
WORLD = 4
LM_CONF = ROOT / "recipes" / "wikitext103" / "lm1" / "conf"
LM_TINY = ["model.hidden_size=16", "model.projection_size=8", "model.embedding_dim=8", "model.head_size=20",
           "model.num_tails=1", "train.streams=2", "train.bptt=4", "train.max_steps_per_epoch=6", "train.epochs=1",
           "sync.algorithm=gossip_bmuf", "sync.period=2", "sync.components.0.period=4", "sync.warmup_steps=0",
           "train.warmup_epochs=null", "train.checkpoint_every_steps=0"]


# -- the worker of the user_loop variant (run by torchrun) -----------------------------------------------
def user_loop_worker(steps: int = 12) -> None:
    """A user's Accelerate loop with the synchronizer (README.md), then the documented exit."""
    import torch
    from accelerate import Accelerator

    from gossip_accel import shutdown
    from gossip_accel.sync.integrations.accelerate import AccelerateSynchronizer

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(accelerator.process_index)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = accelerator.prepare(model, opt)
    with AccelerateSynchronizer(accelerator, model, str(ROOT / "conf" / "sync.yaml"), ["sync.period=4"]) as sync:
        for _ in range(steps):
            x, y = torch.randn(8, 8), torch.randn(8, 1)
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
            sync.step()
    shutdown()


# -- the launches ---------------------------------------------------------------------------------------
def tiny_corpus(d: Path) -> Path:
    """A corpus of random words in the wikitext layout, with its vocabulary."""
    from gossip_accel.data.lm import Vocabulary, read_lines

    d.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(50)]
    for name, lines in (("wiki.train.tokens", 80), ("wiki.valid.tokens", 10), ("wiki.test.tokens", 10)):
        (d / name).write_text("".join(" ".join(rng.choices(words, k=8)) + "\n" for _ in range(lines)))
    Vocabulary.build(read_lines(d / "wiki.train.tokens")).save(d / "vocab.txt")
    return d


def command(variant: str, work: Path, run: int) -> list[str]:
    if variant == "user_loop":
        return [str(Path(sys.executable).parent / "torchrun"), "--nnodes", "1", "--nproc_per_node", str(WORLD),
                "--master_port", str(free_port()), str(Path(__file__).resolve()), "--worker"]
    if variant == "lm_trainer":
        return ["bash", str(ROOT / "utils" / "launch.sh"), "--num-workers", str(WORLD), "--port", str(free_port()),
                "--", "-m", "gossip_accel.bin.train_lm", "--config", str(LM_CONF / "mini.yaml"), "--config", str(LM_CONF / "period_16_128.yaml"),
                "--exp-dir", str(work / f"lm{run}"), f"data.dir={work / 'data'}", *LM_TINY]
    raise SystemExit(f"exit_loop.py: unknown variant {variant!r} (user_loop, lm_trainer)")


class WorkerDone(BaseException):
    """Raised in a forked worker when its loop is done: it unwinds to the top of this script, whose
    interpreter then exits as a launched script's does."""


def forked_launch(run: int, timeout: float, work: Path, cores: bool) -> tuple[str, dict]:
    """One launch of ``user_loop_fork``: WORLD workers forked from this process (``cores``: a worker
    that aborts leaves a core file in ``work/core<run>_<rank>/`` for gdb)."""
    import faulthandler
    import resource
    import signal

    port, logs, pids = free_port(), [work / f"fork{run}_rank{r}.log" for r in range(WORLD)], []
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for r in range(WORLD):
        pid = os.fork()
        if pid == 0:  # the worker: no return into the driver's loop
            fd = os.open(logs[r], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            faulthandler.enable()
            if cores:
                os.makedirs(work / f"core{run}_{r}", exist_ok=True)
                os.chdir(work / f"core{run}_{r}")
                resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD),
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            user_loop_worker()
            raise WorkerDone
        pids.append(pid)
    statuses, deadline = {}, time.monotonic() + timeout
    while len(statuses) < WORLD and time.monotonic() < deadline:
        for pid in pids:
            if pid not in statuses and (got := os.waitpid(pid, os.WNOHANG))[0]:
                statuses[pid] = got[1]
        time.sleep(0.05)
    for pid in pids:
        if pid not in statuses:
            os.kill(pid, signal.SIGKILL)
            statuses[pid] = None
            os.waitpid(pid, 0)
    log = "".join(f"--- rank {r} ---\n" + logs[r].read_text(errors="replace") for r in range(WORLD))
    codes = []
    for pid in pids:
        st = statuses[pid]
        codes.append(None if st is None else (-os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st)))
    for r, f in enumerate(logs):
        f.unlink()
        if cores and not any((work / f"core{run}_{r}").iterdir()):
            (work / f"core{run}_{r}").rmdir()
    if None in codes:
        kind = "timeout"
    elif -signal.SIGABRT in codes:
        kind = "abort"
    else:
        kind = classify(max(abs(c) for c in codes), log)
    return kind, failure_info(run, kind, codes, log, time.perf_counter() - start)


def failure_info(run: int, kind: str, rc, log: str, seconds: float) -> dict:
    lines = log.splitlines()
    errors = [line for line in lines if "Error" in line or "terminate called" in line or "Signal" in line]
    crash = next((i for i, line in enumerate(lines) if "terminate called" in line or "Fatal Python error" in line), None)
    return {"run": run, "kind": kind, "rc": rc, "seconds": seconds, "error_lines": errors[:12],
            "log_tail": log[-2500:], "crash": None if crash is None else "\n".join(lines[max(0, crash - 5):crash + 40])}


def classify(rc: int, log: str) -> str:
    if rc == 0:
        return "ok"
    if "terminate called" in log or "SIGABRT" in log or "exitcode  : -6" in log:
        return "abort"
    return "other"


def launch(variant: str, work: Path, run: int, timeout: float, env: dict) -> tuple[str, dict]:
    """One launch: its class and, when it failed, what its log says."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(command(variant, work, run), cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
        rc, log = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, log = None, (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
    kind = "timeout" if rc is None else classify(rc, log)
    return kind, failure_info(run, kind, rc, log, time.perf_counter() - start)


def in_time(runs: int, max_minutes: float):
    """0 .. runs-1, stopping early once ``max_minutes`` have passed (0: never)."""
    end = time.monotonic() + 60 * max_minutes
    for i in range(runs):
        if max_minutes and time.monotonic() > end:
            print(f"[exit_loop] --max-minutes {max_minutes:g} reached after {i} launches", flush=True)
            return
        yield i


def pooled(fn, items, parallel: int):
    """``fn(i)`` for the items, ``parallel`` at a time, taking the next item only when one is done."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    with ThreadPoolExecutor(parallel) as pool:
        pending = set()
        for i in items:
            pending.add(pool.submit(fn, i))
            if len(pending) >= parallel:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                yield from (f.result() for f in done)
        yield from (f.result() for f in pending)


def run_variant(variant: str, runs: int, timeout: float, work: Path, parallel: int, cores: bool = False,
                max_minutes: float = 0) -> dict:
    """``runs`` launches, ``parallel`` at a time; none started after ``max_minutes`` (0: no limit)."""
    # PYTHONFAULTHANDLER: a worker that aborts prints every thread's Python stack (where it died)
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT), PYTHONFAULTHANDLER="1")
    if variant == "lm_trainer":
        tiny_corpus(work / "data")
    counts = {"ok": 0, "abort": 0, "timeout": 0, "other": 0}
    failures, seconds = [], []
    if variant == "user_loop_fork":  # forks from this (main) thread, one launch at a time
        os.environ.update({k: env[k] for k in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONFAULTHANDLER")})
        import accelerate  # noqa: F401 - imported once, before the forks
        import gossip_accel.sync.integrations.accelerate  # noqa: F401
        results = (forked_launch(i, timeout, work / "fork", cores) for i in in_time(runs, max_minutes))
    else:
        results = pooled(lambda i: launch(variant, work, i, timeout, env), in_time(runs, max_minutes), parallel)
    for kind, info in results:
        counts[kind] += 1
        seconds.append(info["seconds"])
        if kind != "ok":
            failures.append(info)
        print(f"[exit_loop] {variant} {len(seconds)}/{runs}: {kind} (rc {info['rc']}, {info['seconds']:.1f} s); "
              f"failed so far {len(seconds) - counts['ok']}", flush=True)
    runs = len(seconds)
    return {"runs": runs, "parallel": parallel, "counts": counts, "failed": runs - counts["ok"],
            "rate": (runs - counts["ok"]) / runs if runs else None,
            "seconds_per_launch": sum(seconds) / len(seconds) if seconds else None, "failures": failures}


def table(label: str, variants: dict) -> str:
    lines = [f"exit bench '{label}': {WORLD}-worker launches",
             f"{'variant':<12} {'runs':>5} {'ok':>5} {'abort':>6} {'timeout':>8} {'other':>6} {'failed':>8} {'s/launch':>9} quiet",
             "-" * 72]
    for name, v in variants.items():
        c = v["counts"]
        lines.append(f"{name:<12} {v['runs']:>5} {c['ok']:>5} {c['abort']:>6} {c['timeout']:>8} {c['other']:>6} "
                     f"{100 * v['rate']:>7.1f}% {v['seconds_per_launch']:>9.1f} {'yes' if v['load']['quiet'] else 'NO'}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--label", default="run", help="the entry of bench/results/exit_loop.json (e.g. before, after)")
    ap.add_argument("--runs", type=int, default=100, help="launches of the user_loop variants")
    ap.add_argument("--lm-runs", type=int, default=20, help="launches of the lm_trainer variant")
    ap.add_argument("--variants", nargs="+", default=["user_loop"], choices=["user_loop", "user_loop_fork", "lm_trainer"])
    ap.add_argument("--timeout", type=float, default=300, help="seconds allowed per launch")
    ap.add_argument("--parallel", type=int, default=1, help="launches at a time (more load: the race may change)")
    ap.add_argument("--max-minutes", type=float, default=0, help="start no launch after this many minutes (0: all)")
    ap.add_argument("--cores", action="store_true", help="user_loop_fork: keep core files of aborted workers")
    ap.add_argument("--work", default=str(ROOT / "exp" / "exit_loop"), help="scratch directory")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if args.worker:
        return user_loop_worker()
    work = Path(args.work)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "gossip_accel"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip())
    variants = {}
    for name in args.variants:
        before = machine_load.snapshot()
        variants[name] = run_variant(name, args.lm_runs if name == "lm_trainer" else args.runs, args.timeout, work,
                                     args.parallel, args.cores, args.max_minutes)
        variants[name]["load"] = machine_load.assess(before, machine_load.snapshot())
        if (w := machine_load.warning(variants[name]["load"], f"exit_loop {name}")):
            print(w, flush=True)
    print(table(args.label, variants))
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.is_file() else {}
    report[args.label] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "commit": head,
                          "gossip_accel_uncommitted_changes": dirty, "world": WORLD, "nice": os.nice(0),
                          "command": " ".join(["python", "bench/exit_loop.py", *(argv or sys.argv[1:])]),
                          "variants": variants,
                          "load": machine_load.summary([v["load"] for v in variants.values()])}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"[exit_loop] wrote {out}")


if __name__ == "__main__":
    try:
        main()
    except WorkerDone:  # a forked worker of user_loop_fork: its loop is done, exit as a script does
        pass
