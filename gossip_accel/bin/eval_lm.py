"""Perplexity of a trained LM's final (worker-averaged) model on the test and valid splits.

    python -m gossip_accel.bin.eval_lm --exp-dir exp/gossip_bmuf-16_128-n4

Reads ``config.yaml`` and ``final.pt`` of the run, writes ``final_test_ppl`` and
``final_valid_ppl`` into its ``results.json`` (single process). ``--model`` evaluates another state
dict of the run instead, e.g. an average of its epoch models
(``python -m gossip_accel.bin.average_checkpoints --exp-dir <run> --avg 5 --avg-mode best``, with
``train.save_epoch_models=true``), and writes ``<model stem>_test_ppl`` / ``_valid_ppl``
(``avg_best5_test_ppl``); ``final_*`` stay the final model's. ``--every-epoch`` also evaluates every
epoch model (``epoch_test_ppl``: epoch -> perplexity), the curve of test perplexity the training logs
only for valid.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from ..data.lm import Vocabulary, batchify, read_lines
from ..train.average_checkpoints import available_epochs
from .train_lm import build_model, load_conf, perplexity


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exp-dir", required=True)
    ap.add_argument("--model", default=None, help="a state dict to evaluate instead of <exp-dir>/final.pt")
    ap.add_argument("--every-epoch", action="store_true",
                    help="also every epoch model of <exp-dir>/epoch_models (train.save_epoch_models=true): "
                         "results.json's epoch_valid_ppl / epoch_test_ppl")
    args = ap.parse_args()
    exp = Path(args.exp_dir)
    for f in ("config.yaml", "final.pt", "results.json"):
        if not (exp / f).is_file():
            raise SystemExit(f"eval_lm: {exp / f} not found; run the training stage first")
    model_file = Path(args.model) if args.model else exp / "final.pt"
    if not model_file.is_file():
        raise SystemExit(f"eval_lm: --model {model_file} not found")
    epochs = available_epochs(exp) if args.every_epoch else {}
    if args.every_epoch and not epochs:
        raise SystemExit(f"eval_lm: --every-epoch: {exp} has no epoch models (train with train.save_epoch_models=true)")
    conf = load_conf([str(exp / "config.yaml")], [])
    data = Path(conf.data.dir)
    vocab = Vocabulary.load(data / conf.data.vocab)
    paths = {split: data / getattr(conf.data, split) for split in ("valid", "test")}
    splits = {split: batchify(vocab.encode(read_lines(path)), conf.train.streams)
              for split, path in paths.items() if path.is_file()}
    model = build_model(conf, vocab)

    def evaluate(state: dict) -> dict[str, float]:
        model.load_state_dict(state)
        return {split: perplexity(model, ids, conf.train.bptt) for split, ids in splits.items()}

    results = json.loads((exp / "results.json").read_text())
    key = "final" if args.model is None else model_file.stem
    for split, ppl in evaluate(torch.load(model_file, map_location="cpu", weights_only=True)).items():
        results[f"{key}_{split}_ppl"] = ppl
        print(f"eval_lm: {exp.name}: {model_file.name}: {split} perplexity {ppl:.2f} ({paths[split]})")
    per_epoch = {e: evaluate(load()) for e, (_, load) in tqdm(epochs.items(), desc=f"eval_lm {exp.name} epochs",
                                                               disable=not epochs)}
    for split in splits if per_epoch else ():
        results[f"epoch_{split}_ppl"] = {str(e): r[split] for e, r in per_epoch.items()}
        print(f"eval_lm: {exp.name}: {split} perplexity per epoch: "
              + " ".join(f"{e}:{r[split]:.2f}" for e, r in per_epoch.items()))
    results["eval_config"] = OmegaConf.to_container(conf.data)
    (exp / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
