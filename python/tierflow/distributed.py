"""tierflow under torch.distributed: rank-local placement and per-rank metrics.

tierflow does not shard: an engine you already run does (``ZeroRedundancyOptimizer`` with
``optimizer_class=tierflow.torch.OffloadAdamW``), and each rank's OffloadAdamW offloads its own
shard to its own node's tiers. This module adds what a rank needs around that; see
docs/distributed.md.

Placement rule (:func:`local_node`): a rank whose GPU's PCI device names a NUMA node uses that
node; any other rank (no GPU, or a GPU whose node is unknown) takes the machine's DRAM nodes
(nodes with CPUs and memory, in order) round-robin by local rank: local rank r gets node
``dram_nodes[r % len(dram_nodes)]``. :func:`local_placement` turns that node into a placement
spec for ``OffloadAdamW(placement=...)``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

__all__ = ["dram_nodes", "format_table", "gather_metrics", "local_node", "local_placement"]

_STATE_CLASSES = ("optimizer_state", "master_params")


def _node_list(text: str) -> list[int]:
    """Parses a sysfs node list such as ``0-2,4``."""
    nodes = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        nodes.extend(range(int(first), int(last or first) + 1))
    return nodes


def dram_nodes(sysfs_root="/") -> list[int]:
    """NUMA nodes with both CPUs and memory, ascending (``[0]`` when sysfs says nothing)."""
    base = Path(sysfs_root) / "sys/devices/system/node"
    try:
        cpus = set(_node_list((base / "has_cpu").read_text()))
        memory = set(_node_list((base / "has_memory").read_text()))
    except OSError:
        return [0]
    return sorted(cpus & memory) or [0]


def _local_rank(local_rank: Optional[int]) -> int:
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not isinstance(local_rank, int) or local_rank < 0:
        raise ValueError(f"local_rank must be an int >= 0, not {local_rank!r}")
    return local_rank


def _gpu_node(local_rank: int, sysfs_root) -> Optional[int]:
    """The NUMA node of local rank's GPU from its PCI device, or None when unknown."""
    if not torch.cuda.is_available() or local_rank >= torch.cuda.device_count():
        return None
    props = torch.cuda.get_device_properties(local_rank)
    # torch >= 2.2 reports the PCI address; older versions cannot tie a GPU to a node.
    bus = getattr(props, "pci_bus_id", None)
    if bus is None or getattr(props, "pci_domain_id", None) is None:
        return None
    address = f"{props.pci_domain_id:04x}:{bus:02x}:{props.pci_device_id:02x}.0"
    try:
        node = int((Path(sysfs_root) / "sys/bus/pci/devices" / address / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def local_node(local_rank: Optional[int] = None, sysfs_root="/") -> tuple[int, str]:
    """The NUMA node for this local rank's optimizer state, and why (see the module's rule).

    @param local_rank: default ``$LOCAL_RANK`` (0 when unset)."""
    local_rank = _local_rank(local_rank)
    node = _gpu_node(local_rank, sysfs_root)
    if node is not None:
        return node, f"nearest node of GPU {local_rank}"
    nodes = dram_nodes(sysfs_root)
    node = nodes[local_rank % len(nodes)]
    return node, f"local rank {local_rank} round-robin over DRAM nodes {nodes}"


def local_placement(local_rank: Optional[int] = None, sysfs_root="/") -> str:
    """A placement spec for ``OffloadAdamW(placement=...)`` that puts the Adam state (moments
    and master weights) in DRAM near this local rank, spilling to CXL.

    tierflow names host tiers relative to its initiator (the node nearest GPU 0, else the first
    node with CPUs): the initiator's node is ``dram0``, other nodes with CPUs are
    ``remote_dram`` tiers. So a rank whose node is the initiator gets ``dram0``; another gets
    kind ``remote_dram`` (the tier of its node on a two-socket machine; on machines with more
    sockets, the remote DRAM tiers in order)."""
    node, _ = local_node(local_rank, sysfs_root)
    initiator = _gpu_node(0, sysfs_root)
    if initiator is None:
        initiator = dram_nodes(sysfs_root)[0]
    near = "dram0" if node == initiator else "remote_dram"
    return ";".join(f"{cls}={near},cxl,dram" for cls in _STATE_CLASSES)


def gather_metrics(optimizer, group=None, dst: int = 0) -> Optional[list]:
    """Each rank's ``optimizer.metrics()`` tagged with ``"rank"`` (and ``"where"``: its state's
    NUMA nodes), gathered to rank ``dst``: a list in rank order there, None elsewhere.

    Collective: every rank of ``group`` must call it. ``optimizer`` is an OffloadAdamW or a
    ZeroRedundancyOptimizer over one (its local ``optim``)."""
    local = getattr(optimizer, "optim", optimizer)
    record = dict(local.metrics())
    record["rank"] = dist.get_rank()
    record["where"] = local.where()
    out = [None] * dist.get_world_size(group) if dist.get_rank() == dst else None
    dist.gather_object(record, out, dst=dst, group=group)
    return out


def _mib(value) -> str:
    return f"{value / 2**20:.2f}"


def format_table(records: list) -> str:
    """One line per rank: mode, params, state bytes, steps, last and mean step time, tiers."""
    header = ("rank", "mode", "params", "state MiB", "steps", "last ms", "mean ms", "tiers")
    rows = [header]
    for r in records:
        adam = r["adam"]
        steps = adam["steps"]
        mean = adam["step_seconds_total"] / steps * 1e3 if steps else 0.0
        tiers = sorted(set(r.get("where", {}).get("node_tiers", {}).values()))
        rows.append((str(r["rank"]), adam["mode"], str(adam["params"]),
                     _mib(adam["state_bytes"]), str(steps),
                     f"{adam['last_step_seconds'] * 1e3:.2f}", f"{mean:.2f}",
                     ",".join(tiers) or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in rows)
