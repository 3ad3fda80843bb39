"""A param's Adam state between the C optimizer and torch's state_dict layout.

torch.optim.Adam(W) keeps ``state[p] = {'step': tensor(float), 'exp_avg', 'exp_avg_sq'}``;
tierflow keeps them in fp32 in its tiers, plus the fp32 master weights, which a state_dict
carries as ``'master'`` for bf16/fp16 params only (an fp32 param is its own master). For a
DTensor param (FSDP2) all of it is this rank's shard: the C optimizer holds the local tensor's
state, and a state_dict carries it as DTensors laid out like the param.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Optional

import torch

from tierflow import _capi, _dtensor


@dataclass
class ParamState:
    """One param's state as flat fp32 CPU tensors; master None: the param is the master."""

    step: int
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    master: Optional[torch.Tensor] = None

    def to_torch(self, param: torch.Tensor, shape: Optional[tuple] = None) -> dict:
        """torch's layout: shaped like the param (a DTensor like it for a DTensor param), or
        ``shape`` (the param's shape when its state was made, if it changed since),
        ``step`` a float32 scalar tensor."""
        out = {
            "step": torch.tensor(float(self.step)),
            "exp_avg": _shaped(self.exp_avg, param, shape),
            "exp_avg_sq": _shaped(self.exp_avg_sq, param, shape),
        }
        if self.master is not None:
            out["master"] = _shaped(self.master, param, shape)
        return out


def _shaped(flat: torch.Tensor, param: torch.Tensor, shape: Optional[tuple]) -> torch.Tensor:
    if _dtensor.is_dtensor(param):
        return _dtensor.like(param, flat)
    return flat.view(param.shape if shape is None else shape)


def _address(tensor: Optional[torch.Tensor]):
    return _capi.floats(tensor.data_ptr()) if tensor is not None else None


def read(adam, index: int, param: torch.Tensor, elements: Optional[int] = None) -> ParamState:
    """Param ``index``'s state from the C optimizer (the master only for bf16/fp16), of
    ``elements`` (default: the param's count now)."""
    param = _dtensor.local(param)
    n = param.numel() if elements is None else elements
    exp_avg = torch.empty(n, dtype=torch.float32)
    exp_avg_sq = torch.empty(n, dtype=torch.float32)
    master = torch.empty(n, dtype=torch.float32) if param.dtype != torch.float32 else None
    step = ctypes.c_ulonglong(0)
    _capi.call("tf_adam_get_state", adam, index, _address(master), _address(exp_avg),
               _address(exp_avg_sq), n, ctypes.byref(step))
    return ParamState(int(step.value), exp_avg, exp_avg_sq, master)


def write(adam, index: int, param: torch.Tensor, state: Optional[ParamState]) -> None:
    """Replaces param ``index``'s state; None: fresh (zero moments, step 0). The master is
    written only when ``state`` has one, else re-read from the param."""
    n = _dtensor.local(param).numel()
    if state is None:
        zeros = torch.zeros(n, dtype=torch.float32)
        state = ParamState(0, zeros, zeros)
    _capi.call("tf_adam_set_state", adam, index, _address(state.master), _address(state.exp_avg),
               _address(state.exp_avg_sq), n, state.step)
    if state.master is None:
        _capi.call("tf_adam_refresh_master", adam, index)


def write_parts(adam, index: int, param: torch.Tensor, state: ParamState, keys: set) -> None:
    """Writes the parts of ``state`` named in ``keys`` (``exp_avg``, ``exp_avg_sq``,
    ``master``; the step count always), leaving the others as the C optimizer holds them."""
    n = _dtensor.local(param).numel()
    _capi.call("tf_adam_set_state", adam, index,
               _address(state.master if "master" in keys else None),
               _address(state.exp_avg if "exp_avg" in keys else None),
               _address(state.exp_avg_sq if "exp_avg_sq" in keys else None), n, state.step)


def _flat_f32(value, name: str, param: torch.Tensor, label: str) -> torch.Tensor:
    """The state tensor ``value`` as flat fp32 on the CPU; for a DTensor param, ``value`` is a
    DTensor (its local tensor is taken) or a plain tensor of this rank's shard."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{label}: state '{name}' is a {type(value).__name__}, not a tensor")
    if value.is_complex() or not value.is_floating_point():
        raise TypeError(f"{label}: state '{name}' is {value.dtype}: a real floating-point "
                        "tensor is expected (it is not cast)")
    value, shard = _dtensor.local(value), _dtensor.local(param)
    if value.numel() != shard.numel():
        whose = "this rank's shard of the param" if shard is not param else "the param"
        raise ValueError(
            f"{label}: state '{name}' has {value.numel()} elements, {whose} {shard.numel()}"
        )
    flat = value.detach().to(device="cpu", dtype=torch.float32).contiguous().view(-1)
    if not bool(torch.isfinite(flat).all()):
        raise ValueError(f"{label}: state '{name}' holds a non-finite value")
    return flat


#: Step counts the library takes (tf_adam_set_state refuses larger ones: the next steps
#: must not wrap its 64-bit counter).
MAX_STEP = 2**63 - 1


def _step_count(step, label: str) -> int:
    """A loaded ``step`` (a number or a one-element tensor, as torch keeps it) as an int, or a
    refusal naming the param. @raises TypeError/ValueError"""
    if isinstance(step, torch.Tensor):
        step = _dtensor.local(step)
        if step.numel() != 1 or step.is_complex():
            raise TypeError(f"{label}: the loaded step is a {tuple(step.shape)} {step.dtype} "
                            "tensor, not one real number")
        step = step.item()
    if isinstance(step, bool) or not isinstance(step, (int, float)):
        raise TypeError(f"{label}: the loaded step is a {type(step).__name__}, not a number")
    if not (step >= 0 and math.isfinite(step) and step == int(step)):
        raise ValueError(f"{label}: the loaded step {step} is not a count")
    if int(step) > MAX_STEP:
        raise ValueError(f"{label}: the loaded step {int(step)} is above {MAX_STEP}, the "
                         "largest the optimizer's 64-bit counter can go on from")
    return int(step)


def from_torch(param: torch.Tensor, state: dict, label: str) -> ParamState:
    """Checks and converts one ``state_dict()['state'][i]`` (torch's or ours), changing
    nothing. @raises ValueError/TypeError naming the param."""
    if not isinstance(state, dict):
        raise TypeError(f"{label}: the loaded state is a {type(state).__name__}, not a dict")
    for key in ("step", "exp_avg", "exp_avg_sq"):
        if key not in state:
            raise ValueError(f"{label}: the loaded state has no '{key}'")
    if "max_exp_avg_sq" in state:
        raise ValueError(f"{label}: the loaded state is amsgrad's (max_exp_avg_sq)")
    step = _step_count(state["step"], label)
    exp_avg = _flat_f32(state["exp_avg"], "exp_avg", param, label)
    exp_avg_sq = _flat_f32(state["exp_avg_sq"], "exp_avg_sq", param, label)
    if bool((exp_avg_sq < 0).any()):
        raise ValueError(f"{label}: the loaded exp_avg_sq has a negative value")
    master = None
    if param.dtype != torch.float32 and state.get("master") is not None:
        master = _flat_f32(state["master"], "master", param, label)
    return ParamState(step, exp_avg, exp_avg_sq, master)
