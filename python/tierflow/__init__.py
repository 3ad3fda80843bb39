"""tierflow: tiered-memory offload for ML training, from Python.

``tierflow.torch`` holds the PyTorch optimizers (``OffloadAdamW``, ``OffloadAdam``). This module
loads ``libtierflow.so`` (see ``tierflow._capi``), says how it was built (``build_info()``) and
where it is (``library_path()``), and defines the exceptions every call raises; it does not
import torch.
"""
from tierflow._capi import (
    BusyError,
    DeviceError,
    InputError,
    OutOfMemoryError,
    TierflowEnvironmentError,
    TierflowError,
    build_info,
    library_path,
    library_version,
)

__all__ = [
    "BusyError",
    "DeviceError",
    "InputError",
    "OutOfMemoryError",
    "TierflowEnvironmentError",
    "TierflowError",
    "build_info",
    "library_path",
    "library_version",
]
