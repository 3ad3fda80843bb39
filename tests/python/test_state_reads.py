"""``opt.state[p]`` as logging and tuning code reads a torch optimizer's: the param's state in
torch's layout, and an in-place edit of it is what the next step starts from (issue 34, item 7).
"""
import pytest
import torch
from torch import nn

from tierflow.torch import OffloadAdamW


def _params(gen, dtype):
    return [nn.Parameter(torch.randn(9, 7, generator=gen).to(dtype)),
            nn.Parameter(torch.randn(7, generator=gen).to(dtype))]


def _step(params, opt, grads):
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_reads_give_the_state_in_torch_layout(seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    params = _params(gen, dtype)
    opt = OffloadAdamW(params, lr=1e-2, weight_decay=0.1)
    assert opt.state[params[0]] == {}  # nothing stepped yet, as torch's
    grads = [[torch.randn(p.shape, generator=gen).to(dtype) for p in params] for _ in range(3)]
    for g in grads:
        _step(params, opt, g)
    saved = opt.state_dict()["state"]
    for i, p in enumerate(params):
        s = opt.state[p]
        assert set(s) == set(saved[i]), (set(s), set(saved[i]))
        for key, value in saved[i].items():
            assert torch.equal(s[key], value), key
        assert s["exp_avg"].shape == p.shape and s["exp_avg"].dtype == torch.float32
        assert s["step"].item() == 3
    # and close to torch's own AdamW on the same data
    ref_params = [nn.Parameter(p0.detach().clone()) for p0 in _params(
        torch.Generator().manual_seed(seed), dtype)]
    if dtype == torch.float32:
        ref = torch.optim.AdamW(ref_params, lr=1e-2, weight_decay=0.1)
        for g in grads:
            _step(ref_params, ref, g)
        for p, q in zip(params, ref_params):
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(opt.state[p][key], ref.state[q][key],
                                           rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("overlap", ["none", "backward"])
def test_an_in_place_edit_of_the_state_read_is_what_the_next_step_uses(seed, overlap):
    gen = torch.Generator().manual_seed(seed)
    init = _params(gen, torch.float32)
    grads = [[torch.randn(p.shape, generator=gen) for p in init] for _ in range(4)]
    edited = [nn.Parameter(p.detach().clone()) for p in init]
    loaded = [nn.Parameter(p.detach().clone()) for p in init]
    opt_a = OffloadAdamW(edited, lr=1e-2, mode="cpu", overlap=overlap)
    opt_b = OffloadAdamW(loaded, lr=1e-2, mode="cpu", overlap=overlap)
    for g in grads[:2]:
        _step(edited, opt_a, g)
        _step(loaded, opt_b, g)
    # a: the edit through opt.state; b: the same values through load_state_dict
    opt_a.state[edited[0]]["exp_avg"].mul_(0.5)
    opt_a.state[edited[1]]["exp_avg_sq"].zero_()
    sd = opt_b.state_dict()
    sd["state"][0]["exp_avg"].mul_(0.5)
    sd["state"][1]["exp_avg_sq"].zero_()
    opt_b.load_state_dict(sd)
    for g in grads[2:]:
        _step(edited, opt_a, g)
        _step(loaded, opt_b, g)
    for p, q in zip(edited, loaded):
        assert torch.equal(p.detach(), q.detach())
    a, b = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
    for i in (0, 1):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(a[i][key], b[i][key]), (i, key)
    # A read after a step gives the new values, not the copy read before it.
    before = opt_a.state[edited[0]]["exp_avg"].clone()
    _step(edited, opt_a, grads[0])
    assert not torch.equal(opt_a.state[edited[0]]["exp_avg"], before)
    assert torch.equal(opt_a.state[edited[0]]["exp_avg"],
                       opt_a.state_dict()["state"][0]["exp_avg"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_read_before_load_state_dict_or_load_does_not_undo_it(seed, dtype, tmp_path):
    gen = torch.Generator().manual_seed(seed)
    params = _params(gen, dtype)
    opt = OffloadAdamW(params, lr=1e-2, mode="cpu")
    grads = [[torch.randn(p.shape, generator=gen).to(dtype) for p in params] for _ in range(3)]
    _step(params, opt, grads[0])
    sd = opt.state_dict()
    sd = {"state": {k: {n: t.clone() for n, t in v.items()} for k, v in sd["state"].items()},
          "param_groups": sd["param_groups"]}
    opt.save(tmp_path / "one.tfck")
    for g in grads[1:]:
        _step(params, opt, g)
    _ = opt.state[params[0]]["exp_avg"].norm()  # a read (logging)
    opt.load_state_dict(sd)
    after = opt.state_dict()["state"]
    for i in (0, 1):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(after[i][key], sd["state"][i][key]), (i, key)
    _step(params, opt, grads[1])
    _step(params, opt, grads[2])
    _ = opt.state[params[1]]  # a read, then tierflow's own load
    opt.load(tmp_path / "one.tfck")
    assert opt.state_dict()["state"][1]["step"].item() == 1


def test_an_unchanged_read_keeps_a_16_bit_params_outside_write(seed):
    gen = torch.Generator().manual_seed(seed)
    init = torch.randn(1000, generator=gen).bfloat16()
    grads = [torch.randn(1000, generator=gen).bfloat16() for _ in range(2)]
    runs = []
    for read in (False, True):
        p = nn.Parameter(init.clone())
        opt = OffloadAdamW([p], lr=0.1, mode="cpu")
        _step([p], opt, [grads[0]])
        if read:
            _ = opt.state[p]["exp_avg"].norm()  # logging reads the state, master included
        with torch.no_grad():
            p.fill_(5.0)  # then the model's weights are written (a load, an edit)
        _step([p], opt, [grads[1]])
        runs.append(p.detach().clone())
    assert torch.equal(runs[0], runs[1])
    assert float(runs[1].float().mean()) > 4.0  # stepped from 5.0, not from the old master


def test_reading_the_state_every_step_keeps_the_overlap(seed):
    gen = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = OffloadAdamW(model.parameters(), lr=1e-3, mode="cpu", overlap="backward")
    for _ in range(4):
        x = torch.randn(8, 16, generator=gen)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        _ = [opt.state[p]["exp_avg"].abs().max() for p in model.parameters()]
    adam = opt.metrics()["adam"]
    assert adam["rollbacks"] == 0 and adam["speculative_steps"] >= 3, adam
