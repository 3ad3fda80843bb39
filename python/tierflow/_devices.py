"""The process's tierflow devices: one ``tf_device`` per torch device, opened once.

Params on CUDA run on that GPU's tierflow CUDA device, ordered with
``torch.cuda.current_stream()``; params on CPU run on the emulated device, whose "device
memory" is the tensors' own (its streams are the calling thread: no stream handle)."""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Optional

import torch

from tierflow import _capi

__all__ = ["check_process", "device_handle", "generation", "native_stream"]

_devices: dict = {}
_devices_lock = threading.Lock()
# Bumped in a child after os.fork: the parent's devices (and the optimizers and sessions made
# on them) have threads that do not exist in the child; the child opens its own.
_generation = 0


def _after_fork_in_child() -> None:
    global _devices_lock, _generation
    _devices.clear()  # the handles are the parent's: left alone, never destroyed here
    _devices_lock = threading.Lock()
    _generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


def generation() -> int:
    """How many forks this process is below the one that opened the devices it holds now."""
    return _generation


def check_process(made_in: int, what: str) -> None:
    """Refuses a C object made in a parent process (before os.fork). @raises RuntimeError"""
    if made_in != _generation:
        raise RuntimeError(f"{what} was made before os.fork(), in the parent process: its device "
                           "threads do not exist here. Make a new one in this process (its "
                           "state: save() in the parent and load() here, or state_dict())")


def _require_cuda_build(spec: str) -> None:
    """Refuses a CUDA tensor in a library built without the CUDA backend, saying so and how to
    get one. @raises DeviceError"""
    info = _capi.build_info()
    if not info["cuda"]:
        raise _capi.DeviceError(
            f"a tensor on {spec} reached tierflow, whose library ({info['library']}) was built "
            "without the CUDA backend (tierflow.build_info()['cuda'] is False: no CUDA toolkit "
            "was found when it was built). Rebuild it where nvcc is found (on PATH, or "
            "CUDACXX=/path/to/nvcc): pip install . or cmake -DTIERFLOW_WITH_CUDA=ON; or keep "
            "the params on the CPU", _capi.ERR_DEVICE, "tf_device_open")


def device_handle(device: torch.device) -> ctypes.c_void_p:
    """The process's tf_device for a torch device (opened once, kept for the process)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        spec = f"cuda:{index}"
    else:
        spec = "emulated"
    with _devices_lock:
        handle = _devices.get(spec)
        if handle is None:
            if device.type == "cuda":
                _require_cuda_build(spec)
            handle = ctypes.c_void_p()
            _capi.call("tf_device_open", spec.encode(), ctypes.byref(handle))
            _devices[spec] = handle
    return handle


def native_stream(device: torch.device) -> Optional[int]:
    """The caller's stream as the C ABI takes it: torch's current CUDA stream, or None."""
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
