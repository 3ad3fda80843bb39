"""OffloadAdamW(master="remainder"): a bf16 CPU param's fp32 master kept as the param (its high
16 bits) and a 16-bit remainder beside it (issue 37).

The master is exact, so the run is asserted bit for bit against master="fp32" on the same
grads: the masters, the moments and the step counts are equal, in every state dtype, with
clipping, across state dicts both ways, copies and checkpoint files. The bf16 params differ
only at exact ties (the master's low 16 bits 0x8000): the remainder run's param is the master
rounded to nearest with ties away from zero, the fp32 run's is torch's ``.to(bfloat16)`` (ties
to even). What cannot hold the master that way is refused, by name, before anything changes.
"""
import copy
import inspect
import io

import pytest
import torch
from torch import nn

from tf_helpers import mse_backward, teacher_batches
from tierflow.torch import OffloadAdamW, offload_parameters

BF16 = torch.bfloat16
HYPER = {"lr": 3e-3, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.01}
INT8_MIN, BLOCK = 4096, 256  # int8 moments: params of >= 4096 elements, a scale per 256


# --- rounding, from the bits -------------------------------------------------------------------
def low_half(master):
    """The low 16 bits of each fp32 value."""
    return master.view(torch.int32).to(torch.int64) & 0xFFFF


def ties_away(master):
    """fp32 -> bf16, to nearest with ties away from zero: on the sign-magnitude bits, add half
    a bf16 ulp to the magnitude and keep the high half (finite values)."""
    bits = master.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    high = ((bits + 0x8000) >> 16) & 0xFFFF
    return torch.where(high >= 0x8000, high - 0x10000, high).to(torch.int16).view(BF16)


def test_the_rounding_written_here_is_torchs_away_from_ties(seed):
    x = torch.randn(1 << 16) * torch.exp(torch.randn(1 << 16) * 4)
    off = low_half(x) != 0x8000
    assert torch.equal(ties_away(x)[off], x.to(BF16)[off])
    tie = ((x.view(torch.int32) & ~0xFFFF) | 0x8000).view(torch.float32)  # every value a tie
    truncated = (x.view(torch.int32) >> 16).to(torch.int16)
    assert torch.equal(ties_away(tie).view(torch.int16), truncated + 1)  # magnitude up
    even = truncated + (truncated & 1)  # torch's: to the even neighbour
    assert torch.equal(tie.to(BF16).view(torch.int16), even)


# --- models and their training -----------------------------------------------------------------
class Net(nn.Module):
    """Two Linear layers (weights >= 4096 elements, int8's codes; biases under, fp32 moments),
    in bf16, or "mixed": the first bf16 and the second fp32."""

    def __init__(self, layout="bf16"):
        super().__init__()
        self.a = nn.Linear(48, 100).to(BF16)
        self.b = nn.Linear(100, 41).to(BF16 if layout == "bf16" else torch.float32)

    def forward(self, x):
        h = torch.tanh(self.a(x.to(self.a.weight.dtype)))
        return self.b(h.to(self.b.weight.dtype)).float()


def batches(gen, n, rows=16):
    return teacher_batches(gen, n, rows)


backward = mse_backward


def same_grads(src, *dst):
    for nets in zip(src.parameters(), *(d.parameters() for d in dst)):
        for q in nets[1:]:
            q.grad = nets[0].grad.clone()


def pair(layout="bf16", **kw):
    """A bf16 (or mixed) net with a remainder optimizer, and an identical copy with an fp32
    master one."""
    net = Net(layout)
    twin = copy.deepcopy(net)
    return (net, OffloadAdamW(net.parameters(), master="remainder", **kw),
            twin, OffloadAdamW(twin.parameters(), master="fp32", **kw))


def step_both(net, opt, twin, twin_opt, batch):
    """One step of each on the remainder net's grads (the twin's forward could differ at a
    tie, and the masters then would too)."""
    backward(net, batch)
    same_grads(net, twin)
    opt.step()
    twin_opt.step()


# --- what the two runs hold --------------------------------------------------------------------
def masters(opt, net):
    """Each param's fp32 master: state_dict's 'master' for bf16 params, the param for fp32."""
    state = opt.state_dict()["state"]
    return [state[i]["master"] if p.dtype == BF16 else p.detach()
            for i, p in enumerate(net.parameters())]


