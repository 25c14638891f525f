"""Hierarchical synchronization: gradients all-reduced inside a group, components synchronized between groups.

The W processes of a run form G = W / g groups of g consecutive ranks (``sync.hierarchy``;
typically one group per node, whose ranks share fast links). Group j holds ranks
j g .. j g + g - 1; a rank's *local rank* is ``rank mod g``.

* **Inside a group, every step**: the gradients are averaged over the group's ranks (for a DDP
  model torch's own ``allreduce_hook`` with the group's process group as state:
  :meth:`HierarchicalSynchronizer.ddp_comm_hook`; for a plain model
  :meth:`HierarchicalSynchronizer.allreduce_gradients` after ``backward``). The ranks of a
  group therefore take the same optimizer step from the same model: a group is one replica of
  Algorithm 1 of 000 whose mini-batch is the union of its ranks' batches.
* **Between groups, every H_i steps**: component i is synchronized with ``sync.algorithm``
  among the G replicas (MA, BMUF, local/gossip on a ring of G nodes: the topology, p, q and the
  eq. 6 default of the block momentum count groups, not ranks). The work is spread over the
  ranks of a group: component i is *carried* by one local rank c(i) (``sync.hierarchy.carriers``:
  greedy byte balance or i mod g), which runs the algorithm over the cross-group process group
  of the ranks with local rank c(i) (one per group), keeps the BMUF slots of its components
  only, and then broadcasts the new component inside its group. Every local rank's link to the
  other groups is used, each for its share of the model.
* The float buffers (BatchNorm statistics: every rank normalizes its own batch) are averaged
  (or broadcast from rank 0) inside the group and then between groups, which for equal groups
  is the average over all W ranks.

The oracle is :class:`gossip_accel.sync.simulate.HierarchicalCluster` (tests/test_hierarchical.py).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from .comm import Communicator, ring_allreduce_bytes
from .components import Component
from .config import ConfigError, SyncConfig, load_sync_config
from .synchronizer import Synchronizer, broadcast_components
from .topology import TopologyError
from .warmup import allreduce_gradients

STATE_KEY = "hierarchy"


@dataclass(frozen=True)
class GroupLayout:
    """G = world / g groups of g consecutive ranks."""

    world: int
    group_size: int

    @property
    def groups(self) -> int:
        return self.world // self.group_size

    def group_of(self, rank: int) -> int:
        return rank // self.group_size

    def local_rank(self, rank: int) -> int:
        return rank % self.group_size

    def members(self, group: int) -> list[int]:
        """The ranks of group ``group`` (intra-group process group)."""
        return list(range(group * self.group_size, (group + 1) * self.group_size))

    def peers(self, local_rank: int) -> list[int]:
        """The ranks with local rank ``local_rank``, one per group (cross-group process group)."""
        return [j * self.group_size + local_rank for j in range(self.groups)]


def assign_carriers(sizes: Sequence[int], group_size: int, policy: str = "balanced") -> list[int]:
    """The local rank that carries each component between groups.

    ``round_robin``: component i on local rank i mod g. ``balanced``: components in decreasing
    size (ties: lower index first) each go to the least-loaded local rank (ties: lowest), the
    greedy rule for equal bytes per link. A pure function of the sizes: every rank agrees.
    """
    if policy == "round_robin":
        return [i % group_size for i in range(len(sizes))]
    if policy != "balanced":
        raise ConfigError(f"sync.hierarchy.carriers={policy!r}; choose balanced or round_robin")
    load = [(0, r) for r in range(group_size)]
    out = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        used, r = heapq.heappop(load)
        out[i] = r
        heapq.heappush(load, (used + sizes[i], r))
    return out


@dataclass
class ProcessGroups:
    """This rank's intra-group and cross-group process groups."""

    intra: dist.ProcessGroup
    cross: dist.ProcessGroup

    @classmethod
    def create(cls, layout: GroupLayout) -> "ProcessGroups":
        """A collective: every rank creates every group, in the same order (torch's rule for new_group)."""
        rank = dist.get_rank()
        intra = cross = None
        for j in range(layout.groups):
            pg = dist.new_group(layout.members(j))
            if j == layout.group_of(rank):
                intra = pg
        for r in range(layout.group_size):
            pg = dist.new_group(layout.peers(r))
            if r == layout.local_rank(rank):
                cross = pg
        return cls(intra=intra, cross=cross)


