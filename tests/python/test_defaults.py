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