def assert_same_state(a, b):
    """step, exp_avg, exp_avg_sq and master, bit for bit."""
    a, b = a.state_dict()["state"], b.state_dict()["state"]
    assert sorted(a) == sorted(b)
    for i in a:
        assert sorted(a[i]) == sorted(b[i]), i
        assert float(a[i]["step"]) == float(b[i]["step"]), i
        for key in a[i]:
            if key != "step":
                assert torch.equal(a[i][key], b[i][key]), (i, key)


def assert_params_follow(net, opt, twin):
    """``net`` (remainder) holds each bf16 master rounded ties-away, ``twin`` (fp32 master)
    the same away from ties; fp32 params are equal."""
    for (name, p), q, master in zip(net.named_parameters(), twin.parameters(),
                                    masters(opt, net)):
        p, q = p.detach(), q.detach()
        if p.dtype != BF16:
            assert torch.equal(p, q), name
            continue
        assert torch.equal(p.view(torch.int16), ties_away(master).view(torch.int16)), name
        off = low_half(master) != 0x8000
        assert torch.equal(p[off], master.to(BF16)[off]), name
        assert torch.equal(p[off], q[off]), name


# --- the step: bit for bit with an fp32 master ---------------------------------------------------
CASES = [("fp32", "bf16", None), ("bf16", "bf16", None), ("int8", "bf16", None),
         ("fp32", "mixed", 0.05), ("int8", "mixed", 0.05)]


@pytest.mark.parametrize("state_dtype,layout,max_grad_norm", CASES)
def test_the_master_and_moments_are_the_fp32_masters_bit_for_bit(seed, state_dtype, layout,
                                                                   max_grad_norm):
    """Trained on the same grads, the remainder run's masters, moments and steps are the fp32
    master run's, after every step; with clipping (which does clip), and a step a non-finite
    grad skips (nothing changes in either)."""
    gen = torch.Generator().manual_seed(seed)
    net, opt, twin, twin_opt = pair(layout, state_dtype=state_dtype,
                                    max_grad_norm=max_grad_norm, **HYPER)
    for k, batch in enumerate(batches(gen, 8)):
        if k == 5 and max_grad_norm:
            before = [p.detach().clone() for p in net.parameters()]
            held = opt.state_dict()
            backward(net, batch)
            with torch.no_grad():
                net.a.weight.grad[3, 7] = float("inf")
            same_grads(net, twin)
            opt.step()
            twin_opt.step()
            assert opt.last_step_applied is False and twin_opt.last_step_applied is False
            assert all(torch.equal(p, q) for p, q in zip(net.parameters(), before))
            assert all(torch.equal(a, b) for a, b in
                       zip(masters(opt, net), (held["state"][i].get("master", p) for i, p in
                                               enumerate(net.parameters()))))
        step_both(net, opt, twin, twin_opt, batch)
        assert opt.last_step_applied and twin_opt.last_step_applied
        assert opt.last_grad_norm == twin_opt.last_grad_norm
        assert_same_state(opt, twin_opt)
        assert_params_follow(net, opt, twin)
    if max_grad_norm:
        assert opt.last_grad_norm > max_grad_norm  # the clipping acted
    assert opt.metrics()["adam"]["state_bytes"] < twin_opt.metrics()["adam"]["state_bytes"]


def tie_state(gen, p, ties):
    """A state dict entry for ``p`` (step 1, random moments) whose master is random, its low 16
    bits 0x8000 (an exact tie) where ``ties``."""
    n = p.numel()
    master = torch.randn(n, generator=gen) * torch.exp(torch.randn(n, generator=gen) * 4)
    bits = master.view(torch.int32)
    master = torch.where(ties, ((bits & ~0xFFFF) | 0x8000).view(torch.float32), master)
    return {"step": torch.tensor(1.0), "exp_avg": torch.randn(n, generator=gen),
            "exp_avg_sq": torch.rand(n, generator=gen) + 0.1, "master": master}


