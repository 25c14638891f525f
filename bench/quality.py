"""Quality benchmark: which knob closes gossip-BMUF's gap to DDP, measured on the LM recipes.

    . path.sh
    python bench/quality.py --grid knobs                    # one change at a time from the paper's settings
    python bench/quality.py --grid methods --seeds 1 2 3    # every method at the defaults, 3 seeds
    python bench/quality.py --corpus gutenberg --grid methods --epochs 3
    python bench/quality.py --settings ddp paper rule --epochs 4 --seeds 1 2 3
    python bench/quality.py --grid methods --report-only    # table, JSON and plots from the runs on disk

Every setting is one real training run of the recipe's LM (``conf/mini.yaml`` +
``conf/period_16_128.yaml``, ``--workers`` gloo workers through ``utils/launch.sh``) followed by
the test perplexity of its final (worker-averaged) model. Runs go to
``<work>/<corpus>/e<epochs>-n<workers>/<setting>-s<seed>`` (default ``exp/quality``) and a finished run is never repeated,
so the grid is resumable (Ctrl-C, then the same command). A setting is a list of trainer
overrides on top of the recipe conf; ``paper`` is the paper's gossip-BMUF (eta = 0.9, zeta = 1,
no warm-up, one-way pull), ``rule`` takes eta from eq. 6, and every other ``knobs`` entry changes
one or two things from ``rule``.

Output: a markdown table (mean and spread over seeds of valid/test perplexity, MB sent per step
and worker, ratio to DDP's bytes and perplexity), ``bench/results/quality_<corpus>_<grid>_e<epochs>-n<workers>.json`` (and ``.md``;
``<grid>`` is ``settings`` for ``--settings``/``--set``), and three plots beside it. The file accumulates: a call's rows (one per
setting and seed) replace the file's rows of the same setting and seed and join the others, so two ``--settings``
calls with the same corpus, epochs and workers leave one file with both (bench/quality_summary.py). The plots
(every setting of the file): validation perplexity per epoch, against MB sent per worker, and against the wall-clock the run would take on the emulated 100 Mbit/20 ms network when
``--speeds`` names a ``bench/cluster_bench.py`` JSON (steps/s measured there for the same
algorithm and periods x this run's steps; the plot says so). Benchmarks assert nothing.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench import machine_load  # noqa: E402
from bench.quality_summary import load_summary, merge, plot_series, seed_row  # noqa: E402
from gossip_accel.train.process_group import free_port  # noqa: E402

RECIPES = {"wikitext": ROOT / "recipes" / "wikitext103" / "lm1", "gutenberg": ROOT / "recipes" / "gutenberg" / "lm1"}
RULE = "sync.block_momentum=null"  # eta from eq. (6) of 001: zeta n (1 - eta) = C (0.75 for n = 4, zeta = 1)

#: name -> (what it is, trainer overrides[, conf overlays of the recipe's conf/ given after its own two]).
#: "ddp" and "single" are the baselines. The knobs change one
#: thing at a time from "rule" (gossip-BMUF with eta from eq. 6, the paper's everything else).
#: the knobs start from the recipe conf as it was before they were measured (no warm-up, fp32 wire)
GB = ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", "sync.warmup_steps=0", "sync.warmup_period=1", "sync.exchange_dtype=float32"]
PAPER = "sync.block_momentum=0.9"
BF16, W32 = "sync.exchange_dtype=bfloat16", ["sync.warmup_steps=32", "sync.warmup_period=8"]
SETTINGS: dict[str, tuple] = {
    "single": ("one worker, no sync (4x the steps of a worker)", ["sync.enabled=false"]),
    "ddp": ("gradient all-reduce every step", ["sync.enabled=false"]),
    "paper": ("gossip-BMUF as in the paper: eta 0.9, zeta 1, pull, no warm-up, fp32", [*GB, PAPER]),
    "rule": ("eta from eq. 6 (0.75 for n=4)", [*GB, RULE]),
    "eta_0.5": ("eta 0.5", [*GB, "sync.block_momentum=0.5"]),
    "zeta_2": ("zeta 2, eta from eq. 6 (0.875)", [*GB, RULE, "sync.block_lr=2.0"]),
    "cbm": ("classic block momentum (CBM)", [*GB, RULE, "sync.nesterov=false"]),
    "lr_0.02": ("inner Adagrad lr 0.02 (recipe 0.03)", [*GB, RULE, "train.lr=0.02"]),
    "lr_0.05": ("inner Adagrad lr 0.05", [*GB, RULE, "train.lr=0.05"]),
    "pair": ("random ring matching (sync.mixing=pair)", [*GB, RULE, "sync.mixing=pair"]),
    "emb_64": ("embedding shards every 64 steps: (16,64)", [*GB, RULE, "sync.components.0.period=64"]),
    "bf16": ("bf16 wire", [*GB, RULE, BF16]),
    "bf16_8_64": ("bf16 wire, periods (8,64)", [*GB, RULE, BF16, "sync.period=8", "sync.components.0.period=64"]),
    "warmup_16": ("2 full averages (every 8 steps) in the first 16 steps",
                  [*GB, RULE, "sync.warmup_steps=16", "sync.warmup_period=8"]),
    "warmup_32": ("4 full averages (every 8 steps) in the first 32 steps", [*GB, RULE, *W32]),
    "warmup_32_bf16": ("warmup_32 on a bf16 wire", [*GB, RULE, *W32, BF16]),
    "warmup_48_bf16": ("6 full averages in the first 48 steps, bf16 wire",
                       [*GB, RULE, "sync.warmup_steps=48", "sync.warmup_period=8", BF16]),
    "warmup_32_bf16_emb_64": ("warmup_32_bf16 with the embedding every 64 steps: (16,64)",
                              [*GB, RULE, *W32, BF16, "sync.components.0.period=64"]),
    "warmup_32_bf16_eta_0.5": ("warmup_32_bf16 with eta 0.5", [*GB, "sync.block_momentum=0.5", *W32, BF16]),
    "warmup_32_bf16_lr_0.02": ("warmup_32_bf16 with lr 0.02", [*GB, RULE, *W32, BF16, "train.lr=0.02"]),
    # gossip-BMUF variants on top of the recipe defaults (rule, warm-up, bf16)
    "gossip_bmuf_pair": ("gossip-BMUF, sync.mixing=pair", ["sync.algorithm=gossip_bmuf", "sync.mixing=pair"]),
    "gossip_bmuf_12_96": ("gossip-BMUF, periods (12,96): about BMUF's (16,128) bytes",
                          ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", "sync.period=12", "sync.components.0.period=96"]),
    "gossip_bmuf_pair_12_96": ("gossip-BMUF, sync.mixing=pair, periods (12,96)",
                               ["sync.algorithm=gossip_bmuf", "sync.mixing=pair", "sync.period=12",
                                "sync.components.0.period=96"]),
    "gossip_bmuf_pair_8_64": ("gossip-BMUF, sync.mixing=pair, periods (8,64)",
                              ["sync.algorithm=gossip_bmuf", "sync.mixing=pair", "sync.period=8",
                               "sync.components.0.period=64"]),
    "gossip_bmuf_pair_12_96_w48": ("gossip_bmuf_pair_12_96 with 6 full averages in the first 48 steps",
                                   ["sync.algorithm=gossip_bmuf", "sync.mixing=pair", "sync.period=12",
                                    "sync.components.0.period=96", "sync.warmup_steps=48"]),
    "bmuf_w48": ("BMUF-NBM with 6 full averages in the first 48 steps",
                 ["sync.algorithm=bmuf", "sync.warmup_steps=48"]),
    "bmuf_ramp": ("BMUF, the ramp warm-up (16 steps of averages every 8, then periods 8, 16, .. up to (16,128))",
                  ["sync.algorithm=bmuf", "sync.warmup_kind=ramp", "sync.warmup_steps=16"]),
    # issue 14: below eq. 6's eta on the Gutenberg mini, both methods (an inner Adam wanted far less, docs/RESULTS.md)
    "gossip_bmuf_pair_12_96_eta_0.7": ("gossip_bmuf_pair_12_96 with eta 0.7",
                                       ["sync.algorithm=gossip_bmuf", "sync.mixing=pair", "sync.period=12",
                                        "sync.components.0.period=96", "sync.block_momentum=0.7"]),
    "bmuf_eta_0.7": ("BMUF-NBM, eta 0.7", ["sync.algorithm=bmuf", "sync.block_momentum=0.7"]),
    # issue 14: eq. 6 with the n of a gossip round: a pair averages 2 replicas, zeta n (1 - eta) = 1 gives 0.5
    **{f"gossip_bmuf_pair_12_96_eta_{eta}": (f"gossip_bmuf_pair_12_96 with eta {eta}",
                                            ["sync.algorithm=gossip_bmuf", "sync.mixing=pair", "sync.period=12",
                                             "sync.components.0.period=96", f"sync.block_momentum={eta}"])
       for eta in ("0.6", "0.5")},
    "gossip_bmuf_pair_12_96_ramp": ("gossip_bmuf_pair_12_96 with the ramp warm-up (periods 8, 16, .. up to (12,96))",
                                    ["sync.algorithm=gossip_bmuf", "sync.mixing=pair", "sync.period=12",
                                     "sync.components.0.period=96", "sync.warmup_kind=ramp", "sync.warmup_steps=16"]),
    "gossip_ma_pair_12_96": ("gossip-MA, sync.mixing=pair, periods (12,96)",
                             ["sync.algorithm=gossip_ma", "sync.mixing=pair", "sync.period=12",
                              "sync.components.0.period=96"]),
    "gossip_bmuf_eta_0.8": ("gossip-BMUF, eta 0.8", ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", "sync.block_momentum=0.8"]),
    # issue 14: the warm-up's kind and the inner optimizer's state, one change each from gossip_bmuf (pull, as measured; the recipe:
    # 32 warm-up steps of full averages every 8, bf16 wire)
    "gossip_bmuf_warmup_grads": ("gossip-BMUF, warm-up = DDP's gradient all-reduce for 32 steps",
                                 ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", "sync.warmup_kind=gradients"]),
    "gossip_bmuf_ramp": ("gossip-BMUF, 16 warm-up steps of averages every 8, then periods 8, 16, 32, .. up to (16,128)",
                         ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", "sync.warmup_kind=ramp", "sync.warmup_steps=16"]),
    "gossip_bmuf_state_reset": ("gossip-BMUF, the inner Adagrad state reset at every sync",
                                ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", "sync.inner_state=reset"]),
    "gossip_bmuf_state_average": ("gossip-BMUF, the inner Adagrad state averaged like the parameters",
                                  ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", "sync.inner_state=average"]),
    # the inner optimizer itself, each against DDP with the same optimizer (Adam at DiLoCo's 3e-3: 1e-3 was
    # 17% worse under diloco.yaml; SGD at the LSTM LM's classic 1.0 with the recipe's gradient clipping)
    "ddp_adam": ("DDP, Adam lr 3e-3", ["sync.enabled=false", "train.optimizer=adam", "train.lr=0.003"]),
    "gossip_bmuf_adam": ("gossip-BMUF, inner Adam lr 3e-3", ["sync.algorithm=gossip_bmuf", "sync.mixing=pull",
                                                             "train.optimizer=adam", "train.lr=0.003"]),
    # issue 14: with Adam the eq. 6 eta (0.75 at n = 4) overshoots on the ASR TDNN; the same question on the LM
    "gossip_bmuf_adam_eta_0.5": ("gossip-BMUF, inner Adam lr 3e-3, block momentum 0.5",
                                 ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", "train.optimizer=adam",
                                  "train.lr=0.003", "sync.block_momentum=0.5"]),
    "gossip_bmuf_adam_eta_0.25": ("gossip-BMUF, inner Adam lr 3e-3, block momentum 0.25",
                                  ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", "train.optimizer=adam",
                                   "train.lr=0.003", "sync.block_momentum=0.25"]),
    "gossip_bmuf_adam_eta_0": ("gossip-BMUF, inner Adam lr 3e-3, no block momentum (gossip-MA)",
                               ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", "train.optimizer=adam",
                                "train.lr=0.003", "sync.block_momentum=0.0"]),
    "ddp_sgd": ("DDP, SGD lr 1.0", ["sync.enabled=false", "train.optimizer=sgd", "train.lr=1.0"]),
    "gossip_bmuf_sgd": ("gossip-BMUF, inner SGD lr 1.0", ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", "train.optimizer=sgd",
                                                          "train.lr=1.0"]),
    "ddp_sgd_0.3": ("DDP, SGD lr 0.3 (1.0 diverges)", ["sync.enabled=false", "train.optimizer=sgd", "train.lr=0.3"]),
    "gossip_bmuf_sgd_0.3": ("gossip-BMUF, inner SGD lr 0.3", ["sync.algorithm=gossip_bmuf", "sync.mixing=pull",
                                                              "train.optimizer=sgd", "train.lr=0.3"]),
    # the methods at the settings of each one's recipe conf (conf/mini.yaml's sync section)
    "ma": ("model averaging", ["sync.algorithm=ma"]),
    "bmuf": ("BMUF-NBM", ["sync.algorithm=bmuf"]),
    "local_bmuf": ("local-BMUF (all 2p ring neighbours)", ["sync.algorithm=local_bmuf"]),
    "gossip_ma": ("gossip-MA, the paper's pull", ["sync.algorithm=gossip_ma", "sync.mixing=pull"]),
    "gossip_bmuf": ("gossip-BMUF, the paper's pull", ["sync.algorithm=gossip_bmuf", "sync.mixing=pull"]),
    # issue 17: staggered components and overlapped syncs on top of the recipe's gossip-BMUF (16,128), pull mixing as measured
    "gossip_bmuf_stagger": ("gossip-BMUF, sync.stagger (offsets floor(k H / K))", ["sync.algorithm=gossip_bmuf", "sync.mixing=pull",
                                                                                  "sync.stagger=true"]),
    **{f"gossip_bmuf_overlap{tau}_{merge}": (f"gossip-BMUF, sync.overlap_steps={tau}, merge {merge}",
                                             ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", f"sync.overlap_steps={tau}",
                                              f"sync.overlap_merge={merge}"])
       for tau in (2, 4) for merge in ("delta", "mix", "replace")},
    "gossip_bmuf_stagger_overlap4": ("gossip-BMUF, stagger and sync.overlap_steps=4 (delta)",
                                     ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", "sync.stagger=true", "sync.overlap_steps=4"]),
    # issue 17 item 3: the int8/int4 wire (outer gradients with per-block scales and error feedback) against
    # fp32 and bf16 at the recipe's settings (pull mixing, as measured); gossip: per-edge public copies (CHOCO) or parameters + error feedback
    **{f"{algo}_{wire}": (f"{label}, {wire} wire", [f"sync.algorithm={algo}", "sync.mixing=pull", f"sync.exchange_dtype={dtype}"])
       for algo, label in (("bmuf", "BMUF-NBM"), ("gossip_bmuf", "gossip-BMUF"))
       for wire, dtype in (("fp32", "float32"), ("bf16", "bfloat16"), ("int8", "int8"), ("int4", "int4"))},
    "gossip_bmuf_int4_params": ("gossip-BMUF, int4 wire, parameters with error feedback (sync.quant_ring=params)",
                                ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", "sync.exchange_dtype=int4", "sync.quant_ring=params"]),
    "gossip_bmuf_int8_params": ("gossip-BMUF, int8 wire, parameters with error feedback (sync.quant_ring=params)",
                                ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", "sync.exchange_dtype=int8", "sync.quant_ring=params"]),
    # the int8/int4 ring overlapped: coded from theta_t at the sync step t, applied (delta merge) at t + 4
    **{f"gossip_bmuf_{wire}_overlap4": (f"gossip-BMUF, {wire} wire, sync.overlap_steps=4 (delta)",
                                        ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", f"sync.exchange_dtype={wire}",
                                         "sync.overlap_steps=4"])
       for wire in ("int8", "int4")},
    "gossip_bmuf_int4_stagger_overlap4": ("gossip-BMUF, int4 wire, stagger and sync.overlap_steps=4 (delta)",
                                          ["sync.algorithm=gossip_bmuf", "sync.mixing=pull", "sync.exchange_dtype=int4",
                                           "sync.stagger=true", "sync.overlap_steps=4"]),
    # DiLoCo (arXiv 2311.08105): inner AdamW, outer Nesterov SGD lr 0.7 momentum 0.9, H = 32 (conf/diloco.yaml)
    "diloco": ("DiLoCo: AdamW lr 3e-3, outer Nesterov SGD 0.7/0.9, all-reduce every 32 steps", [], ["diloco.yaml"]),
    "diloco_lr_1e-3": ("diloco with AdamW lr 1e-3", ["train.lr=0.001"], ["diloco.yaml"]),
    # issue 14 on the Gutenberg mini, where at 20 epochs gossip-BMUF's test ppl on the held-out book stalls while its valid ppl
    # still falls: every method with the LSTMP's dropout raised (conf/mini.yaml 0.1), or with the training text dealt out
    # to the workers interleaved (every worker reads every book) instead of in contiguous parts (a book or two each)
    **{f"{name}_{variant}": (f"{name} with {override}", [*overrides, override])
       for name, overrides in (("ddp", ["sync.enabled=false"]), ("ma", ["sync.algorithm=ma"]), ("bmuf", ["sync.algorithm=bmuf"]),
                               ("gossip_bmuf_pair_12_96", ["sync.algorithm=gossip_bmuf", "sync.mixing=pair", "sync.period=12",
                                                           "sync.components.0.period=96"]))
       for variant, override in (("drop_0.2", "model.dropout=0.2"), ("drop_0.3", "model.dropout=0.3"),
                                 ("interleaved", "data.shard_layout=interleaved"))},
}
GRIDS = {
    "knobs": ["ddp", "paper", "rule", "eta_0.5", "zeta_2", "cbm", "lr_0.02", "lr_0.05", "pair", "emb_64", "bf16",
              "bf16_8_64", "warmup_16", "warmup_32", "warmup_32_bf16", "warmup_48_bf16", "warmup_32_bf16_emb_64", "warmup_32_bf16_eta_0.5",
              "warmup_32_bf16_lr_0.02"],
    "methods": ["single", "ddp", "ma", "bmuf", "local_bmuf", "gossip_ma", "gossip_bmuf", "gossip_ma_pair_12_96",
                "gossip_bmuf_pair_12_96"],
    "parity": ["ddp", "paper", "rule", "warmup_32_bf16"],
    "overlap": ["gossip_bmuf", "gossip_bmuf_overlap4_delta", "gossip_bmuf_overlap4_mix", "gossip_bmuf_overlap4_replace",
                "gossip_bmuf_stagger", "gossip_bmuf_stagger_overlap4", "gossip_bmuf_overlap2_delta",
                "gossip_bmuf_overlap2_mix"],
    # issue 14: the warm-up's kind and the inner optimizer's state
    "inner": ["ddp", "gossip_bmuf", "gossip_bmuf_warmup_grads", "gossip_bmuf_ramp", "gossip_bmuf_state_reset",
              "gossip_bmuf_state_average"],
    # issue 14: the inner optimizer (Adagrad, the recipe's; Adam; SGD), gossip-BMUF against DDP with the same one
    "optimizers": ["ddp", "gossip_bmuf", "ddp_adam", "gossip_bmuf_adam", "ddp_sgd", "gossip_bmuf_sgd",
                   "ddp_sgd_0.3", "gossip_bmuf_sgd_0.3"],
    # issue 14: the block momentum under an inner Adam (eq. 6's 0.75, 0.5, 0.25, 0)
    "adam_eta": ["ddp_adam", "gossip_bmuf_adam", "gossip_bmuf_adam_eta_0.5", "gossip_bmuf_adam_eta_0.25",
                 "gossip_bmuf_adam_eta_0"],
    "quant": ["ddp", "bmuf_fp32", "bmuf_bf16", "bmuf_int8", "bmuf_int4", "gossip_bmuf_fp32", "gossip_bmuf_bf16",
              "gossip_bmuf_int8", "gossip_bmuf_int4", "gossip_bmuf_int8_params", "gossip_bmuf_int4_params",
              "gossip_bmuf_int8_overlap4", "gossip_bmuf_int4_overlap4", "gossip_bmuf_int4_stagger_overlap4"],
    "gossip": ["ddp", "bmuf", "gossip_bmuf", "gossip_bmuf_pair", "gossip_bmuf_12_96", "gossip_bmuf_pair_12_96",
               "gossip_bmuf_eta_0.8"],
}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--corpus", choices=sorted(RECIPES), default="wikitext")
    ap.add_argument("--grid", choices=sorted(GRIDS), default=None, help="a named list of settings")
    ap.add_argument("--settings", nargs="+", default=None, help=f"settings by name: {', '.join(SETTINGS)}")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=OVERRIDE[,OVERRIDE...]",
                    help="an extra setting of your own, e.g. 'mine=sync.algorithm=gossip_bmuf,sync.q=2'")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1],
                    help="seed s runs with train.seed=s and sync.seed=s-1 (s=1: the recipe's own seeds)")
    ap.add_argument("--work", type=Path, default=ROOT / "exp" / "quality", help="where the runs go")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="summary JSON and table")
    ap.add_argument("--plots", type=Path, default=ROOT / "docs" / "img", help="where the plot goes")
    ap.add_argument("--speeds", type=Path, default=None,
                    help="a bench/cluster_bench.py JSON: steps/s per setting for the wall-clock plot")
    ap.add_argument("--network", default="cross-site", help="the network of --speeds to use")
    ap.add_argument("--report-only", action="store_true", help="no training: report the runs on disk")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("extra", nargs="*", help="trainer overrides for every run (after --)")
    args = ap.parse_args(argv)
    names = list(GRIDS[args.grid]) if args.grid else []
    names += [n for n in (args.settings or []) if n not in names]
    for item in args.set:
        name, sep, ov = item.partition("=")
        if not sep or not ov:
            ap.error(f"--set {item!r}: give NAME=OVERRIDE[,OVERRIDE...]")
        SETTINGS[name] = (item, ov.split(","))
        names.append(name)
    if min(args.seeds) < 1:
        ap.error("--seeds must be >= 1 (seed s: train.seed=s, sync.seed=s-1)")
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        ap.error(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(SETTINGS)}")
    if not names:
        ap.error("give --grid, --settings or --set")
    args.names = names
    # the trainings run in the recipe's directory: a relative --work would land there, not here
    args.work, args.out, args.plots = args.work.resolve(), args.out.resolve(), args.plots.resolve()
    if args.speeds is not None:
        args.speeds = args.speeds.resolve()
    return args


def ensure_data(recipe: Path) -> Path:
    """The recipe's stages 0-1 (mini corpus, vocabulary) if their output is missing."""
    data = recipe / "data" / "lm"
    if not (data / "vocab.txt").is_file():
        subprocess.run(["bash", str(recipe / "run.sh"), "--stage", "0", "--stop-stage", "1"], check=True)
    return data


