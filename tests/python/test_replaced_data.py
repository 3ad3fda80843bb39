"""A 16-bit param whose ``.data`` is replaced between steps (torch.nn.utils.vector_to_parameters,
a manual swap): the next step starts from the new values, as an in-place write of the same
values would, never from the old fp32 master."""
import pytest
import torch
from torch import nn

from tierflow.torch import OffloadAdamW


def _steps(params, opt, grads):
    for g in grads:
        for p, gp in zip(params, g):
            p.grad = gp.clone()
        opt.step()


@pytest.mark.parametrize("how", ["data", "vector_to_parameters"])
def test_replacing_a_16_bit_params_data_is_seen(seed, how):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((40, 8), (8,))
    init = [torch.randn(*s, generator=gen).to(torch.bfloat16) for s in shapes]
    grads = [[torch.randn(*s, generator=gen).to(torch.bfloat16) for s in shapes]
             for _ in range(4)]
    new_values = [torch.randn(*s, generator=gen).to(torch.bfloat16) for s in shapes]
    swapped = [nn.Parameter(t.clone()) for t in init]
    written = [nn.Parameter(t.clone()) for t in init]
    opt_a = OffloadAdamW(swapped, lr=1e-2)
    opt_b = OffloadAdamW(written, lr=1e-2)
    _steps(swapped, opt_a, grads[:2])
    _steps(written, opt_b, grads[:2])
    if how == "data":
        for p, v in zip(swapped, new_values):
            p.data = v.clone()
    else:
        nn.utils.vector_to_parameters(torch.cat([v.reshape(-1) for v in new_values]), swapped)
    with torch.no_grad():  # the reference: the same values written in place
        for p, v in zip(written, new_values):
            p.copy_(v)
    for p, v in zip(swapped, new_values):
        assert torch.equal(p.detach(), v)
    _steps(swapped, opt_a, grads[2:])
    _steps(written, opt_b, grads[2:])
    for p, q in zip(swapped, written):
        assert torch.equal(p.detach(), q.detach())
    master = opt_a.state_dict()["state"][0]["master"]
    assert torch.equal(master.to(torch.bfloat16), swapped[0].detach())
