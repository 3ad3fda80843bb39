"""The C ABI (include/tierflow/tierflow.h) over ctypes: the library, its prototypes, its errors.

The library is looked for, in order: the path in the environment variable ``TIERFLOW_LIBRARY``
(an error if that file is missing), ``libtierflow.so`` in this package's folders (the build
tree, ``cmake --install`` and ``pip install`` put it beside the modules; an editable install
keeps it apart from them), then ``libtierflow.so.0`` on the system's search path.
Every call that returns a ``tf_status`` goes through :func:`check`, which raises the exception
for that status with ``tf_last_error()``'s message.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
from ctypes import (
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_size_t,
    c_uint,
    c_ulonglong,
    c_void_p,
)
from pathlib import Path

#: The library's major version this package speaks (its SONAME, libtierflow.so.0).
ABI_MAJOR = 0

# tf_status
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_OUT_OF_MEMORY = 2
ERR_DEVICE = 3
ERR_INPUT = 4
ERR_BUFFER_TOO_SMALL = 5
ERR_INTERNAL = 6
ERR_BUSY = 7
ERR_ENVIRONMENT = 8

# tf_dtype
DTYPE_F32 = 0
DTYPE_BF16 = 1
DTYPE_F16 = 2

# tf_adam_mode
ADAM_CPU = 0
ADAM_STREAMED = 1
ADAM_AUTO = 2
ADAM_MODES = {"cpu": ADAM_CPU, "streamed": ADAM_STREAMED, "auto": ADAM_AUTO}
# How the Adam moments are stored: tf_adam_options.state_dtype's values, in order.
STATE_DTYPES = ("fp32", "bf16", "int8")
# Where the fp32 master weights are kept: tf_adam_options.master's values, in order.
MASTERS = ("fp32", "remainder")


class TierflowError(Exception):
    """Base of the errors a tierflow call raises; ``status`` is the C ABI's tf_status and
    ``call`` the function that returned it."""

    def __init__(self, message: str, status: int = ERR_INTERNAL, call: str = ""):
        super().__init__(message)
        self.status = status
        self.call = call


class InvalidArgumentError(TierflowError, ValueError):
    """The library refused an argument (TF_ERR_INVALID_ARGUMENT): the caller's bug."""


class OutOfMemoryError(TierflowError, MemoryError):
    """A tier or the device has no room for the state (TF_ERR_OUT_OF_MEMORY)."""


class DeviceError(TierflowError, RuntimeError):
    """A device operation failed (TF_ERR_DEVICE)."""


class InputError(TierflowError, ValueError):
    """Bad input from outside the program: a checkpoint file, an environment variable or a
    placement spec (TF_ERR_INPUT)."""


class InternalError(TierflowError, RuntimeError):
    """Anything else the library reports."""


class BusyError(TierflowError, RuntimeError):
    """Another thread's call on the same optimizer is in progress; this call was refused and
    changed nothing (TF_ERR_BUSY). One optimizer takes one call at a time."""


class TierflowEnvironmentError(TierflowError, OSError):
    """The machine refused, not the arguments: a full disk, a read-only or permission-denied
    folder, the mlock limit, a thread that could not start (TF_ERR_ENVIRONMENT). ``errno`` is
    not set (the message carries the errno text)."""


_ERRORS = {
    ERR_INVALID_ARGUMENT: InvalidArgumentError,
    ERR_OUT_OF_MEMORY: OutOfMemoryError,
    ERR_DEVICE: DeviceError,
    ERR_INPUT: InputError,
    ERR_BUSY: BusyError,
    ERR_ENVIRONMENT: TierflowEnvironmentError,
}


class AdamHyper(Structure):
    _fields_ = [
        ("lr", c_double),
        ("beta1", c_double),
        ("beta2", c_double),
        ("eps", c_double),
        ("weight_decay", c_double),
        ("decoupled", c_int),
        ("bias_correction", c_int),
        ("state_dtype", c_int),  # -1: the options'; an index into STATE_DTYPES
    ]