def group_allreduce_hook(comm: Communicator, bucket):  # no annotations: DDP checks them (strings here)
    """DDP comm hook: torch's ``allreduce_hook`` on ``comm.group`` (mean over the group's ranks),
    counting the ring all-reduce bytes like :meth:`Communicator.allreduce_mean`."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    buf = bucket.buffer()
    moved = ring_allreduce_bytes(buf.numel() * buf.element_size(), comm.world_size)
    comm.stats.add("gradients", moved, moved, 0.0)
    return allreduce_hook(comm.group, bucket)


def resolved_group_size(cfg: SyncConfig, world: Optional[int] = None) -> int:
    """g for this run (1: flat); ``world`` defaults to the launched world size."""
    if world is None:
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if not cfg.enabled or world < 2:
        return 1
    return cfg.hierarchy.resolved_group_size(world)


def share_buffers_in_group(intra_comm: Communicator, buffers: Component, policy: str) -> None:
    """The float buffers inside a group (each rank normalizes its own batch): the group's mean
    (``sync.buffers: average``) or its local rank 0's (``broadcast``), before the sync between groups."""
    buffers.gather()
    if policy == "average":
        intra_comm.allreduce_mean(buffers.name, buffers.flat)
    else:
        intra_comm.broadcast(buffers.name, buffers.flat, src=0)
    buffers.scatter()


