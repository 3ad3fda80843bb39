"""What OffloadAdamW accepts: params, groups and options, checked before any C optimizer
exists. The values are checked by the library (tf_adam_check), once; what is left here is
Python's own: types, torch's flags tierflow does not implement, DTensor layouts."""
from __future__ import annotations

import ctypes
import math

import torch

from tierflow import _capi, _dtensor, _params

_DTYPES = {
    torch.float32: _capi.DTYPE_F32,
    torch.bfloat16: _capi.DTYPE_BF16,
    torch.float16: _capi.DTYPE_F16,
}
# overlap= values, in the order of tf_adam_options.overlap (0, 1, 2). "backward_publish" also
# writes (or sends up) each param's new values as soon as its update is done, before step():
# read no param between backward() and step().
_OVERLAPS = ("none", "backward", "backward_publish")
# Flags of torch's Adam(W) that tierflow's step does not implement: name -> what is accepted.
_UNSUPPORTED = ("amsgrad", "maximize", "capturable", "differentiable", "fused")



def _label(param, index: int, group: int) -> str:
    shape = tuple(param.shape) if isinstance(param, torch.Tensor) else "?"
    dtype = str(param.dtype).replace("torch.", "") if isinstance(param, torch.Tensor) else "?"
    return f"param {index} (group {group}, shape {shape}, {dtype})"


def _check_param(param, label: str) -> None:
    """Refuses a param the step cannot run, naming it. @raises TypeError, ValueError"""
    if not isinstance(param, torch.Tensor):
        raise TypeError(f"{label}: optimizer can only optimize Tensors, not "
                        f"{type(param).__name__}")
    if _dtensor.is_dtensor(param):
        layout = _dtensor.unsupported_layout(param)
        if layout is not None:
            raise TypeError(f"{label}: the param is a DTensor with {layout}; tierflow steps "
                            "each rank's shard of FSDP2's Shard(0) on a 1-D mesh only, see "
                            "docs/distributed.md")
        param = _dtensor.local(param)  # the rest is about the storage this rank updates
    if param.layout != torch.strided:
        raise ValueError(f"{label}: sparse params are not supported ({param.layout})")
    if param.is_complex():
        raise TypeError(f"{label}: complex params are not supported (use torch.view_as_real)")
    if param.dtype not in _DTYPES:
        raise TypeError(f"{label}: dtype {param.dtype} is not supported "
                        "(float32, bfloat16 or float16)")
    if not param.is_contiguous() and _params.weight_of(param) is None:
        raise ValueError(f"{label}: the param is not contiguous")
    if param.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{label}: params on {param.device} are not supported (cpu or cuda)")


def _home(param) -> tuple:
    """Where the step updates ``param``: ("weight", session, index) for a weight that
    offload_parameters holds in a tier (its tier copy, in that session), else ("memory",
    address) (in place)."""
    weight = _params.weight_of(param)
    if weight is not None:
        return ("weight", weight[0].value, weight[1])
    return ("memory", _dtensor.local(param).data_ptr())


def _holds_elements(param) -> bool:
    """Whether this process holds any element of ``param`` (a DTensor's shard may be empty)."""
    return _dtensor.local(param).numel() > 0


def _check_group(group: dict, index: int) -> None:
    """Refuses hyper-parameters or flags the step cannot run (the values by the library's own
    check, tf_adam_check). @raises ValueError"""
    where = f"group {index}"
    for flag in _UNSUPPORTED:
        if group.get(flag):
            raise ValueError(f"{where}: {flag}={group[flag]!r} is not supported by tierflow")
    betas = group["betas"]
    if len(betas) != 2:
        raise ValueError(f"{where}: invalid betas {tuple(betas)} (two values)")
    hyper = _capi.AdamHyper(float(group["lr"]), float(betas[0]), float(betas[1]),
                            float(group["eps"]), float(group["weight_decay"]), 1, 1,
                            _state_dtype_index(group.get("state_dtype"), where))
    _capi.call("tf_adam_check", ctypes.byref(hyper), index, None)


def _state_dtype_index(state_dtype, where: str) -> int:
    """A param group's ``state_dtype`` (None: the optimizer's) as tf_adam_hyper.state_dtype.
    @raises ValueError"""
    if state_dtype is None:
        return -1
    if state_dtype not in _capi.STATE_DTYPES:
        raise ValueError(f"{where}: state_dtype must be one of {_capi.STATE_DTYPES} (or None: "
                         f"the optimizer's), not {state_dtype!r}")
    return _capi.STATE_DTYPES.index(state_dtype)


def _torch_defaults(torch_class, **hyper) -> dict:
    """The defaults torch's own optimizer puts in each param group, in this torch version."""
    probe = torch_class([torch.zeros(1, requires_grad=True)], **hyper)
    return dict(probe.defaults)