def run_one(recipe: Path, data: Path, run_dir: Path, name: str, seed: int, args) -> dict:
    """Train and evaluate one setting (skipped when its results are complete); returns results.json."""
    res_file = run_dir / "results.json"
    done = json.loads(res_file.read_text()) if res_file.is_file() else {}
    if "final_test_ppl" in done:
        return done
    if args.report_only:
        return {"failed": "not run"} if (run_dir / "train.log").is_file() else {}
    run_dir.mkdir(parents=True, exist_ok=True)
    workers = 1 if name == "single" else args.workers
    overrides = [*SETTINGS[name][1], f"train.epochs={args.epochs}", f"train.seed={seed}", f"sync.seed={seed - 1}",
                 *args.extra]
    load_before = machine_load.snapshot()
    confs = [recipe / "conf" / c for c in ("mini.yaml", "period_16_128.yaml", *setting_confs(name))]
    cmd = ["bash", str(ROOT / "utils" / "launch.sh"), "--num-workers", str(workers), "--port", str(free_port()), "--",
           "-m", "gossip_accel.bin.train_lm", *[a for c in confs for a in ("--config", str(c))], "--exp-dir", str(run_dir),
           "--name", f"{name}-s{seed}", f"data.dir={data}", *overrides]
    print(f"[quality] {name} seed {seed}: {' '.join(map(str, [*setting_confs(name), *overrides]))}", flush=True)
    start = time.time()
    with open(run_dir / "train.log", "a") as log:
        r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=recipe)
        if r.returncode == 0:
            r = subprocess.run([sys.executable, "-m", "gossip_accel.bin.eval_lm", "--exp-dir", str(run_dir)],
                               stdout=log, stderr=subprocess.STDOUT, cwd=recipe)
    if r.returncode != 0 or not res_file.is_file():
        print(f"[quality] {name} seed {seed} FAILED (rc {r.returncode}); see {run_dir / 'train.log'}", flush=True)
        return {"failed": str(run_dir / "train.log")}
    res = json.loads(res_file.read_text())
    load = machine_load.assess(load_before, machine_load.snapshot())
    res["bench"] = {"overrides": overrides, "wall_seconds": time.time() - start,
                    "loadavg_before": load_before["loadavg"], "loadavg_after": load["after"]["loadavg"], "load": load}
    if (w := machine_load.warning(load, f"{name} seed {seed}")):
        print(f"[quality] {w}", flush=True)
    res_file.write_text(json.dumps(res, indent=2))
    print(f"[quality] {name} seed {seed}: test ppl {res['final_test_ppl']:.2f}, "
          f"{res['bytes_sent_per_step_per_worker'] / 1e6:.3f} MB/step/worker", flush=True)
    return res