class AdamParam(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("param", c_void_p),
        ("grad", c_void_p),
        ("dtype", c_int),
        ("elements", c_size_t),
        ("group", c_size_t),
        ("param_on_host", c_int),
    ]


class AdamOptions(Structure):
    _fields_ = [
        ("mode", c_int),
        ("chunk_elements", c_size_t),
        ("threads", c_uint),
        ("max_grad_norm", c_double),
        ("loss_scale", c_double),
        ("device_timeout_s", c_double),
        ("placement", c_char_p),
        ("overlap", c_int),  # mirrors tf_adam_options (tf_adam_options_default writes it)
        ("state_dtype", c_int),  # an index into STATE_DTYPES
        ("master", c_int),  # an index into MASTERS
    ]


class SchedBuffer(Structure):
    _fields_ = [("name", c_char_p), ("bytes", c_size_t), ("data", c_void_p)]


class SchedStep(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("buffers", POINTER(c_size_t)),
        ("count", c_size_t),
        ("writes", c_int),
    ]


class SchedOptions(Structure):
    _fields_ = [
        ("hbm_budget_bytes", c_ulonglong),
        ("window", c_ulonglong),
        ("adaptive", c_int),
        ("trace", c_int),
        ("placement", c_char_p),
        ("prefetch_across_iterations", c_int),
    ]


class SessionWeight(Structure):
    _fields_ = [("name", c_char_p), ("bytes", c_size_t), ("data", c_void_p)]


class SessionOptions(Structure):
    _fields_ = [
        ("hbm_budget_bytes", c_ulonglong),
        ("window", c_ulonglong),
        ("adaptive", c_int),
        ("trace", c_int),
        ("placement", c_char_p),
    ]


#: weights[i] of tf_session_adam_create for a param that is no session weight.
NO_WEIGHT = ctypes.c_size_t(-1).value

_STATUS = c_int
_DEVICE = c_void_p  # tf_device*
_ADAM = c_void_p  # tf_adam*
_FLOATS = POINTER(c_float)

