"""Writes through a param's ``.data`` (EMA, clamping, a manual edit, weight init): torch records
no version for them, so nothing announces them to the optimizer. A CPU param with a master of
its own (16-bit, or any with an overlap) is compared with its master at each step, and what was
written is taken into the master: the step is bit for bit the one after the same values written
where torch sees them (``p.copy_`` under ``no_grad``, which bumps the version), in every overlap
mode, for writes after a step (before the next backward pass) and between backward and step
(but with backward_publish, whose step is in the params by then)."""
import pytest
import torch
from torch import nn

from tierflow.torch import OffloadAdamW


class _Net(nn.Module):
    """Two layers whose params are `dtype`, computed in fp32 (CPU has no fp16 matmul in every
    torch this runs on)."""

    def __init__(self, gen, dtype):
        super().__init__()
        shapes = ((48, 16), (48,), (8, 48), (8,))
        self.w1, self.b1, self.w2, self.b2 = (
            nn.Parameter((torch.randn(s, generator=gen) * 0.3).to(dtype)) for s in shapes)

    def forward(self, x):
        h = torch.tanh(x @ self.w1.float().t() + self.b1.float())
        return h @ self.w2.float().t() + self.b2.float()


def _model(gen, dtype):
    return _Net(gen, dtype)


def _edits(gen, model, steps):
    """Per step, per param: the indices written and their new values (random, never all)."""
    out = []
    for _ in range(steps):
        per_param = []
        for p in model.parameters():
            n = p.numel()
            k = int(torch.randint(1, max(2, n // 4), (1,), generator=gen))
            idx = torch.randperm(n, generator=gen)[:k]
            per_param.append((idx, (torch.randn(k, generator=gen) * 0.5).to(p.dtype)))
        out.append(per_param)
    return out


def _write(model, edits, visible):
    for p, (idx, values) in zip(model.parameters(), edits):
        if visible:  # where torch sees it: the version goes up
            with torch.no_grad():
                p.view(-1)[idx] = values
        else:  # through .data: no version records it
            p.data.view(-1)[idx] = values
    if not visible:  # ... and a decay applied by hand, the same way
        for p in model.parameters():
            p.data.mul_(0.75)
    else:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.75)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
# With backward_publish the step's new values are in the params before backward() returns: a
# write between backward() and step() is outside its contract (docs/python.md), not tested here.
@pytest.mark.parametrize("overlap, when", [
    ("none", "after_step"), ("backward", "after_step"), ("backward_publish", "after_step"),
    ("none", "before_step"), ("backward", "before_step")])
def test_writes_through_data_are_stepped_from(seed, dtype, overlap, when):
    gen = torch.Generator().manual_seed(seed)
    model = _model(gen, dtype)
    steps = 6
    data = [(torch.randn(12, 16, generator=gen), torch.randn(12, 8, generator=gen))
            for _ in range(steps)]
    edits = _edits(gen, model, steps)
    hidden = model
    seen = _model(torch.Generator().manual_seed(seed), dtype)
    opt = OffloadAdamW(hidden.parameters(), lr=1e-2, weight_decay=0.01, mode="cpu",
                       overlap=overlap)
    ref = OffloadAdamW(seen.parameters(), lr=1e-2, weight_decay=0.01, mode="cpu")
    for step, (x, y) in enumerate(data):
        for m, o, visible in ((hidden, opt, False), (seen, ref, True)):
            loss = ((m(x) - y) ** 2).mean()
            loss.backward()
            if when == "before_step" and step % 2 == 1:
                _write(m, edits[step], visible)
            o.step()
            o.zero_grad()
            if when == "after_step" and step % 2 == 0:
                _write(m, edits[step], visible)
        for p, q in zip(hidden.parameters(), seen.parameters()):
            assert torch.equal(p.detach(), q.detach()), (step, overlap, when)
    a, b = opt.state_dict()["state"], ref.state_dict()["state"]
    for i in a:
        for key in ("exp_avg", "exp_avg_sq", "master"):
            if key in b[i]:
                assert torch.equal(a[i][key], b[i][key]), (i, key)
    if dtype != torch.float32 or overlap != "none":
        assert opt.metrics()["adam"]["param_writes_adopted"] > 0


def test_an_unchanged_write_keeps_the_masters_extra_bits(seed):
    """Writing a 16-bit param's own values back (visibly or not) changes nothing: the master
    keeps what the 16 bits cannot hold, and the steps go on as if nothing was written."""
    gen = torch.Generator().manual_seed(seed)
    w = nn.Parameter(torch.randn(64, 8, generator=gen).to(torch.bfloat16))
    untouched = nn.Parameter(w.detach().clone())
    opt = OffloadAdamW([w], lr=1e-2, mode="cpu")
    ref = OffloadAdamW([untouched], lr=1e-2, mode="cpu")
    grads = [torch.randn(64, 8, generator=gen).to(torch.bfloat16) for _ in range(4)]
    for i, g in enumerate(grads):
        for p, o in ((w, opt), (untouched, ref)):
            p.grad = g.clone()
            o.step()
        if i == 1:
            with torch.no_grad():
                w.copy_(w.detach().clone())  # the version goes up; the values do not change
            w.data.copy_(w.detach().clone())
    assert torch.equal(w.detach(), untouched.detach())
    assert torch.equal(opt.state_dict()["state"][0]["master"],
                       ref.state_dict()["state"][0]["master"])