def setting_confs(name: str) -> list[str]:
    """The conf overlays a setting names (third item of its SETTINGS entry), after the recipe's two."""
    entry = SETTINGS[name]
    return list(entry[2]) if len(entry) > 2 else []


def markdown(rows: list[dict], title: str) -> str:
    def pm(m, s):
        return f"{m:.2f}" if not s else f"{m:.2f} ± {s:.2f}"

    out = [f"### {title}", "", "| setting | what | seeds | valid ppl | test ppl | test vs DDP | MB/step/worker | bytes vs DDP |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("failed"):
            out.append(f"| {r['setting']} | {r['what']} | {r['seeds']} | failed (diverged or crashed: its train.log) "
                       "| - | - | - | - |")
            continue
        vs = f"{r['ppl_vs_ddp']:.3f}" if r["ppl_vs_ddp"] else "-"
        bv = "-" if r["bytes_vs_ddp"] is None else "0" if not r["bytes_vs_ddp"] else f"1/{1 / r['bytes_vs_ddp']:.0f}"
        out.append(f"| {r['setting']} | {r['what']} | {r['seeds']} | {pm(r['valid_ppl'], r['valid_ppl_sd'])} | "
                   f"{pm(r['test_ppl'], r['test_ppl_sd'])} | {vs} | {r['mb_per_step']:.4f} | {bv} |")
    return "\n".join(out) + "\n"


def cluster_speeds(path: Path, network: str) -> dict[str, float]:
    """steps/s of the LM workload per cluster-bench setting name (e.g. 'gossip_bmuf-(16,128)', 'ddp')."""
    data = json.loads(path.read_text())
    for net in data["networks"]:
        if network in (net["link"]["name"], net["link"]["spec"]):
            rows = net["workers"]["workloads"]["lm"]["rows"]
            return {name: row["steps_per_s"] for name, row in rows.items()}
    raise SystemExit(f"[quality] --speeds {path}: no network {network!r} in it")


def plot(series: list[tuple[str, str, list, Optional[list]]], stem: Path, title: str, speeds: dict[str, float],
         network: str) -> list[Path]:
    """The curves of :func:`bench.quality_summary.plot_series` (every setting of the summary file)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("epoch", "epoch"), ("MB sent per worker (log)", "bytes")]
    if speeds:
        panels.append((f"wall-clock on {network}, s (projected: measured steps/s x steps)", "wall"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for i, (name, key, pts, steps) in enumerate(series):
        for ax, (label, kind) in zip(axes[0], panels):
            if kind == "epoch":
                xs = [e for e, _, _ in pts]
            elif kind == "bytes":
                xs = [max(b / 1e6, 1e-3) for _, b, _ in pts]
                ax.set_xscale("log")
            else:
                if key not in speeds or name == "single" or steps is None:
                    continue
                xs = [step / speeds[key] for step in steps]
            ax.plot(xs, [p for _, _, p in pts], marker="o", label=name, color=f"C{i % 10}")
            ax.set_xlabel(label)
    for ax in axes[0]:
        ax.set_ylabel("valid ppl (averaged model; mean of replicas\nwhere a run did not log it)", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    stem.parent.mkdir(parents=True, exist_ok=True)
    path = stem.with_suffix(".png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main(argv=None) -> None:
    args = parse_args(argv)
    recipe = RECIPES[args.corpus]
    data = ensure_data(recipe) if not args.report_only else recipe / "data" / "lm"
    tag = f"e{args.epochs}-n{args.workers}"
    new_rows = []
    for name in args.names:
        definition = [*SETTINGS[name][1], *setting_confs(name), *args.extra]
        for seed in args.seeds:
            res = run_one(recipe, data, args.work / args.corpus / tag / f"{name}-s{seed}", name, seed, args)
            if res:
                new_rows.append(seed_row(name, SETTINGS[name][0], seed, definition, res))
    stem = args.out / f"quality_{args.corpus}_{args.grid or 'settings'}_{tag}"
    summary_file = stem.with_suffix(".json")
    old = json.loads(summary_file.read_text()) if summary_file.is_file() else None
    out = merge(old, new_rows, {"date": time.strftime("%Y-%m-%d %H:%M"), "corpus": args.corpus, "epochs": args.epochs,
                                "workers": args.workers},
                "python bench/quality.py " + " ".join(sys.argv[1:] if argv is None else argv))
    title = f"{args.corpus} mini, {args.workers} workers, {args.epochs} epochs, seeds {' '.join(map(str, out['seeds']))}"
    table = markdown(out["rows"], title)
    print(table)
    speeds = cluster_speeds(args.speeds, args.network) if args.speeds else {}
    if (w := machine_load.summary_warning(load_summary(new_rows, None), "each run's results.json 'bench.load'")):
        print(f"[quality] {w}")
    stem.parent.mkdir(parents=True, exist_ok=True)
    summary_file.write_text(json.dumps(out, indent=2))
    stem.with_suffix(".md").write_text(table)
    if not args.no_plots:
        for p in plot(plot_series(out), args.plots / stem.name, title, speeds, args.network):
            print(f"[quality] plot {p}")
    print(f"[quality] {summary_file} ({len(out['rows'])} settings: this call's merged into the file's)")


if __name__ == "__main__":
    main()