class HierarchicalSynchronizer(Synchronizer):
    """A :class:`Synchronizer` whose replicas are groups of ranks (see the module docstring).

    The training loop is the flat one plus the gradient average inside the group::

        sync = HierarchicalSynchronizer(model, "conf/sync.yaml", ["sync.hierarchy.group_size=8"])
        loss.backward(); sync.allreduce_gradients(); opt.step(); opt.zero_grad(); sync.step()

    (for a DDP model register :meth:`ddp_comm_hook` instead of calling ``allreduce_gradients``).
    ``self.comm`` is the cross-group transport (its counters: the traffic between groups that this
    rank carries); ``self.intra_comm`` the group's (gradients and the shares of new components).
    """

    def __init__(self, model: torch.nn.Module, config: Any = None, overrides: Sequence[str] = (),
                 process_group: Optional[dist.ProcessGroup] = None):
        cfg = load_sync_config(config, overrides)
        if process_group is not None and process_group is not dist.group.WORLD:
            raise ConfigError("HierarchicalSynchronizer groups the whole world (process_group=None); "
                              "sub-worlds are not supported")
        if not (dist.is_available() and dist.is_initialized()):
            raise ConfigError("sync.hierarchy needs torch.distributed initialised (launch with torchrun or "
                              "accelerate launch), or set sync.hierarchy.group_size=null")
        world = dist.get_world_size()
        g = resolved_group_size(cfg, world)
        if g == 1:
            raise ConfigError(f"sync.hierarchy.group_size={cfg.hierarchy.group_size!r} resolves to 1 (flat) "
                              f"with {world} processes: use Synchronizer, or make_synchronizer() which chooses")
        self.layout = GroupLayout(world, g)
        self.global_rank = dist.get_rank()
        self.local_rank = self.layout.local_rank(self.global_rank)
        self.groups = ProcessGroups.create(self.layout)
        self.intra_comm = Communicator(self.groups.intra)
        self._carrier: Optional[list[int]] = None
        try:
            super().__init__(model, cfg, process_group=self.groups.cross)
        except TopologyError as e:
            raise ConfigError(f"{e} [sync.hierarchy: the nodes of the ring are the {self.layout.groups} groups of "
                              f"{g} ranks; lower sync.hierarchy.group_size for more groups]") from e

    # -- the gradient average inside the group ----------------------------------------------
    def allreduce_gradients(self) -> None:
        """grad <- mean of the group's gradients, one flat all-reduce (call after backward).

        Parameters without a gradient are skipped (every rank of a group must skip the same).
        """
        allreduce_gradients(self.intra_comm, list(self.model.parameters()))

    def ddp_comm_hook(self) -> tuple[Any, Any]:
        """(state, hook) for ``DistributedDataParallel.register_comm_hook``: torch's own
        ``allreduce_hook`` on the group's process group (it divides by the group size), with the
        bytes counted in ``intra_comm`` under ``gradients``."""
        return self.intra_comm, group_allreduce_hook

    # -- what the flat Synchronizer delegates ----------------------------------------------------
    @property
    def carriers(self) -> list[int]:
        """Local rank carrying each component (by component index)."""
        if self._carrier is None:
            self._carrier = assign_carriers([c.nbytes for c in self.components], self.layout.group_size,
                                            self.cfg.hierarchy.carriers)
        return self._carrier

    def _carries(self, comp: Component) -> bool:
        return self.carriers[comp.index] == self.local_rank

    def _share(self, comps: list[Component]) -> None:
        """The carrier of each component broadcasts its new value inside the group (fp32: the ranks
        of a group stay bitwise equal)."""
        broadcast_components(self.intra_comm, comps, lambda comp: self.carriers[comp.index])

    def _broadcast_initial(self) -> None:
        """Rank 0's theta_0 everywhere: inside each group from local rank 0, then between groups."""
        with self.intra_comm.accounting(self.oneoff_stats):
            broadcast_components(self.intra_comm, self._all_components())
        super()._broadcast_initial()

    def _agreement_group(self) -> Optional[dist.ProcessGroup]:
        """Every rank of the world agrees (the cross-group process group holds one rank per group)."""
        return None

    def _fingerprint(self) -> dict[str, str]:
        items = super()._fingerprint()
        items["world.hierarchy"] = f"{self.layout.world} ranks in groups of {self.layout.group_size}"
        return items

    def _before_buffers(self, buffers: Component) -> None:
        """Buffers: the group's mean (or local rank 0's) first, then the flat policy between groups."""
        share_buffers_in_group(self.intra_comm, buffers, self.cfg.buffers)

    def finalize(self) -> None:
        """Line 20 between groups (the ranks of a group hold the same model): the mean of all W ranks."""
        if self.active and not self.finalized:
            with self.intra_comm.accounting(self.oneoff_stats):
                super().finalize()
        self.finalized = True

    # -- metrics and state -----------------------------------------------------------------------
    def traffic_split(self) -> dict[str, float]:
        """Bytes sent so far by this rank: ``cross`` (between groups: the slow links) and ``intra``
        (gradients and component shares inside the group)."""
        return {"cross": self.comm.stats.total().bytes_sent if self.comm else 0.0,
                "intra": self.intra_comm.stats.total().bytes_sent}

    def metrics(self) -> dict[str, float]:
        """The flat metrics (``sync/bytes_*``: cross-group traffic of the components this rank
        carries) plus ``sync/intra_bytes_*`` (inside the group) and the layout."""
        out = super().metrics()
        for name, c in self.intra_comm.stats.snapshot().items():
            out[f"sync/intra_bytes_sent/{name}"] = c.bytes_sent
            out[f"sync/intra_bytes_recv/{name}"] = c.bytes_recv
        total = self.intra_comm.stats.total()
        out.update({"sync/intra_bytes_sent": total.bytes_sent, "sync/intra_bytes_recv": total.bytes_recv,
                    "sync/intra_seconds": total.seconds, "sync/groups": float(self.layout.groups),
                    "sync/group_size": float(self.layout.group_size),
                    "sync/carried_components": float(len(self._carried()))})
        return out

    def state_dict(self) -> dict:
        state = super().state_dict()
        state[STATE_KEY] = {"world": self.layout.world, "group_size": self.layout.group_size,
                            "global_rank": self.global_rank, "carriers": list(self.carriers),
                            "intra_comm": self.intra_comm.stats.state_dict()}
        return state

    def load_state_dict(self, state: dict) -> None:
        mine = {"world": self.layout.world, "group_size": self.layout.group_size,
                "global_rank": self.global_rank, "carriers": list(self.carriers)}
        theirs = state.get(STATE_KEY)
        if theirs is None:
            raise ConfigError("synchronizer checkpoint is from a flat run, this run is hierarchical "
                              f"(sync.hierarchy.group_size={self.layout.group_size}); resume with the same sync config")
        for key, value in mine.items():
            if theirs.get(key) != value:
                raise ConfigError(f"synchronizer checkpoint has hierarchy {key}={theirs.get(key)!r} but this run has "
                                  f"{value!r}; resume with the same sync.hierarchy and number of processes")
        super().load_state_dict(state)
        self.intra_comm.stats.load_state_dict(theirs.get("intra_comm", {}))


def make_synchronizer(model: torch.nn.Module, config: Any = None, overrides: Sequence[str] = ()) -> Synchronizer:
    """The synchronizer ``sync.hierarchy`` asks for: hierarchical when it resolves to g > 1, else flat."""
    cfg = load_sync_config(config, overrides)
    if resolved_group_size(cfg) > 1:
        return HierarchicalSynchronizer(model, cfg)
    return Synchronizer(model, cfg)


__all__ = ["GroupLayout", "HierarchicalSynchronizer", "ProcessGroups", "assign_carriers",
           "make_synchronizer", "resolved_group_size"]
