"""Copies of an OffloadAdamW keep its state, as torch's optimizers' copies do: copy.deepcopy of
the model and optimizer together, and torch.save / torch.load of them, continue exactly as the
original does."""
import copy
import io

import pytest
import torch
from torch import nn

from tierflow.torch import OffloadAdamW


def model():
    net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 3))
    net[2].to(torch.bfloat16)  # a 16-bit param: its fp32 master must travel too
    return net


def train(net, opt, batches):
    for x, y in batches:
        opt.zero_grad()
        out = net[2](net[1](net[0](x)).to(torch.bfloat16)).float()
        nn.functional.mse_loss(out, y).backward()
        opt.step()


def batches(gen, n):
    return [(torch.randn(8, 16, generator=gen), torch.randn(8, 3, generator=gen))
            for _ in range(n)]


@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
def test_a_copy_continues_as_the_original(seed, how):
    gen = torch.Generator().manual_seed(seed)
    net = model()
    opt = OffloadAdamW(net.parameters(), lr=1e-2, weight_decay=0.01)
    train(net, opt, batches(gen, 3))
    if how == "deepcopy":
        net2, opt2 = copy.deepcopy((net, opt))
    else:
        buffer = io.BytesIO()
        torch.save((net, opt), buffer)
        buffer.seek(0)
        # whole objects, not tensors: torch >= 2.6 unpickles only tensors unless told
        net2, opt2 = torch.load(buffer, weights_only=False)
    assert opt2 is not opt and all(p is not q for p, q in zip(net.parameters(),
                                                            net2.parameters()))
    later = batches(gen, 3)
    train(net, opt, later)
    train(net2, opt2, later)
    for p, q in zip(net.parameters(), net2.parameters()):
        assert torch.equal(p, q)
    a, b = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert sorted(a) == sorted(b) and all(a[i]["step"] == b[i]["step"] == 6 for i in a)
    for i in a:
        for key in a[i]:
            if key != "step":
                assert torch.equal(a[i][key], b[i][key]), (i, key)
