"""A param whose ``.data`` is replaced between steps (torch.nn.utils.vector_to_parameters, a
manual swap): the next step starts from the new values, as an in-place write of the same values
would, never from the old fp32 master (16-bit) or the old storage (fp32, its own master); one
replaced by a tensor of another size is refused by name, its state still saveable."""
import pytest
import torch
from torch import nn

from tierflow.torch import OffloadAdamW


def _steps(params, opt, grads):
    for g in grads:
        for p, gp in zip(params, g):
            p.grad = gp.clone()
        opt.step()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("how", ["data", "vector_to_parameters"])
def test_replacing_a_params_data_is_seen(seed, how, dtype):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((40, 8), (8,))
    init = [torch.randn(*s, generator=gen).to(dtype) for s in shapes]
    grads = [[torch.randn(*s, generator=gen).to(dtype) for s in shapes]
             for _ in range(4)]
    new_values = [torch.randn(*s, generator=gen).to(dtype) for s in shapes]
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
    if dtype == torch.bfloat16:
        master = opt_a.state_dict()["state"][0]["master"]
        assert torch.equal(master.to(torch.bfloat16), swapped[0].detach())


def test_a_param_resized_after_steps_is_refused_and_its_state_still_saves(seed):
    gen = torch.Generator().manual_seed(seed)
    w = nn.Parameter(torch.randn(6, 5, generator=gen))
    b = nn.Parameter(torch.randn(5, generator=gen))
    opt = OffloadAdamW([w, b], lr=1e-2)
    grads = [[torch.randn(6, 5, generator=gen), torch.randn(5, generator=gen)] for _ in range(3)]
    _steps([w, b], opt, grads[:2])
    before = opt.state_dict()
    b_before = b.detach().clone()
    kept = w.data
    w.data = torch.randn(7, 5, generator=gen)
    w.grad = torch.randn(7, 5, generator=gen)
    with pytest.raises(ValueError, match=r"param 0.*changed size after 2 steps.*\(6, 5\).*"
                                         r"\(7, 5\)"):
        opt.step()
    saved = opt.state_dict()  # as torch's: the state as it was, shaped as it was
    for i in (0, 1):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(saved["state"][i][key], before["state"][i][key]), (i, key)
    assert torch.equal(b.detach(), b_before)  # nothing stepped by the refused call
    # Put back a tensor of its shape: the steps go on from the state as it was.
    w.data = kept
    reference = torch.optim.AdamW([nn.Parameter(w.detach().clone()),
                                   nn.Parameter(b.detach().clone())], lr=1e-2)
    reference.load_state_dict(before)
    _steps(reference.param_groups[0]["params"], reference, grads[2:])
    _steps([w, b], opt, grads[2:])
    for p, q in zip((w, b), reference.param_groups[0]["params"]):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
    assert opt.state_dict()["state"][0]["step"].item() == 3
