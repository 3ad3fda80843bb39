"""A program written against torch.optim.AdamW switches to OffloadAdamW by changing only the
constructor (issue 23's "done when"): one ordinary training loop, given the optimizer class
and nothing else, runs with both and ends within 1e-5 of scale.

The two runs share no grads (each is the whole loop), so the model is an MLP: a transformer's
attention key bias has grads that are zero but for rounding noise, which Adam scales up to
full steps, and two runs part there whatever the optimizer (test_parity.py copies the grads
across to compare on the transformer)."""
import io

import pytest
import torch
from tf_helpers import assert_close_to_scale, batch
from torch import nn

from tierflow.torch import OffloadAdamW

STEPS = 30
RESUME_AT = 14


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(6 * 32, 48), nn.GELU(), nn.Linear(48, 48),
                         nn.Tanh(), nn.Linear(48, 8))


def train(make_optimizer, initial_state, data):
    """A user's loop, written for torch.optim: two param groups, an lr scheduler, a closure,
    zero_grad(set_to_none=True), a checkpoint through torch.save into memory mid-run and a
    resume from it into a fresh model, optimizer and scheduler. Returns the final model, the
    optimizer's state_dict and the losses."""

    def build():
        model = mlp()
        model.load_state_dict(initial_state)
        body, head = list(model[:-1].parameters()), list(model[-1].parameters())
        opt = make_optimizer([{"params": body}, {"params": head, "weight_decay": 0.0}], lr=3e-3, betas=(0.9, 0.995), eps=1e-7,
                             weight_decay=0.02)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[4e-3, 6e-3],
                                                    total_steps=STEPS)
        return model, opt, sched

    model, opt, sched = build()
    losses = []
    for step, (x, y) in enumerate(data):
        if step == RESUME_AT:
            buffer = io.BytesIO()
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "sched": sched.state_dict()}, buffer)
            buffer.seek(0)
            checkpoint = torch.load(buffer)
            model, opt, sched = build()
            model.load_state_dict(checkpoint["model"])
            opt.load_state_dict(checkpoint["opt"])
            sched.load_state_dict(checkpoint["sched"])

        def closure():
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        losses.append(float(opt.step(closure)))
        sched.step()
        opt.zero_grad(set_to_none=True)
        assert all(p.grad is None for p in model.parameters())
    return model, opt.state_dict(), losses


def loss_over(model, data):
    """The model's loss over every batch of `data` together."""
    with torch.no_grad():
        x, y = torch.cat([x for x, _ in data]), torch.cat([y for _, y in data])
        return float(torch.nn.functional.mse_loss(model(x), y))


def test_only_the_constructor_changes(seed):
    initial_state = mlp().state_dict()
    teacher = torch.randn(6 * 32, 8) / 8  # a target the model can learn
    data = [(x, torch.tanh(x.flatten(1) @ teacher)) for x, _ in (batch() for _ in range(STEPS))]
    theirs, their_state, their_losses = train(torch.optim.AdamW, initial_state, data)
    ours, our_state, our_losses = train(OffloadAdamW, initial_state, data)

    assert our_losses == pytest.approx(their_losses, rel=1e-5, abs=1e-7)
    # torch's own run learned: its loss over all the steps' data fell. Not the last step's
    # loss against the first's: those are of different batches, and the last can be the
    # higher (0.554 > 0.548 at seed 4293841387). Over 2,500 seeds the ratio was
    # 0.72 +- 0.013, at most 0.76.
    start = mlp()
    start.load_state_dict(initial_state)
    assert loss_over(theirs, data) < 0.9 * loss_over(start, data)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        assert not torch.equal(p.detach(), initial_state[name]), f"{name} never changed"
        assert_close_to_scale(p.detach(), q.detach(), what=name)
    for g, h in zip(our_state["param_groups"], their_state["param_groups"]):
        assert g["lr"] == h["lr"] and g["betas"] == h["betas"]
    assert sorted(our_state["state"]) == sorted(their_state["state"])
    for i, s in their_state["state"].items():
        assert float(our_state["state"][i]["step"]) == float(s["step"]) == STEPS
        assert_close_to_scale(our_state["state"][i]["exp_avg"], s["exp_avg"],
                              what=f"exp_avg {i}")
        assert_close_to_scale(our_state["state"][i]["exp_avg_sq"], s["exp_avg_sq"],
                              what=f"exp_avg_sq {i}")
