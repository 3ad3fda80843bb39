"""OffloadAdamW(overlap="backward"): each param's update starts while backward goes on (its grad
announced by a hook when autograd has accumulated it) and the step keeps it or rolls it back, so
every weight is bit-identical to overlap="none" - with clipping that fires on some steps, a
non-finite grad, params without grads and gradient accumulation."""
import copy

import pytest
import torch
from torch import nn

from tierflow.torch import OffloadAdamW


def model():
    return nn.Sequential(nn.Linear(24, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 3))


def run(net, opt, batches, micro=1):
    norms = []
    for step, (x, y) in enumerate(batches):
        opt.zero_grad()
        for k in range(micro):
            opt.accumulating = k < micro - 1
            xs, ys = x[k::micro], y[k::micro]
            loss = nn.functional.mse_loss(net(xs), ys)
            if step == 3 and k == micro - 1:
                loss = loss * float("nan")  # a non-finite grad: the step is skipped
            loss.backward()
        opt.step()
        norm = opt.last_grad_norm
        norms.append((opt.last_step_applied, norm if norm == norm else "nan"))
    return norms


def check_same(a, b):
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("overlap", ["backward", "backward_publish"])
def test_overlap_backward_is_bit_identical_to_the_plain_step(seed, overlap):
    plain = model()
    plain[2].bias.requires_grad_(False)  # a param that never gets a grad
    overlapped = copy.deepcopy(plain)
    batches = [(torch.randn(16, 24), torch.randn(16, 3) * (1 + 5 * (i % 2))) for i in range(8)]
    # clipping at a norm some steps exceed and others not (the targets' scale alternates)
    kw = dict(lr=1e-2, weight_decay=0.01, max_grad_norm=2.0, mode="cpu")
    ref = OffloadAdamW(plain.parameters(), **kw)
    opt = OffloadAdamW(overlapped.parameters(), overlap=overlap, **kw)
    ref_norms = run(plain, ref, batches)
    norms = run(overlapped, opt, batches)
    assert norms == ref_norms
    applied = [a for a, _ in norms]
    assert applied.count(False) == 1 and applied[3] is False
    clipped = [n > 2.0 for a, n in norms if a]
    assert any(clipped) and not all(clipped)  # the clip fired on some steps only
    check_same(plain, overlapped)
    adam = opt.metrics()["adam"]
    # the first step builds the C optimizer (nothing to announce to yet); later ones speculate
    assert adam["speculative_steps"] >= 4
    assert adam["rollbacks"] >= 1  # the clipped and the skipped steps were rolled back
    assert adam["rollback_bytes"] > 0
    assert ref.metrics()["adam"]["speculative_steps"] == 0


def test_gradient_accumulation_announces_only_the_last_pass(seed):
    plain = model()
    overlapped = copy.deepcopy(plain)
    batches = [(torch.randn(12, 24), torch.randn(12, 3)) for _ in range(6)]
    ref = OffloadAdamW(plain.parameters(), lr=1e-2, mode="cpu")
    opt = OffloadAdamW(overlapped.parameters(), lr=1e-2, mode="cpu", overlap="backward")
    assert run(overlapped, opt, batches, micro=3) == run(plain, ref, batches, micro=3)
    check_same(plain, overlapped)
    assert opt.metrics()["adam"]["speculative_steps"] >= 3


def test_overlap_is_checked(seed):
    with pytest.raises(ValueError, match="overlap must be 'none', 'backward' or 'backward_publish'"):
        OffloadAdamW(model().parameters(), overlap="forward")
