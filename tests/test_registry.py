"""The algorithm registry (gossip_accel/sync/registry.py) and the places that read it."""
import re
from pathlib import Path

import pytest

from gossip_accel.sync import registry
from gossip_accel.sync.config import ALGORITHMS, ConfigError, load_sync_config
from gossip_accel.sync.topology import FullTopology, PairTopology, RingTopology, make_topology

DOC = Path(__file__).resolve().parent.parent / "docs" / "ALGORITHMS.md"


def test_the_support_table_of_the_docs_is_the_registry():
    text = DOC.read_text()
    m = re.search(r"<!-- registry:support_table -->\n(.*?)\n<!-- /registry:support_table -->", text, re.S)
    assert m, f"{DOC} lost its registry:support_table markers"
    assert m.group(1) == registry.support_table(), (
        "docs/ALGORITHMS.md's support table differs from the registry; regenerate it with "
        "python -c 'from gossip_accel.sync import registry; print(registry.support_table())'")


def test_the_algorithm_table_of_the_docs_lists_the_registry_in_order():
    text = DOC.read_text()
    header = text.index("| `sync.algorithm` | graph / who is averaged")
    rows = re.findall(r"^\| `(\w+)` \|", text[header:].split("\n\n")[0], re.M)
    assert tuple(rows) == registry.names()


def test_every_entry_is_consistent():
    assert ALGORITHMS == registry.names() and len(set(ALGORITHMS)) == len(ALGORITHMS)
    for a in registry.ALGORITHMS:
        assert a.family in registry.FAMILIES and a.graph in registry.GRAPHS
        assert (Path(registry.__file__).parent / "algorithms" / f"{a.rule}.py").is_file(), a
        assert (a.pairing is not None) == (a.family == "pairwise")
        assert not a.bmuf_slots or a.family == "periodic"
        assert a.outer_optimizer == a.bmuf_slots  # an outer optimizer replaces the BMUF rule (outer.py)
        assert (a.graph == "server") == (a.family == "server")
        cfg = load_sync_config(None, [f"sync.algorithm={a.name}"])
        assert cfg.spec is a and (cfg.uses_bmuf, cfg.graph, cfg.is_async) == (a.bmuf_slots, a.graph, a.asynchronous)


@pytest.mark.parametrize("name", registry.names())
def test_make_topology_follows_the_registry(name):
    a = registry.get(name)
    topo = make_topology(name, 8, 2, 4 if a.all_neighbours else 2, 0)
    expected = {"full": FullTopology, "server": FullTopology, "ring": PairTopology if a.pairing else RingTopology}
    assert type(topo) is expected[a.graph]
    if a.pairing:
        assert topo.pattern == a.pairing


def test_supports_are_enforced_by_the_config():
    for field, override in (("warmup", "sync.warmup_steps=4"), ("low_precision_wire", "sync.exchange_dtype=bfloat16"),
                            ("hierarchy", "sync.hierarchy.group_size=2")):
        for a in registry.ALGORITHMS:
            args = [f"sync.algorithm={a.name}", override]
            if getattr(a, field):
                load_sync_config(None, args)
            else:
                with pytest.raises(ConfigError, match=override.split("=")[0]):
                    load_sync_config(None, args)


def test_unknown_name():
    with pytest.raises(KeyError, match="choose one of ma, bmuf"):
        registry.get("bmfu")
    with pytest.raises(ConfigError, match="sync.algorithm='bmfu' is unknown"):
        load_sync_config(None, ["sync.algorithm=bmfu"])
