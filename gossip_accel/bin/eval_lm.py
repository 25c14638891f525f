"""Perplexity of a trained LM's final (worker-averaged) model on the test and valid splits.

    python -m gossip_accel.bin.eval_lm --exp-dir exp/gossip_bmuf-16_128-n4

Reads ``config.yaml`` and ``final.pt`` of the run, writes ``final_test_ppl`` and
``final_valid_ppl`` into its ``results.json`` (single process). ``--model`` evaluates another state
dict of the run instead, e.g. an average of its epoch models
(``python -m gossip_accel.bin.average_checkpoints --exp-dir <run> --avg 5 --avg-mode best``, with
``train.save_epoch_models=true``), and writes ``<model stem>_test_ppl`` / ``_valid_ppl``
(``avg_best5_test_ppl``); ``final_*`` stay the final model's.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from ..data.lm import Vocabulary, batchify, read_lines
from .train_lm import build_model, load_conf, perplexity


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exp-dir", required=True)
    ap.add_argument("--model", default=None, help="a state dict to evaluate instead of <exp-dir>/final.pt")
    args = ap.parse_args()
    exp = Path(args.exp_dir)
    for f in ("config.yaml", "final.pt", "results.json"):
        if not (exp / f).is_file():
            raise SystemExit(f"eval_lm: {exp / f} not found; run the training stage first")
    model_file = Path(args.model) if args.model else exp / "final.pt"
    if not model_file.is_file():
        raise SystemExit(f"eval_lm: --model {model_file} not found")
    key = "final" if args.model is None else model_file.stem
    conf = load_conf([str(exp / "config.yaml")], [])
    data = Path(conf.data.dir)
    vocab = Vocabulary.load(data / conf.data.vocab)
    model = build_model(conf, vocab)
    model.load_state_dict(torch.load(model_file, map_location="cpu", weights_only=True))
    results = json.loads((exp / "results.json").read_text())
    for split in ("valid", "test"):
        path = data / getattr(conf.data, split)
        if path.is_file():
            ids = batchify(vocab.encode(read_lines(path)), conf.train.streams)
            results[f"{key}_{split}_ppl"] = perplexity(model, ids, conf.train.bptt)
            print(f"eval_lm: {exp.name}: {model_file.name}: {split} perplexity {results[f'{key}_{split}_ppl']:.2f} ({path})")
    results["eval_config"] = OmegaConf.to_container(conf.data)
    (exp / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
