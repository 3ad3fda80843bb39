"""What a trainer does between backward() and step() with an overlap on: the step uses the
grads and params as they are at step(), bit for bit as the plain optimizer given the same
grads and params - a second backward pass that accumulates, clip_grad_norm_, an in-place
scaling (an unscale), an optimizer state read, a param written in place."""
import copy

import pytest
import torch
from torch import nn

from tierflow.torch import OffloadAdamW


def model():
    return nn.Sequential(nn.Linear(20, 48), nn.Tanh(), nn.Linear(48, 48), nn.Tanh(),
                         nn.Linear(48, 4))


def between_backward_and_step(kind, net, opt):
    params = list(net.parameters())
    if kind == "second_backward":  # accumulation without opt.accumulating
        x = torch.randn(6, 20, generator=torch.Generator().manual_seed(7))
        net(x).square().mean().backward()
    elif kind == "clip":
        torch.nn.utils.clip_grad_norm_(params, 0.05)
    elif kind == "unscale":
        for p in params:
            p.grad.mul_(0.25)
    elif kind == "new_grad_tensor":
        params[0].grad = params[0].grad * 3
    elif kind == "state_read":
        opt.state_dict()
    elif kind == "param_write":
        with torch.no_grad():
            params[2].mul_(0.9)


KINDS = ["second_backward", "clip", "unscale", "new_grad_tensor", "state_read", "param_write"]


@pytest.mark.parametrize("overlap", ["backward", "backward_publish"])
@pytest.mark.parametrize("kind", KINDS)
def test_changes_between_backward_and_step_are_seen(seed, overlap, kind):
    if overlap == "backward_publish" and kind in ("param_write", "second_backward"):
        pytest.skip("backward_publish writes the params during backward: no param may be "
                    "read or written between backward() and step() (the documented rule)")
    gen = torch.Generator().manual_seed(seed)
    plain = model()
    overlapped = copy.deepcopy(plain)
    kw = dict(lr=1e-2, weight_decay=0.01, mode="cpu")
    ref = OffloadAdamW(plain.parameters(), **kw)
    opt = OffloadAdamW(overlapped.parameters(), overlap=overlap, **kw)
    for step in range(4):
        x, y = torch.randn(8, 20, generator=gen), torch.randn(8, 4, generator=gen)
        for net, o in ((plain, ref), (overlapped, opt)):
            o.zero_grad()
            nn.functional.mse_loss(net(x), y).backward()
            if step in (1, 3):  # step 0 builds the C optimizer; step 2 speculates as usual
                between_backward_and_step(kind, net, o)
            o.step()
        for p, q in zip(overlapped.parameters(), plain.parameters()):
            assert torch.equal(p, q), f"step {step}"
    assert opt.metrics()["adam"]["speculative_steps"] >= 1