def make_options(max_grad_norm, mode, placement, chunk_elements, threads, overlap="none",
                 release_grads=None, state_dtype="fp32", master="fp32") -> dict:
    """The optimizer-wide options as a dict (what ``_options`` keeps, and pickles), checked:
    Python's types here, the values and their combinations by the library (tf_adam_check).
    @raises ValueError, TypeError"""
    if release_grads is not None and not isinstance(release_grads, bool):
        raise TypeError(f"release_grads must be True, False or None, not {release_grads!r}")
    if overlap not in _OVERLAPS:
        raise ValueError("overlap must be 'none', 'backward' or 'backward_publish', not "
                         f"{overlap!r}")
    if release_grads and (overlap == "none" or mode == "streamed"):
        raise ValueError("release_grads=True needs overlap='backward' or 'backward_publish' "
                         "and the cpu mode: the grads are copied to the host as they come")
    if state_dtype not in _capi.STATE_DTYPES:
        raise ValueError(f"state_dtype must be one of {_capi.STATE_DTYPES}, not {state_dtype!r}")
    if not isinstance(master, str) or master not in _capi.MASTERS:
        raise ValueError(f"master must be one of {_capi.MASTERS}, not {master!r}")
    if mode not in _capi.ADAM_MODES:
        raise ValueError(f"mode must be one of {sorted(_capi.ADAM_MODES)}, not {mode!r}")
    if overlap != "none" and mode == "streamed":
        raise ValueError(f"overlap={overlap!r} acts in cpu mode only: mode='streamed' streams "
                         "the state through HBM at step(); use mode='cpu' (or 'auto')")
    if max_grad_norm is not None and not (math.isfinite(max_grad_norm) and max_grad_norm > 0):
        raise ValueError(f"max_grad_norm must be finite and > 0 (or None), not {max_grad_norm}")
    for name, value in (("chunk_elements", chunk_elements), ("threads", threads)):
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise ValueError(f"{name} must be a positive int (or None), not {value!r}")
    if placement is not None and not isinstance(placement, str):
        raise TypeError(f"placement must be a spec string, not {type(placement).__name__}")
    out = {"max_grad_norm": max_grad_norm, "mode": mode, "placement": placement,
           "chunk_elements": chunk_elements, "threads": threads, "overlap": overlap,
           "release_grads": release_grads, "state_dtype": state_dtype, "master": master}
    # the ranges and combinations (master="remainder" with an overlap or mode="streamed"):
    # the library's
    _capi.call("tf_adam_check", None, 0, ctypes.byref(c_options(out)))
    return out


def c_options(options: dict) -> _capi.AdamOptions:
    """``options`` (make_options' dict; one pickled before a key existed has its default) as
    tf_adam_options, without the placement."""
    out = _capi.AdamOptions()
    _capi.lib.tf_adam_options_default(ctypes.byref(out))
    out.mode = _capi.ADAM_MODES[options["mode"]]
    out.chunk_elements = options["chunk_elements"] or 0
    out.threads = options["threads"] or 0
    out.max_grad_norm = options["max_grad_norm"] or 0.0
    out.overlap = _OVERLAPS.index(options.get("overlap", "none"))
    out.state_dtype = _capi.STATE_DTYPES.index(options.get("state_dtype", "fp32"))
    out.master = _capi.MASTERS.index(options.get("master", "fp32"))
    return out


def _byte_range(t: torch.Tensor) -> tuple:
    """(storage address, first byte, end byte) of a tensor's elements (this rank's shard)."""
    t = _dtensor.local(t)
    storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    first = t.storage_offset() * t.element_size()
    return storage.data_ptr(), first, first + t.numel() * t.element_size()


class _MemoryIndex:
    """The byte ranges of an optimizer's params by storage, to refuse a param that shares memory
    with another (a view of it): the step would update those elements twice."""

    def __init__(self):
        self._ranges = {}  # storage address -> [(first, end, group, index)]

    def add(self, param, group: int, index: int, label: str) -> None:
        """Records ``param``, or refuses it naming the param it overlaps. @raises ValueError"""
        if _params.weight_of(param) is not None or _dtensor.local(param).numel() == 0:
            return  # a weight in a tier: its memory is the session's, one weight each
        address, first, end = _byte_range(param)
        ranges = self._ranges.setdefault(address, [])
        for q_first, q_end, g, i in ranges:
            if first < q_end and q_first < end:
                raise ValueError(f"{label} shares memory with param {i} of group {g} (a view "
                                 "of it, or it of the param): each element may be in one "
                                 "param once")
        ranges.append((first, end, group, index))
