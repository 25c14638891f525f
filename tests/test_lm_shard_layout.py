"""How the LM's training text is dealt out to the workers (``data.shard_layout``)."""
from __future__ import annotations

import pytest
import torch

from gossip_accel.bin.train_lm import load_conf
from gossip_accel.data.lm import batchify, shard, worker_streams
from gossip_accel.sync.config import ConfigError

WORLD, STREAMS = 4, 8


def test_contiguous_is_the_shard_of_algorithm_1():
    ids = torch.arange(10_007)
    for r in range(WORLD):
        assert torch.equal(worker_streams(ids, r, WORLD, STREAMS), batchify(shard(ids, r, WORLD), STREAMS))


def test_interleaved_gives_every_worker_every_part_of_the_text():
    ids = torch.arange(9_600)  # four "books" of 2,400 tokens each
    book = lambda t: int(t) // 2_400  # noqa: E731
    seen = {layout: [{book(t) for t in worker_streams(ids, r, WORLD, STREAMS, layout).reshape(-1)}
                     for r in range(WORLD)] for layout in ("contiguous", "interleaved")}
    assert seen["contiguous"] == [{0}, {1}, {2}, {3}]  # a worker reads one book
    assert seen["interleaved"] == [{0, 1, 2, 3}] * WORLD  # every worker reads every book


def test_both_layouts_deal_out_the_same_streams_disjointly():
    ids = torch.arange(9_600)  # 9,600 = 4 x 8 x 300: no tail dropped, so DDP's step sees the same windows
    streams = {}
    for layout in ("contiguous", "interleaved"):
        mats = [worker_streams(ids, r, WORLD, STREAMS, layout) for r in range(WORLD)]
        assert all(m.shape == (STREAMS, 300) for m in mats)
        rows = [tuple(row.tolist()) for m in mats for row in m]
        assert len(set(rows)) == WORLD * STREAMS
        streams[layout] = set(rows)
    assert streams["contiguous"] == streams["interleaved"]


def test_an_unknown_layout_is_a_config_error_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"data.shard_layout='books': expected one of contiguous, interleaved"):
        load_conf([], ["data.shard_layout=books"])
    with pytest.raises(ValueError, match="shard layout 'books'"):
        worker_streams(torch.arange(100), 0, 2, 2, "books")
