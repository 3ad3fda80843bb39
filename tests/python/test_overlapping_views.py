"""A param that is a view overlapping another of the optimizer's is refused when it is added,
naming both, and the optimizer goes on as it was."""
import pytest
import torch
from torch import nn

from tierflow.torch import OffloadAdamW


def test_an_overlapping_view_is_refused_at_add_param_group(seed):
    base = nn.Parameter(torch.randn(10, 6))
    other = nn.Parameter(torch.randn(5))
    opt = OffloadAdamW([base, other], lr=1e-2)
    base.grad, other.grad = torch.randn(10, 6), torch.randn(5)
    opt.step()
    view = nn.Parameter(base.data[2:4])  # rows 2-3 of the first param
    with pytest.raises(ValueError, match="shares memory with param 0 of group 0"):
        opt.add_param_group({"params": [view]})
    assert len(opt.param_groups) == 1
    disjoint = torch.randn(12)
    a, b = nn.Parameter(disjoint[:6]), nn.Parameter(disjoint[6:])  # views that do not overlap
    opt.add_param_group({"params": [a, b]})
    with pytest.raises(ValueError, match="shares memory with param 2 of group 1"):
        opt.add_param_group({"params": [nn.Parameter(disjoint[4:8])]})
    for p in (base, other, a, b):
        p.grad = torch.randn_like(p)
    opt.step()  # the accepted groups step
    assert opt.state_dict()["state"][2]["step"] == 1
    with pytest.raises(ValueError, match="shares memory"):
        OffloadAdamW([base, nn.Parameter(base.data[0])])
