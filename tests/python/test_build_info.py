"""What the package says about the library it loaded: build_info(), library_path(), where it
looks for the library, and the refusal of a CUDA tensor by a build without the CUDA backend."""
import ctypes
import os
import sys

import pytest
import torch

import tierflow
from tierflow import _capi, _devices


def _cuda_open_error():
    """tf_device_open("cuda")'s message, or None when it opened."""
    handle = ctypes.c_void_p()
    if _capi.lib.tf_device_open(b"cuda", ctypes.byref(handle)) == _capi.OK:
        _capi.lib.tf_device_destroy(handle)
        return None
    return _capi.last_error()


def test_build_info_says_how_the_library_was_built():
    info = tierflow.build_info()
    print(info)
    assert set(info) == {"version", "cuda", "cuda_runtime", "library"}
    assert info["version"] == tierflow.library_version()
    assert os.path.samefile(info["library"], tierflow.library_path())
    assert isinstance(info["cuda"], bool)
    if info["cuda"]:
        major, minor = info["cuda_runtime"].split(".")
        assert int(major) >= 11 and int(minor) >= 0
    else:
        assert info["cuda_runtime"] is None
    # The library's answer agrees with what opening a CUDA device says.
    error = _cuda_open_error()
    built_without = error is not None and "built without the CUDA backend" in error
    assert built_without == (not info["cuda"]), error


def test_library_path_is_a_call_and_still_the_path():
    path = tierflow.library_path()
    assert type(path) is str and os.path.isfile(path)
    assert tierflow.library_path == path and os.fspath(tierflow.library_path) == path
    assert os.path.samefile(path, _capi._open_library()[1])


def test_the_library_is_looked_for_in_every_folder_of_the_package(monkeypatch, tmp_path):
    # An editable install's package spans the sources and the folder holding the library.
    sources, installed = tmp_path / "src", tmp_path / "site"
    monkeypatch.setattr(sys.modules["tierflow"], "__path__", [str(sources), str(installed)])
    monkeypatch.delenv("TIERFLOW_LIBRARY", raising=False)
    names = [name for name, _ in _capi._candidates()]
    assert names == [str(sources / "libtierflow.so"), str(installed / "libtierflow.so"),
                     f"libtierflow.so.{_capi.ABI_MAJOR}"]
    monkeypatch.setenv("TIERFLOW_LIBRARY", str(tmp_path / "elsewhere.so"))
    assert _capi._candidates() == [(str(tmp_path / "elsewhere.so"), True)]


def test_a_cuda_tensor_without_a_cuda_build_is_refused_saying_so(monkeypatch):
    info = dict(tierflow.build_info(), cuda=False, cuda_runtime=None)
    monkeypatch.setattr(_capi, "build_info", lambda: info)
    # An index no other test opens: a device already open would be reused, not checked.
    with pytest.raises(tierflow.DeviceError) as refused:
        _devices.device_handle(torch.device("cuda", 7))
    message = str(refused.value)
    assert "cuda:7" in message and "without the CUDA backend" in message, message
    assert "pip install" in message and info["library"] in message, message
    assert "cuda:7" not in _devices._devices
