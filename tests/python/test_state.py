"""state_dict in torch's layout, interchange with torch.optim.AdamW, torch.save, tierflow's own
checkpoint file, and fp32 masters for bf16 params."""
import io

import pytest
import torch
from tf_helpers import Net, assert_close_to_scale, batch, clone, groups, schedule, train_step

import tierflow
from tierflow.torch import OffloadAdamW


def _data(steps):
    return [batch() for _ in range(steps)]


def test_state_dict_round_trip_continues_bit_identically(seed):
    data = _data(24)
    model = Net()
    resumed_model = clone(model)
    opt = OffloadAdamW(groups(model), mode="cpu")
    sched = schedule(opt)
    for d in data:
        train_step(model, opt, d)
        sched.step()

    opt2 = OffloadAdamW(groups(resumed_model), mode="cpu")
    sched2 = schedule(opt2)
    for d in data[:12]:
        train_step(resumed_model, opt2, d)
        sched2.step()
    buffer = io.BytesIO()
    torch.save({"model": resumed_model.state_dict(), "opt": opt2.state_dict(),
                "sched": sched2.state_dict()}, buffer)
    del opt2, sched2
    buffer.seek(0)
    checkpoint = torch.load(buffer)
    resumed_model = Net()
    resumed_model.load_state_dict(checkpoint["model"])
    opt3 = OffloadAdamW(groups(resumed_model), mode="cpu")
    sched3 = schedule(opt3)
    opt3.load_state_dict(checkpoint["opt"])
    sched3.load_state_dict(checkpoint["sched"])
    assert opt3.param_groups[1]["lr"] == checkpoint["opt"]["param_groups"][1]["lr"]
    for d in data[12:]:
        train_step(resumed_model, opt3, d)
        sched3.step()
    for (name, p), q in zip(model.named_parameters(), resumed_model.parameters()):
        assert torch.equal(p, q), f"{name} differs after the round trip"


def test_state_dict_layout_is_torchs(seed):
    model = Net()
    opt = OffloadAdamW(groups(model), mode="cpu")
    ref = torch.optim.AdamW(groups(clone(model)))
    train_step(model, opt, batch())
    ours, theirs = opt.state_dict(), ref.state_dict()
    for g, h in zip(ours["param_groups"], theirs["param_groups"]):
        assert sorted(g) == sorted(h)
        assert {k: v for k, v in g.items() if k != "foreach"} == \
               {k: v for k, v in h.items() if k != "foreach"}
    entry = ours["state"][0]
    assert sorted(entry) == ["exp_avg", "exp_avg_sq", "step"]
    assert entry["step"].dtype == torch.float32 and entry["step"].dim() == 0
    assert float(entry["step"]) == 1.0
    assert entry["exp_avg"].shape == model.encoder.self_attn.in_proj_weight.shape
    assert float(entry["exp_avg_sq"].abs().sum()) > 0


def test_torch_to_offload_to_torch_keeps_matching_torch(seed):
    model = Net()
    reference = clone(model)
    ref_opt = torch.optim.AdamW(groups(reference), foreach=False)

    def phase(opt, steps):
        for _ in range(steps):
            train_step(model, opt, batch(), (reference, ref_opt))

    first = torch.optim.AdamW(groups(model), foreach=False)
    phase(first, 10)
    second = OffloadAdamW(groups(model), mode="cpu")
    second.load_state_dict(first.state_dict())
    phase(second, 10)
    third = torch.optim.AdamW(groups(model), foreach=False)
    third.load_state_dict(second.state_dict())
    phase(third, 10)
    assert int(third.state_dict()["state"][0]["step"]) == 30
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert_close_to_scale(p.detach(), q.detach(), what=name)


def test_load_state_dict_refuses_bad_state_and_changes_nothing(seed):
    model = Net()
    opt = OffloadAdamW(groups(model), mode="cpu")
    train_step(model, opt, batch())
    good = opt.state_dict()
    before = {i: {k: v.clone() for k, v in s.items()} for i, s in good["state"].items()}
    bad = opt.state_dict()
    bad["param_groups"][1]["lr"] = 0.5
    bad["state"][2]["exp_avg_sq"] = -bad["state"][2]["exp_avg_sq"].abs() - 1.0
    with pytest.raises(ValueError, match="param 2"):
        opt.load_state_dict(bad)
    bad = opt.state_dict()
    bad["state"][3]["exp_avg"] = torch.randn(3)
    with pytest.raises(ValueError, match="param 3"):
        opt.load_state_dict(bad)
    with pytest.raises(ValueError, match="number of parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": good["param_groups"][:1]})
    assert opt.param_groups[1]["lr"] == 5e-3
    after = opt.state_dict()["state"]
    for i, s in before.items():
        for k, v in s.items():
            assert torch.equal(after[i][k], v), f"state {i} {k} changed"


