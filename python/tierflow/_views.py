"""Tensors over memory tierflow owns (no copy): a weight's HBM staging on its device, its tier
copy on the host."""
from __future__ import annotations

import ctypes

import torch


class _CudaBytes:
    """``bytes`` bytes of device memory at ``address``, as torch.as_tensor takes them."""

    def __init__(self, address: int, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (address, False), "version": 2,
            "strides": None,
        }


def _bytes_at(address: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor over memory tierflow owns (no copy)."""
    if device.type == "cuda":
        return torch.as_tensor(_CudaBytes(address, nbytes), device=device)
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(address), dtype=torch.uint8)


def _view(address: int, like: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor shaped and typed like ``like`` over ``address``."""
    nbytes = like.numel() * like.element_size()
    return _bytes_at(address, nbytes, device).view(like.dtype).view(like.shape)


def _host_view(address: int, like: torch.Tensor) -> torch.Tensor:
    return _view(address, like, torch.device("cpu"))
