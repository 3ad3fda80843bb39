"""Defaults a user trips over: the constructor's arguments shown by help(), an overlap asked for
where it cannot act refused or said."""
import inspect

import pytest
import torch
from torch import nn

from tierflow.torch import OffloadAdam, OffloadAdamW


@pytest.mark.parametrize("cls,decay", [(OffloadAdamW, 1e-2), (OffloadAdam, 0.0)])
def test_help_shows_every_argument_and_its_default(cls, decay):
    signature = inspect.signature(cls)
    assert "kwargs" not in signature.parameters
    for name, default in (("lr", 1e-3), ("weight_decay", decay), ("mode", "auto"),
                          ("overlap", "none"), ("max_grad_norm", None),
                          ("release_grads", None), ("placement", None)):
        assert signature.parameters[name].default == default, name


def test_an_overlap_in_streamed_mode_is_refused(seed):
    p = nn.Parameter(torch.randn(10))
    with pytest.raises(ValueError, match="acts in cpu mode only"):
        OffloadAdamW([p], mode="streamed", overlap="backward")


def test_cpu_tensors_get_the_cpu_step_by_default(seed):
    """mode='auto' over CPU tensors: the cpu step (streaming their state through the emulated
    device's link only added copies: 2.4-2.8 x slower), with the library's reason."""
    params = [nn.Parameter(torch.randn(64, 32)), nn.Parameter(torch.randn(32))]
    opt = OffloadAdamW(params)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    assert opt.mode == "cpu"
    assert "host memory, not the device's" in opt.mode_reason
