"""tierflow under torch.distributed: rank-local placement and per-rank metrics.

tierflow does not shard: an engine you already run does (``ZeroRedundancyOptimizer`` with
``optimizer_class=tierflow.torch.OffloadAdamW``), and each rank's OffloadAdamW offloads its own
shard to its own node's tiers. This module adds what a rank needs around that; see
docs/distributed.md.

Placement rule (:func:`local_node`): a rank whose GPU has a nearest NUMA node in the library's
topology (``tf_topology_json``, the document ``tierflow topo --json`` prints) uses that node;
any other rank (no GPU, or a GPU whose node is unknown) takes the machine's DRAM nodes
(nodes with CPUs and memory, in order) round-robin by local rank: local rank r gets node
``dram_nodes[r % len(dram_nodes)]``. :func:`local_placement` turns that node into a placement
spec for ``OffloadAdamW(placement=...)``.
"""
from __future__ import annotations

import os
from typing import Optional

import torch
import torch.distributed as dist

from tierflow import _capi

__all__ = ["dram_nodes", "format_table", "gather_metrics", "local_node", "local_placement"]

_STATE_CLASSES = ("optimizer_state", "master_params")


def _topology(sysfs_root) -> dict:
    """The library's topology document (tf_topology_json, as ``tierflow topo --json`` prints
    it): the live machine, or the sysfs tree under ``sysfs_root``."""
    root = os.fspath(sysfs_root)
    return _capi.json_call("tf_topology_json", None if root in ("", "/") else root.encode())


def dram_nodes(sysfs_root="/") -> list[int]:
    """NUMA nodes with CPUs, ascending (the topology lists only nodes with memory; ``[0]`` when
    it names none or cannot be read)."""
    try:
        topo = _topology(sysfs_root)
    except _capi.TierflowError:
        return [0]
    return sorted(n["id"] for n in topo["nodes"] if n["has_cpu"]) or [0]


def _local_rank(local_rank: Optional[int]) -> int:
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not isinstance(local_rank, int) or local_rank < 0:
        raise ValueError(f"local_rank must be an int >= 0, not {local_rank!r}")
    return local_rank


def _gpu_node(local_rank: int, topo: dict) -> Optional[int]:
    """The NUMA node nearest local rank's GPU, as the library found it (by its CUDA index, or
    its PCI address where torch reports one), or None when unknown."""
    if not torch.cuda.is_available() or local_rank >= torch.cuda.device_count():
        return None
    props = torch.cuda.get_device_properties(local_rank)
    address = None
    if getattr(props, "pci_bus_id", None) is not None and \
            getattr(props, "pci_domain_id", None) is not None:  # torch >= 2.2
        address = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    for gpu in topo["gpus"]:
        if gpu["nearest_nodes"] and (gpu["cuda_index"] == local_rank
                                     or (address is not None and gpu["pci_bus_id"] == address)):
            return gpu["nearest_nodes"][0]
    return None


def local_node(local_rank: Optional[int] = None, sysfs_root="/") -> tuple[int, str]:
    """The NUMA node for this local rank's optimizer state, and why (see the module's rule).

    @param local_rank: default ``$LOCAL_RANK`` (0 when unset)."""
    local_rank = _local_rank(local_rank)
    node = _gpu_node(local_rank, _topology(sysfs_root))
    if node is not None:
        return node, f"nearest node of GPU {local_rank}"
    nodes = dram_nodes(sysfs_root)
    node = nodes[local_rank % len(nodes)]
    return node, f"local rank {local_rank} round-robin over DRAM nodes {nodes}"


def local_placement(local_rank: Optional[int] = None, sysfs_root="/") -> str:
    """A placement spec for ``OffloadAdamW(placement=...)`` that puts the Adam state (moments
    and master weights) in DRAM near this local rank, spilling to CXL.

    tierflow names host tiers relative to its initiator (the library's rule: the node nearest
    GPU 0, else the first node with CPUs): the initiator's node is ``dram0``, other nodes with
    CPUs are ``remote_dram`` tiers. So a rank whose node is the initiator gets ``dram0``;
    another gets kind ``remote_dram`` (the tier of its node on a two-socket machine; on
    machines with more sockets, the remote DRAM tiers in order)."""
    node, _ = local_node(local_rank, sysfs_root)
    near = "dram0" if node == _topology(sysfs_root)["initiator"] else "remote_dram"
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
