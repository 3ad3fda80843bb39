"""The process's tierflow devices: one ``tf_device`` per torch device, opened once.

Params on CUDA run on that GPU's tierflow CUDA device, ordered with
``torch.cuda.current_stream()``; params on CPU run on the emulated device, whose "device
memory" is the tensors' own (its streams are the calling thread: no stream handle)."""
from __future__ import annotations

import ctypes
import threading
from typing import Optional

import torch

from tierflow import _capi

__all__ = ["device_handle", "native_stream"]

_devices: dict = {}
_devices_lock = threading.Lock()


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
            handle = ctypes.c_void_p()
            _capi.call("tf_device_open", spec.encode(), ctypes.byref(handle))
            _devices[spec] = handle
    return handle


def native_stream(device: torch.device) -> Optional[int]:
    """The caller's stream as the C ABI takes it: torch's current CUDA stream, or None."""
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
