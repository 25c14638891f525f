"""Perplexity of a trained LM's final (worker-averaged) model on the test and valid splits.

    python -m gossip_accel.bin.eval_lm --exp-dir exp/gossip_bmuf-16_128-n4

Reads ``config.yaml`` and ``final.pt`` of the run, writes ``final_test_ppl`` and
``final_valid_ppl`` into its ``results.json`` (single process).
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
    args = ap.parse_args()
    exp = Path(args.exp_dir)
    for f in ("config.yaml", "final.pt", "results.json"):
        if not (exp / f).is_file():
            raise SystemExit(f"eval_lm: {exp / f} not found; run the training stage first")
    conf = load_conf([str(exp / "config.yaml")], [])
    data = Path(conf.data.dir)
    vocab = Vocabulary.load(data / conf.data.vocab)
    model = build_model(conf, vocab)
    model.load_state_dict(torch.load(exp / "final.pt", map_location="cpu", weights_only=True))
    results = json.loads((exp / "results.json").read_text())
    for split in ("valid", "test"):
        path = data / getattr(conf.data, split)
        if path.is_file():
            ids = batchify(vocab.encode(read_lines(path)), conf.train.streams)
            results[f"final_{split}_ppl"] = perplexity(model, ids, conf.train.bptt)
            print(f"eval_lm: {exp.name}: {split} perplexity {results[f'final_{split}_ppl']:.2f} ({path})")
    results["eval_config"] = OmegaConf.to_container(conf.data)
    (exp / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
