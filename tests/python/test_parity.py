"""OffloadAdamW / OffloadAdam against torch.optim.AdamW / Adam (foreach=False, CPU): a real
model, two groups with different hyper-parameters, an lr scheduler, >= 50 steps."""
import pytest
import torch
from tf_helpers import Net, assert_close_to_scale, batch, clone, groups, schedule, train_step

from tierflow.torch import OffloadAdam, OffloadAdamW

STEPS = 60


@pytest.mark.parametrize("mode", ["cpu", "streamed"])
@pytest.mark.parametrize("ours, theirs", [(OffloadAdamW, torch.optim.AdamW),
                                          (OffloadAdam, torch.optim.Adam)])
def test_matches_torch_over_a_training_run(seed, ours, theirs, mode):
    model = Net()
    reference = clone(model)
    initial = [p.detach().clone() for p in model.parameters()]
    opt = ours(groups(model), mode=mode)
    assert opt.mode == mode
    ref_opt = theirs(groups(reference), foreach=False)
    if theirs is torch.optim.Adam:  # L2 decay in group 0
        assert ref_opt.param_groups[0]["weight_decay"] == 0.05
    sched, ref_sched = schedule(opt), schedule(ref_opt)
    losses = []
    for _ in range(STEPS):
        losses.append(train_step(model, opt, batch(), (reference, ref_opt)))
        sched.step()
        ref_sched.step()
        assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]
    assert opt.last_step_applied is True
    for (name, p), q, p0 in zip(model.named_parameters(), reference.parameters(), initial):
        assert not torch.equal(p, p0), f"{name} never changed"
        assert_close_to_scale(p.detach(), q.detach(), what=name)
    ours_state, their_state = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    assert sorted(ours_state) == sorted(their_state)
    for i in their_state:
        assert float(ours_state[i]["step"]) == float(their_state[i]["step"]) == STEPS
        assert_close_to_scale(ours_state[i]["exp_avg"], their_state[i]["exp_avg"],
                              what=f"exp_avg {i}")
        assert_close_to_scale(ours_state[i]["exp_avg_sq"], their_state[i]["exp_avg_sq"],
                              what=f"exp_avg_sq {i}")


def test_a_param_without_grad_is_left_alone(seed):
    params = [torch.randn(n, requires_grad=True) for n in (33, 7, 12)]
    reference = [p.detach().clone().requires_grad_() for p in params]
    opt = OffloadAdamW(params, lr=1e-2, weight_decay=0.1, mode="cpu")
    ref_opt = torch.optim.AdamW(reference, lr=1e-2, weight_decay=0.1, foreach=False)
    for step in range(12):
        for i, (p, q) in enumerate(zip(params, reference)):
            skip = i == 1 and step % 3 == 0 or i == 2 and step < 4
            p.grad = None if skip else torch.randn_like(p)
            q.grad = None if skip else p.grad.clone()
        before = params[1].detach().clone()
        opt.step()
        ref_opt.step()
        if step % 3 == 0:
            assert torch.equal(params[1], before), "a param without grad was written"
    for i, (p, q) in enumerate(zip(params, reference)):
        assert_close_to_scale(p.detach(), q.detach(), what=f"param {i}")
    state = opt.state_dict()["state"]
    assert [int(state[i]["step"]) for i in range(3)] == [12, 8, 8]
    assert [int(ref_opt.state[q]["step"]) for q in reference] == [12, 8, 8]


def test_a_param_never_given_a_grad_has_no_state(seed):
    used, unused = torch.randn(5, requires_grad=True), torch.randn(4, requires_grad=True)
    frozen = torch.randn(3, requires_grad=False)
    opt = OffloadAdamW([used, unused, frozen], mode="cpu")
    kept = (unused.detach().clone(), frozen.clone())
    used.grad = torch.randn(5)
    frozen.grad = torch.randn(3)  # requires_grad False: the step leaves it alone
    opt.step()
    assert sorted(opt.state_dict()["state"]) == [0]
    assert torch.equal(unused, kept[0]) and torch.equal(frozen, kept[1])


def test_add_param_group_carries_the_state(seed):
    model = Net()
    reference = clone(model)
    opt = OffloadAdamW(model.encoder.parameters(), lr=3e-3, mode="cpu")
    ref_opt = torch.optim.AdamW(reference.encoder.parameters(), lr=3e-3, foreach=False)
    for step in range(16):
        if step == 6:
            opt.add_param_group({"params": model.head.parameters(), "lr": 1e-2})
            ref_opt.add_param_group({"params": reference.head.parameters(), "lr": 1e-2})
        train_step(model, opt, batch(), (reference, ref_opt))
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert_close_to_scale(p.detach(), q.detach(), what=name)
    state = opt.state_dict()["state"]
    assert int(state[0]["step"]) == 16 and int(state[len(state) - 1]["step"]) == 10