# name: (restype, argtypes); a restype of _STATUS makes the call raise on failure.
_PROTOTYPES = {
    "tf_build_info_json": (c_char_p, []),
    "tf_last_error": (c_char_p, []),
    "tf_version": (c_char_p, []),
    "tf_adam_hyper_default": (None, [POINTER(AdamHyper)]),
    "tf_adam_options_default": (None, [POINTER(AdamOptions)]),
    "tf_adam_check": (_STATUS, [POINTER(AdamHyper), c_size_t, POINTER(AdamOptions)]),
    "tf_device_open": (_STATUS, [c_char_p, POINTER(_DEVICE)]),
    "tf_device_destroy": (None, [_DEVICE]),
    "tf_device_backend": (c_char_p, [_DEVICE]),
    "tf_adam_create": (
        _STATUS,
        [_DEVICE, POINTER(AdamParam), c_size_t, POINTER(AdamHyper), c_size_t,
         POINTER(AdamOptions), POINTER(_ADAM)],
    ),
    "tf_adam_destroy": (None, [_ADAM]),
    "tf_adam_step": (_STATUS, [_ADAM, POINTER(c_int), POINTER(c_double)]),
    "tf_adam_sync_params": (_STATUS, [_ADAM, POINTER(c_int)]),
    "tf_adam_set_lr": (_STATUS, [_ADAM, c_double]),
    "tf_adam_set_hyper": (_STATUS, [_ADAM, c_size_t, POINTER(AdamHyper)]),
    "tf_adam_step_count": (_STATUS, [_ADAM, c_size_t, POINTER(c_ulonglong)]),
    "tf_adam_mode_in_force": (_STATUS, [_ADAM, POINTER(c_int)]),
    "tf_adam_metrics_json": (_STATUS, [_ADAM, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
    "tf_adam_save": (_STATUS, [_ADAM, c_char_p]),
    "tf_adam_load": (_STATUS, [_ADAM, c_char_p]),
    "tf_adam_master_weights": (_STATUS, [_ADAM, c_size_t, _FLOATS, c_size_t]),
    "tf_adam_param_count": (_STATUS, [_ADAM, POINTER(c_size_t)]),
    "tf_adam_param_elements": (_STATUS, [_ADAM, c_size_t, POINTER(c_size_t)]),
    "tf_adam_grad_ready": (_STATUS, [_ADAM, c_size_t, c_void_p, c_void_p]),
    "tf_adam_discard_grads": (_STATUS, [_ADAM]),
    "tf_adam_grad_copy_stream": (_STATUS, [_ADAM, POINTER(c_void_p), POINTER(c_int)]),
    "tf_adam_step_on": (
        _STATUS,
        [_ADAM, POINTER(c_void_p), c_size_t, c_void_p, POINTER(c_int), POINTER(c_double)],
    ),
    "tf_adam_get_state": (
        _STATUS,
        [_ADAM, c_size_t, _FLOATS, _FLOATS, _FLOATS, c_size_t, POINTER(c_ulonglong)],
    ),
    "tf_adam_set_state": (
        _STATUS,
        [_ADAM, c_size_t, _FLOATS, _FLOATS, _FLOATS, c_size_t, c_ulonglong],
    ),
    "tf_adam_refresh_master": (_STATUS, [_ADAM, c_size_t]),
    "tf_adam_where_json": (_STATUS, [_ADAM, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
    "tf_session_options_default": (None, [POINTER(SessionOptions)]),
    "tf_session_create": (_STATUS, [_DEVICE, POINTER(SessionOptions), POINTER(c_void_p)]),
    "tf_session_destroy": (None, [c_void_p]),
    "tf_session_set_blocks": (
        _STATUS, [c_void_p, POINTER(SessionWeight), POINTER(c_size_t), c_size_t]),
    "tf_session_weight_host": (_STATUS, [c_void_p, c_size_t, POINTER(c_void_p)]),
    "tf_session_acquire": (
        _STATUS, [c_void_p, c_size_t, c_int, c_void_p, POINTER(c_void_p), c_size_t]),
    "tf_session_release": (_STATUS, [c_void_p, c_void_p]),
    "tf_session_end_pass": (_STATUS, [c_void_p]),
    "tf_session_metrics_json": (
        _STATUS, [c_void_p, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
    "tf_session_trace_json": (
        _STATUS, [c_void_p, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
    "tf_session_where_json": (
        _STATUS, [c_void_p, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
    "tf_session_adam_create": (
        _STATUS,
        [c_void_p, POINTER(AdamParam), c_size_t, POINTER(c_size_t), POINTER(AdamHyper),
         c_size_t, POINTER(AdamOptions), POINTER(_ADAM)],
    ),
    "tf_topology_json": (_STATUS, [c_char_p, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
    "tf_sched_options_default": (None, [POINTER(SchedOptions)]),
    "tf_scheduler_create": (
        _STATUS,
        [_DEVICE, POINTER(SchedBuffer), c_size_t, POINTER(SchedStep), c_size_t,
         POINTER(SchedOptions), POINTER(c_void_p)],
    ),
    "tf_scheduler_destroy": (None, [c_void_p]),
    "tf_scheduler_host_pointer": (_STATUS, [c_void_p, c_size_t, POINTER(c_void_p)]),
    "tf_scheduler_acquire": (
        _STATUS, [c_void_p, c_size_t, c_void_p, POINTER(c_void_p), c_size_t]),
    "tf_scheduler_release": (_STATUS, [c_void_p, c_size_t, c_int, c_void_p]),
    "tf_scheduler_flush": (_STATUS, [c_void_p]),
    "tf_scheduler_restart": (_STATUS, [c_void_p]),
    "tf_scheduler_metrics_json": (
        _STATUS, [c_void_p, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
    "tf_scheduler_trace_json": (
        _STATUS, [c_void_p, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
    "tf_scheduler_where_json": (
        _STATUS, [c_void_p, POINTER(c_char), c_size_t, POINTER(c_size_t)]),
}


def _candidates() -> list[tuple[str, bool]]:
    """(path or name, must exist) in the order they are tried."""
    env = os.environ.get("TIERFLOW_LIBRARY")
    if env:
        return [(env, True)]
    # The package's __path__: one folder, or (an editable install) the sources and the folder
    # the build installed the library into.
    folders = getattr(sys.modules.get(__package__), "__path__", None) or [Path(__file__).parent]
    beside = [str(Path(folder).resolve() / "libtierflow.so") for folder in folders]
    return [(path, False) for path in dict.fromkeys(beside)] + [
        (f"libtierflow.so.{ABI_MAJOR}", False)]


def _open_library() -> tuple[ctypes.CDLL, str]:
    tried = []
    for name, must_exist in _candidates():
        if "/" in name and not os.path.exists(name):
            if must_exist:
                raise ImportError(
                    f"tierflow: TIERFLOW_LIBRARY is {name!r}, and there is no such file"
                )
            tried.append(f"{name} (no such file)")
            continue
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            if must_exist:
                raise ImportError(f"tierflow: cannot load TIERFLOW_LIBRARY={name!r}: {e}") from e
            tried.append(f"{name} ({e})")
    raise ImportError(
        "tierflow: libtierflow not found; tried " + "; ".join(tried)
        + ". Build the target tierflow_shared and use <build dir>/python, or set"
        " TIERFLOW_LIBRARY to the library's path"
    )


def _declare(lib: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as e:
            raise ImportError(
                f"tierflow: {library_path} lacks {name}: the library is older than this package"
            ) from e
        fn.restype = restype
        fn.argtypes = argtypes


class _LibraryPath(str):
    """The loaded library's path: ``tierflow.library_path()``. It is also that path as a
    ``str`` (``tierflow.library_path`` was a string before it was a call; both spellings work)."""

    def __call__(self) -> str:
        return str(self)


lib, _loaded = _open_library()
library_path = _LibraryPath(_loaded)
_declare(lib)


def library_version() -> str:
    """The loaded library's version, e.g. ``0.1.0``."""
    return lib.tf_version().decode()


def _check_version() -> None:
    version = library_version()
    try:
        major = int(version.split(".")[0])
    except ValueError as e:
        raise ImportError(f"tierflow: {library_path} reports version {version!r}") from e
    if major != ABI_MAJOR:
        raise ImportError(
            f"tierflow: {library_path} is version {version}; this package needs {ABI_MAJOR}.x"
        )


_check_version()


def build_info() -> dict:
    """How the loaded library was built: ``{"version": "0.1.0", "cuda": True, "cuda_runtime":
    "13.0", "library": <its path>}``; ``cuda`` False (``cuda_runtime`` None) when it was built
    without the CUDA backend, as a wheel built where no CUDA toolkit was found is."""
    info = json.loads(lib.tf_build_info_json().decode())
    info["library"] = str(library_path)
    return info


def last_error() -> str:
    message = lib.tf_last_error()
    return message.decode(errors="replace") if message else ""


def check(status: int, call: str) -> None:
    """Raises the exception for ``status`` (not TF_OK) with the library's message."""
    if status == OK:
        return
    cls = _ERRORS.get(status, InternalError)
    message = last_error() or "failed"
    raise cls(message if message.startswith(call) else f"{call}: {message}", status, call)


def call(name: str, *args) -> None:
    """Calls the C function ``name`` and raises on a failed status."""
    check(getattr(lib, name)(*args), name)


def json_call(name: str, handle, parse: bool = True):
    """Calls a ``tf_*_json(handle, buffer, capacity, needed)`` function and parses its JSON
    (``parse`` False: returns the text)."""
    fn = getattr(lib, name)
    needed = c_size_t(0)
    capacity = 4096
    for _ in range(4):
        buffer = ctypes.create_string_buffer(capacity)
        status = fn(handle, buffer, capacity, ctypes.byref(needed))
        if status == ERR_BUFFER_TOO_SMALL and needed.value > capacity:
            capacity = needed.value
            continue
        check(status, name)
        text = buffer.value.decode()
        return json.loads(text) if parse else text
    raise InternalError(f"{name}: the JSON kept growing", ERR_INTERNAL, name)


def floats(address: int):
    """A ``float*`` from an address (0: NULL)."""
    return ctypes.cast(c_void_p(address), _FLOATS) if address else None
