"""DTensor params (FSDP2's ``fully_shard``): each rank steps the shard it holds.

FSDP2 (torch >= 2.4) replaces each param by a DTensor sharded on dim 0 over a 1-D mesh; the
rank's shard is the DTensor's local tensor, a contiguous view into the padded buffer that FSDP2
all-gathers from, so an update written into it in place is what the next forward sees. Its
grad is a DTensor of the same layout after backward. A rank may hold 0 rows of a param with
fewer rows than ranks (its local tensor is empty). Written against torch's source
(torch/distributed/tensor/_api.py, torch/distributed/fsdp/_fully_shard/_fsdp_param.py); torch
1.13 has no DTensor, where every function here sees plain tensors only.
"""
from __future__ import annotations

from typing import Optional

import torch


def is_dtensor(tensor) -> bool:
    """A torch >= 2 DTensor (matched by class name: torch 1.13 has none to import)."""
    return any(cls.__name__ == "DTensor" for cls in type(tensor).__mro__)


def local(tensor):
    """The tensor this rank holds of ``tensor`` (``tensor`` itself when it is not a DTensor):
    for a param, the storage the step updates in place."""
    if not is_dtensor(tensor):
        return tensor
    inner = getattr(tensor, "_local_tensor", None)
    if isinstance(inner, torch.Tensor):
        return inner
    with torch.no_grad():  # to_local() without autograd returns the local tensor itself
        return tensor.to_local()


def grad(param) -> Optional[torch.Tensor]:
    """The param's grad as this rank holds it (its local tensor when the grad is a DTensor)."""
    g = param.grad
    return None if g is None else local(g)


def version(param):
    """What changes when the param is written outside the optimizer: its version counter, and
    for a DTensor its local tensor's too (an in-place op bumps the outer one, a write through
    the local tensor only the inner one)."""
    outer = getattr(param, "_version", None)
    if not is_dtensor(param):
        return outer
    return outer, getattr(local(param), "_version", None)


def unsupported_layout(param) -> Optional[str]:
    """Why the step cannot run on this DTensor param's layout, or None: only Shard(0) on a 1-D
    mesh (FSDP2 without HSDP or tensor parallelism) is stepped shard by shard."""
    mesh, placements = param.device_mesh, tuple(param.placements)
    if mesh.ndim != 1 or len(placements) != 1:
        return (f"placements {placements} on a {mesh.ndim}-D mesh (HSDP or tensor "
                "parallelism)")
    placement = placements[0]
    if type(placement).__name__ != "Shard" or getattr(placement, "dim", None) != 0:
        return f"placement {placement!r}"
    return None


def like(param, flat: torch.Tensor):
    """``flat`` (this rank's shard of a state tensor, flattened) as a DTensor with the param's
    mesh, placements, global shape and stride, as torch's AdamW keeps its state under FSDP2.
    DTensor.from_local puts the local tensor on the mesh's device type."""
    dtensor_class = next(cls for cls in type(param).__mro__ if cls.__name__ == "DTensor")
    shard = local(param)
    with torch.no_grad():
        return dtensor_class.from_local(flat.view(shard.shape).to(shard.device),
                                        param.device_mesh, param.placements, run_check=False,
                                        shape=param.shape, stride=param.stride())