def test_bf16_params_keep_fp32_masters(seed):
    shapes = [(64, 48), (48,), (17, 5)]
    params = [torch.randn(s).to(torch.bfloat16).requires_grad_() for s in shapes]
    reference = [p.detach().float().requires_grad_() for p in params]
    opt = OffloadAdamW(params, lr=1e-3, weight_decay=0.01, mode="cpu")
    ref_opt = torch.optim.AdamW(reference, lr=1e-3, weight_decay=0.01, foreach=False)
    naive = [p.detach().clone().requires_grad_() for p in params]
    naive_opt = torch.optim.AdamW(naive, lr=1e-3, weight_decay=0.01, foreach=False)
    for _ in range(50):
        for p, q, r in zip(params, reference, naive):
            p.grad = torch.randn(p.shape).to(torch.bfloat16)
            q.grad = p.grad.float()
            r.grad = p.grad.clone()
        opt.step()
        ref_opt.step()
        naive_opt.step()
    state = opt.state_dict()["state"]
    differ = 0
    for i, (p, q, r) in enumerate(zip(params, reference, naive)):
        assert p.dtype == torch.bfloat16
        master = state[i]["master"]
        assert master.dtype == torch.float32 and master.shape == p.shape
        assert_close_to_scale(master, q.detach(), what=f"master {i}")
        assert torch.equal(p.detach(), master.to(torch.bfloat16)), f"param {i} != its master"
        differ += int((p.detach() != q.detach().to(torch.bfloat16)).sum())
        # bf16 state and params (torch's own) drift from the fp32 trajectory; masters do not
        ours_err = float((p.detach().float() - q.detach()).abs().max())
        naive_err = float((r.detach().float() - q.detach()).abs().max())
        assert ours_err < naive_err, f"param {i}: {ours_err} vs naive bf16 {naive_err}"
    # the params are the fp32 trajectory's rounding but where master and trajectory, a rounding
    # apart, straddle a bf16 midpoint: rare (about one element in 10^6), counted over all the
    # elements, for in a 48-element param one such element would be 2 %
    assert differ < 0.01 * sum(p.numel() for p in params), differ


def test_bf16_state_dict_round_trip_keeps_the_master(seed):
    p = torch.randn(40).to(torch.bfloat16).requires_grad_()
    opt = OffloadAdamW([p], lr=1e-3, mode="cpu")
    for _ in range(5):
        p.grad = torch.randn(40).to(torch.bfloat16)
        opt.step()
    saved = opt.state_dict()
    assert not torch.equal(saved["state"][0]["master"], p.detach().float())
    q = p.detach().clone().requires_grad_()
    opt2 = OffloadAdamW([q], lr=1e-3, mode="cpu")
    opt2.load_state_dict(saved)
    assert torch.equal(opt2.state_dict()["state"][0]["master"], saved["state"][0]["master"])


def test_save_and_load_file(seed, tmp_path):
    data = _data(10)
    model = Net()
    opt = OffloadAdamW(groups(model), mode="cpu")
    for d in data[:5]:
        train_step(model, opt, d)
    path = tmp_path / "adam.tfck"
    opt.save(path)
    snapshot = clone(model)
    for d in data[5:]:
        train_step(model, opt, d)
    continued = [p.detach().clone() for p in model.parameters()]
    model.load_state_dict(snapshot.state_dict())
    opt.load(path)
    for d in data[5:]:
        train_step(model, opt, d)
    for p, q in zip(model.parameters(), continued):
        assert torch.equal(p, q)

    before = opt.state_dict()["state"][0]["exp_avg"].clone()
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x5A
    corrupted = tmp_path / "corrupted.tfck"
    corrupted.write_bytes(bytes(raw))
    with pytest.raises(tierflow.InputError, match="corrupted.tfck"):
        opt.load(corrupted)
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], before)
    other = OffloadAdamW(torch.nn.Linear(3, 2).parameters(), mode="cpu")
    with pytest.raises(tierflow.InputError):
        other.load(path)


def test_params_changed_outside_the_optimizer_are_its_truth(seed):
    model = Net()
    reference = clone(model)
    opt = OffloadAdamW(groups(model), mode="cpu")
    ref_opt = torch.optim.AdamW(groups(reference), foreach=False)
    for _ in range(4):
        train_step(model, opt, batch(), (reference, ref_opt))
    other = Net()
    # a model checkpoint loaded after the optimizer's state: the params are the truth
    saved = opt.state_dict()
    opt.load_state_dict(saved)
    model.load_state_dict(other.state_dict())
    reference.load_state_dict(other.state_dict())
    with torch.no_grad():
        model.head.weight.mul_(0.5)
        reference.head.weight.mul_(0.5)
    for _ in range(4):
        train_step(model, opt, batch(), (reference, ref_opt))
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert_close_to_scale(p.detach(), q.detach(), what=name)


def test_a_save_the_machine_refuses_is_an_oserror_and_keeps_the_file(seed, tmp_path):
    """docs/errors.md: TF_ERR_ENVIRONMENT is tierflow.TierflowEnvironmentError, an OSError,
    naming the path and the errno text; the checkpoint that was there is intact."""
    model = Net()
    opt = OffloadAdamW(groups(model), mode="cpu")
    train_step(model, opt, batch())
    path = tmp_path / "adam.tfck"
    opt.save(path)
    saved = path.read_bytes()
    train_step(model, opt, batch())
    # /sys takes no new files, even from root.
    refused = r"/sys/tierflow-py\.tfck.*errno"
    with pytest.raises(tierflow.TierflowEnvironmentError, match=refused) as e:
        opt.save("/sys/tierflow-py.tfck")
    assert isinstance(e.value, OSError)
    assert e.value.status == 8
    assert path.read_bytes() == saved
    opt.load(path)  # still a good checkpoint