def test_exact_ties_round_away_from_zero_and_differ_from_torchs_by_one_ulp(seed):
    """Masters with exact ties, loaded into both optimizers and stepped with lr 0 (the masters
    stay as loaded): the remainder run's param is ties-away at once, the fp32 run's is torch's
    ties-to-even after the step; they differ exactly at the ties whose even neighbour is the
    one below, by one bf16 ulp away from zero."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(2 * INT8_MIN, dtype=BF16, requires_grad=True)
    q = p.detach().clone().requires_grad_()
    ties = torch.rand(p.numel(), generator=gen) < 0.5
    kw = {"lr": 0.0, "weight_decay": 0.0}
    opt, twin_opt = OffloadAdamW([p], master="remainder", **kw), OffloadAdamW([q], **kw)
    saved = OffloadAdamW([p], **kw).state_dict()
    saved["state"] = {0: tie_state(gen, p, ties)}
    master = saved["state"][0]["master"]
    opt.load_state_dict(saved)
    twin_opt.load_state_dict(saved)
    assert torch.equal(p.detach(), ties_away(master))  # the param is the master's high half
    p.grad = torch.randn(p.shape, generator=gen).to(BF16)
    q.grad = p.grad.clone()
    opt.step()
    twin_opt.step()
    assert_same_state(opt, twin_opt)
    assert torch.equal(opt.state_dict()["state"][0]["master"], master)
    assert torch.equal(p.detach(), ties_away(master))
    assert torch.equal(q.detach(), master.to(BF16))
    truncated_even = ((master.view(torch.int32).to(torch.int64) >> 16) & 1) == 0
    differ = p.detach() != q.detach()
    assert torch.equal(differ, ties & truncated_even) and int(differ.sum()) > 0
    # one ulp away from zero: the sign-magnitude bits one above
    step = p.detach().view(torch.int16).int() - q.detach().view(torch.int16).int()
    assert bool((step[differ] == 1).all())


# --- state dicts, copies, checkpoint files -----------------------------------------------------
@pytest.mark.parametrize("source", ["fp32", "remainder"])
@pytest.mark.parametrize("dest", ["fp32", "remainder"])
def test_a_state_dict_loads_into_either_master_and_steps_on_bit_for_bit(seed, source, dest):
    """A state dict of either master loads into a fresh optimizer of either; the steps after go
    on bit for bit with an fp32 master run that never stopped."""
    gen = torch.Generator().manual_seed(seed)
    net = Net("mixed")
    ref = copy.deepcopy(net)
    opt = OffloadAdamW(net.parameters(), master=source, state_dtype="int8", **HYPER)
    ref_opt = OffloadAdamW(ref.parameters(), master="fp32", state_dtype="int8", **HYPER)
    data = batches(gen, 6)
    for batch in data[:3]:
        step_both(net, opt, ref, ref_opt, batch)
    saved = opt.state_dict()
    assert all("master" in saved["state"][i] for i, p in enumerate(net.parameters())
               if p.dtype == BF16)
    loaded = copy.deepcopy(net)
    loaded_opt = OffloadAdamW(loaded.parameters(), master=dest, state_dtype="int8", **HYPER)
    loaded_opt.load_state_dict(saved)
    assert_same_state(loaded_opt, ref_opt)
    for batch in data[3:]:
        backward(ref, batch)
        same_grads(ref, loaded)
        ref_opt.step()
        loaded_opt.step()
        assert_same_state(loaded_opt, ref_opt)
        if dest == "remainder":
            assert_params_follow(loaded, loaded_opt, ref)
        else:
            for p, master in zip(loaded.parameters(), masters(ref_opt, ref)):
                assert torch.equal(p.detach(), master.to(p.dtype))


@pytest.mark.parametrize("how", ["deepcopy", "torch.save", "file"])
def test_a_copy_or_checkpoint_file_continues_as_the_original(seed, how, tmp_path):
    gen = torch.Generator().manual_seed(seed)
    net = Net("mixed")
    opt = OffloadAdamW(net.parameters(), master="remainder", state_dtype="int8", **HYPER)
    data = batches(gen, 6)
    for batch in data[:3]:
        backward(net, batch)
        opt.step()
    if how == "deepcopy":
        net2, opt2 = copy.deepcopy((net, opt))
    elif how == "torch.save":
        buffer = io.BytesIO()
        torch.save((net, opt), buffer)
        buffer.seek(0)
        net2, opt2 = torch.load(buffer, weights_only=False) if "weights_only" in \
            inspect.signature(torch.load).parameters else torch.load(buffer)
    else:
        opt.save(tmp_path / "adam.tfck")
        net2 = Net("mixed")  # other values: the file's masters replace them
        opt2 = OffloadAdamW(net2.parameters(), master="remainder", state_dtype="int8", **HYPER)
        opt2.load(tmp_path / "adam.tfck")
    assert_same_state(opt2, opt)
    for batch in data[3:]:
        backward(net, batch)
        same_grads(net, net2)
        opt.step()
        opt2.step()
        for p, q in zip(net.parameters(), net2.parameters()):
            assert torch.equal(p, q)
        assert_same_state(opt2, opt)
    assert opt2.metrics()["adam"]["state_bytes"] == opt.metrics()["adam"]["state_bytes"]


# --- a user's write to a param -----------------------------------------------------------------
def test_an_in_place_write_to_a_param_stands_as_with_an_fp32_master(seed):
    """p.add_(1) between steps: the next step starts from the written param (its master is the
    param, widened), as with an fp32 master, bit for bit."""
    gen = torch.Generator().manual_seed(seed)
    net, opt, twin, twin_opt = pair("mixed", **HYPER)
    data = batches(gen, 5)
    for batch in data[:2]:
        step_both(net, opt, twin, twin_opt, batch)
    # the twin starts from exactly the remainder run's params (they may differ at a tie)
    with torch.no_grad():
        for p, q in zip(net.parameters(), twin.parameters()):
            q.copy_(p)
    twin_opt.load_state_dict(opt.state_dict())
    assert_same_state(opt, twin_opt)
    with torch.no_grad():
        net.a.weight.add_(1)
        twin.a.weight.add_(1)
    written = net.a.weight.detach().clone()
    for batch in data[2:]:
        step_both(net, opt, twin, twin_opt, batch)
        assert_same_state(opt, twin_opt)
        assert_params_follow(net, opt, twin)
    # the write stood: the master moved from the written values by three small steps only
    master = masters(opt, net)[0]
    assert float((master - written.float()).abs().max()) < 0.1


@pytest.mark.parametrize("master", ["fp32", "remainder"])
@pytest.mark.parametrize("how", ["state_dict", "opt.state", "deepcopy", "file"])
def test_a_write_before_a_state_read_or_copy_is_in_it(seed, master, how, tmp_path):
    """After p.add_(1) and before the next step, what the optimizer gives out (state_dict(),
    opt.state[p], a deepcopy, a checkpoint file) holds the written param as its master, as the
    next step would take it, not the master from before the write (nor, with a remainder, the
    written high half joined to the old low half); the copy then steps as the original."""
    gen = torch.Generator().manual_seed(seed)
    net = Net("mixed")
    opt = OffloadAdamW(net.parameters(), master=master, **HYPER)
    data = batches(gen, 4)
    for batch in data[:2]:
        backward(net, batch)
        opt.step()
    with torch.no_grad():
        net.a.weight.add_(1)
        net.a.weight[0, :4] = torch.tensor([-1.0, 1.0, 0.0, -0.0])  # joined: +-0 and below
    written = net.a.weight.detach().float().flatten()
    if how == "state_dict":
        assert torch.equal(opt.state_dict()["state"][0]["master"].flatten(), written)
    elif how == "opt.state":
        assert torch.equal(opt.state[net.a.weight]["master"].flatten(), written)
    if how == "deepcopy":
        net2, opt2 = copy.deepcopy((net, opt))
    else:
        net2 = copy.deepcopy(net)
        opt2 = OffloadAdamW(net2.parameters(), master=master, **HYPER)
        if how == "file":
            opt.save(tmp_path / "adam.tfck")
            opt2.load(tmp_path / "adam.tfck")
        else:
            opt2.load_state_dict(opt.state_dict())
    assert torch.equal(masters(opt2, net2)[0].flatten(), written)
    for batch in data[2:]:
        backward(net, batch)
        same_grads(net, net2)
        opt.step()
        opt2.step()
        assert_same_state(opt2, opt)
        for p, q in zip(net.parameters(), net2.parameters()):
            assert torch.equal(p, q)


# --- bytes of state ----------------------------------------------------------------------------
def stepped_bytes(params, **kw):
    opt = OffloadAdamW(params, lr=1e-3, **kw)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    return opt.metrics()["adam"]["state_bytes"]


@pytest.mark.parametrize("state_dtype,moments", [("fp32", 8), ("int8", 2 + 8 / BLOCK)])
def test_the_remainder_holds_2_bytes_per_bf16_param_instead_of_4(seed, state_dtype, moments):
    """bf16 params: the master is 2 B (the remainder) instead of 4; fp32 params are their own
    master either way. int8 moments beside it: 2 + 2.03 = 4.03 B per param."""
    n16, n32 = 64 * BLOCK + 3, 2 * INT8_MIN  # (arrays under 1 MiB: no stagger slack)
    made = {}
    for master in ("fp32", "remainder"):
        params = [torch.randn(n16, dtype=BF16, requires_grad=True),
                  torch.randn(n32, requires_grad=True)]
        made[master] = stepped_bytes(params, master=master, state_dtype=state_dtype)
    assert made["fp32"] - made["remainder"] == 2 * n16
    blocks = 2 * -(-n16 // BLOCK) * 4 if state_dtype == "int8" else 0  # m's and v's scales
    bytes16 = 2 * n16 + (n16 * 2 + blocks if state_dtype == "int8" else 8 * n16)
    assert made["remainder"] - n32 * moments == pytest.approx(bytes16, abs=64)
    if state_dtype == "int8":
        assert bytes16 / n16 == pytest.approx(2 + moments, abs=0.01)  # ~4.03 B per param


# --- refusals ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["fp16", "FP32", 3, 1, None, True])
def test_an_unknown_master_is_refused_naming_the_argument(bad):
    with pytest.raises(ValueError, match=r"master must be one of \('fp32', 'remainder'\)"):
        OffloadAdamW([torch.randn(4, dtype=BF16, requires_grad=True)], master=bad)


@pytest.mark.parametrize("kw,reason", [({"overlap": "backward"}, "overlap backward"),
                                       ({"overlap": "backward_publish"}, "overlap"),
                                       ({"mode": "streamed"}, "needs the cpu step")])
def test_remainder_is_refused_with_an_overlap_or_streamed_mode(kw, reason):
    p = torch.randn(INT8_MIN, dtype=BF16, requires_grad=True)
    with pytest.raises(ValueError, match=f"remainder.*{reason}"):
        OffloadAdamW([p], master="remainder", **kw)
    OffloadAdamW([p], master="fp32", **kw)  # the master is what is refused


def assert_refused_at_the_first_step(net, match):
    """The first step of a remainder optimizer over ``net`` raises ValueError matching
    ``match``; nothing changed, and the next try is refused the same way."""
    opt = OffloadAdamW(net.parameters(), master="remainder", **HYPER)
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    before = copy.deepcopy(net.state_dict())
    for _ in range(2):
        with pytest.raises(ValueError, match=match):
            opt.step()
        for name, value in net.state_dict().items():
            assert torch.equal(value, before[name]), name
    assert not opt.state


def test_an_fp16_param_is_refused_by_name(seed):
    net = nn.Sequential(nn.Linear(8, 8).to(BF16), nn.Linear(8, 8).half())
    assert_refused_at_the_first_step(net, r"param 'param 2': master 'remainder' cannot apply: "
                                          r"it is fp16")


def test_fp32_weights_offload_parameters_holds_keep_an_fp32_master(seed):
    # A session's fp32 tier copy is not split (only bf16 is the high half of an fp32): with
    # master="remainder" it steps exactly as with master="fp32".
    nets = [nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    handles = [offload_parameters(net, blocks=[net[0], net[1]], window=0) for net in nets]
    try:
        opts = [OffloadAdamW(net.parameters(), master=m, **HYPER)
                for net, m in zip(nets, ("fp32", "remainder"))]
        for _ in range(3):
            grads = [torch.randn(p.shape) for p in nets[0].parameters()]
            for net, opt in zip(nets, opts):
                for p, g in zip(net.parameters(), grads):
                    p.grad = g.clone()
                opt.step()
        weights = [net.state_dict() for net in nets]
    finally:
        for handle in handles:
            handle.remove()
    for name, value in weights[0].items():
        assert torch.equal(weights[1][name], value), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("mode", ["cpu", "auto"])
def test_a_cuda_param_is_refused_by_name(seed, mode):
    net = nn.Linear(64, 64).to(device="cuda", dtype=BF16)
    opt = OffloadAdamW(net.parameters(), master="remainder", mode=mode)
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(ValueError, match=r"master 'remainder' cannot apply"):
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(net.parameters(), before))


def test_help_shows_the_master_argument():
    for cls in (OffloadAdamW,):
        assert inspect.signature(cls).parameters["master"].default == "fp32"
        assert '``master``' in cls.__doc__ and '"remainder"' in cls.__doc__
