"""OffloadAdamW(state_dtype="bf16" | "int8"): compressed Adam moments (issue 37).

What is exact is asserted bit for bit: a compressed step is the fp32 step from the decoded
moments, its moments then encoded (checked against an fp32 optimizer loaded with the same
state, and against codecs written here from include/tierflow/detail/adam_state.hpp's
description); the overlap modes, copies and checkpoints give the same bits. What is not exact
(training from compressed moments against fp32 ones) is bounded: the weights stay within a few
per cent of the fp32 run's movement and the loss falls as far.
"""
import copy
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tf_helpers import mse_backward, teacher_batches
from tierflow.torch import OffloadAdamW

BLOCK = 256  # int8: elements per scale
INT8_MIN = 4096  # params under this keep fp32 moments under int8
M_TOP, V_TOP = 1.875, 1.9375  # the largest code of m and of sqrt(v)
COMPRESSED = ("bf16", "int8")


# --- the documented codecs, written independently of the library ---------------------------
def _round_codes(y, mantissa_bits):
    """y >= 0 (fp32) to the nearest value of the code with mantissa_bits bits (exponent
    2^-14..2^0, subnormal below 2^-14; ties to even), at most the largest code."""
    y = y.double()
    e = torch.floor(torch.log2(torch.clamp(y, min=2.0 ** -14))).clamp(min=-14)
    spacing = torch.pow(2.0, e - mantissa_bits)
    q = torch.round(y / spacing)  # half to even: q's parity is the mantissa's
    top = M_TOP if mantissa_bits == 3 else V_TOP
    return torch.clamp(q * spacing, max=top)


def int8_codec(m, v):
    """What an int8 optimizer holds for fp32 moments m, v (flat): per block of 256, the scale
    max / top (fp32), y = |x| * (top / max), the nearest code, and the code's value * scale
    (v: of sqrt(v), squared; a positive v keeps at least the smallest code)."""
    m_out, v_out = torch.empty_like(m), torch.empty_like(v)
    top_m, top_v = torch.tensor(M_TOP), torch.tensor(V_TOP)
    for start in range(0, m.numel(), BLOCK):
        # sqrt in fp64, then rounded: the correctly rounded fp32 sqrt (torch >= 2's fp32 sqrt
        # on the CPU is not, on every element)
        mb, rb = m[start:start + BLOCK], v[start:start + BLOCK].double().sqrt().float()
        m_max, r_max = mb.abs().max(), rb.max()
        if m_max > 0:
            code = _round_codes(mb.abs() * (top_m / m_max), 3).float()
            m_out[start:start + BLOCK] = torch.where(mb < 0, -code, code) * (m_max / top_m)
        else:
            m_out[start:start + BLOCK] = 0.0
        if r_max > 0:
            code = _round_codes(rb * (top_v / r_max), 4)
            code = torch.where((rb > 0) & (code == 0), torch.tensor(2.0 ** -18, dtype=code.dtype),
                               code).float()
            s = code * (r_max / top_v)
            v_out[start:start + BLOCK] = s * s
        else:
            v_out[start:start + BLOCK] = 0.0
    return m_out, v_out


def bf16_codec(t):
    return t.to(torch.bfloat16).float()


def expected_stored(dtype, m, v):
    """The moments a `dtype` optimizer holds for fp32 moments m, v of a param of m.numel()."""
    if dtype == "bf16":
        return bf16_codec(m), bf16_codec(v)
    if dtype == "int8" and m.numel() >= INT8_MIN:
        return int8_codec(m, v)
    return m, v


# --- a model and its training ---------------------------------------------------------------
def make_model():
    """Two Linear layers of >= 4096 weights (neither a multiple of 256: a short last block)
    and their small biases (under 4096: fp32 moments under int8)."""
    return nn.Sequential(nn.Linear(48, 100), nn.Tanh(), nn.Linear(100, 41))


def data(gen, n, rows=32):
    return teacher_batches(gen, n, rows)


grads_of = mse_backward


def train(net, opt, batches):
    losses = []
    for batch in batches:
        opt.zero_grad()
        losses.append(grads_of(net, batch))
        opt.step()
    return losses


def flat_state(opt):
    """{param index: (step, exp_avg, exp_avg_sq)} from state_dict(), flat."""
    return {i: (float(s["step"]), s["exp_avg"].flatten(), s["exp_avg_sq"].flatten())
            for i, s in opt.state_dict()["state"].items()}


def assert_same_state(a, b):
    a, b = a.state_dict()["state"], b.state_dict()["state"]
    assert sorted(a) == sorted(b)
    for i in a:
        assert float(a[i]["step"]) == float(b[i]["step"])
        for key in a[i]:
            if key != "step":
                assert torch.equal(a[i][key], b[i][key]), (i, key)


HYPER = {"lr": 3e-3, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.01}


# --- (a) the step: fp32 update from the decoded moments, then encoded ------------------------
def test_fp32_state_matches_torch_adamw(seed):
    gen = torch.Generator().manual_seed(seed)
    net = make_model()
    ref = copy.deepcopy(net)
    opt = OffloadAdamW(net.parameters(), state_dtype="fp32", **HYPER)
    ref_opt = torch.optim.AdamW(ref.parameters(), foreach=False, **HYPER)
    for batch in data(gen, 30):
        grads_of(net, batch)
        for p, q in zip(net.parameters(), ref.parameters()):
            q.grad = p.grad.clone()
        opt.step()
        ref_opt.step()
    for p, q in zip(net.parameters(), ref.parameters()):
        p, q = p.detach(), q.detach()
        assert float((p - q).abs().max()) <= 1e-6 * float(q.abs().max())


@pytest.mark.parametrize("dtype", COMPRESSED)
def test_a_step_is_the_fp32_step_from_the_decoded_moments(seed, dtype):
    """After k steps, the compressed optimizer and an fp32 one loaded with its state_dict take
    the same grads: the weights come out bit-identical (the update is fp32 from the decoded
    moments) and the compressed moments are the fp32 optimizer's new ones encoded."""
    gen = torch.Generator().manual_seed(seed)
    net = make_model()
    opt = OffloadAdamW(net.parameters(), state_dtype=dtype, **HYPER)
    train(net, opt, data(gen, 5))
    twin = copy.deepcopy(net)
    fp32 = OffloadAdamW(twin.parameters(), state_dtype="fp32", **HYPER)
    fp32.load_state_dict(opt.state_dict())
    assert_same_state(fp32, opt)  # decoded moments are fp32 values: loaded as they are
    for batch in data(gen, 3):
        grads_of(net, batch)
        for p, q in zip(net.parameters(), twin.parameters()):
            q.grad = p.grad.clone()
        opt.step()
        fp32.step()
        for (name, p), q in zip(net.named_parameters(), twin.parameters()):
            assert torch.equal(p, q), f"{dtype}: {name} differs from the fp32 step's"
        ours, theirs = flat_state(opt), flat_state(fp32)
        for i, p in enumerate(net.parameters()):
            m, v = expected_stored(dtype, theirs[i][1], theirs[i][2])
            assert ours[i][0] == theirs[i][0]
            assert torch.equal(ours[i][1], m), f"{dtype}: exp_avg {i} is not the encoded m"
            assert torch.equal(ours[i][2], v), f"{dtype}: exp_avg_sq {i} is not the encoded v"
        fp32.load_state_dict(opt.state_dict())  # the next step from the stored moments again


@pytest.mark.parametrize("dtype", COMPRESSED)
def test_training_follows_the_fp32_run(seed, dtype):
    """The same data and init: the loss falls as far as fp32's, and the weights move within a
    few per cent of fp32's movement from it (int8's m is exact to 1/16, bf16's to 1/256)."""
    gen = torch.Generator().manual_seed(seed)
    batches = data(gen, 40)
    net = make_model()
    init = [p.detach().clone() for p in net.parameters()]
    runs = {}
    for name in ("fp32", dtype):
        model = copy.deepcopy(net)
        opt = OffloadAdamW(model.parameters(), state_dtype=name, **HYPER)
        losses = train(model, opt, batches)
        with torch.no_grad():
            held_out = float(sum(nn.functional.mse_loss(model(x), y) for x, y in batches[:8]))
        runs[name] = (model, losses, held_out)
    ref_model, ref_losses, ref_held = runs["fp32"]
    model, losses, held = runs[dtype]
    assert ref_losses[-1] < 0.9 * ref_losses[0]  # the run learns something
    assert abs(held - ref_held) <= {"bf16": 0.005, "int8": 0.03}[dtype] * ref_held
    tolerance = {"bf16": 0.02, "int8": 0.1}[dtype]
    for (name, p), q, p0 in zip(model.named_parameters(), ref_model.parameters(), init):
        p, q = p.detach(), q.detach()
        moved = float((q - p0).norm())
        assert moved > 0
        assert float((p - q).norm()) <= tolerance * moved, f"{dtype}: {name}"


def test_bf16_moments_are_bf16_values(seed):
    gen = torch.Generator().manual_seed(seed)
    batches = data(gen, 4)
    net = make_model()
    opt = OffloadAdamW(net.parameters(), state_dtype="bf16", **HYPER)
    train(net, opt, batches)
    for i, (_, m, v) in flat_state(opt).items():
        assert torch.equal(bf16_codec(m), m) and torch.equal(bf16_codec(v), v), i
    # the check can fail: fp32 state of the same run is not made of bf16 values
    net = make_model()
    fp32 = OffloadAdamW(net.parameters(), state_dtype="fp32", **HYPER)
    train(net, fp32, batches)
    for i, (_, m, v) in flat_state(fp32).items():
        assert not torch.equal(bf16_codec(m), m) and not torch.equal(bf16_codec(v), v), i


def _distinct_per_block(t):
    return max(int(torch.unique(t[s:s + BLOCK]).numel()) for s in range(0, t.numel(), BLOCK))


@pytest.mark.parametrize("elements", [INT8_MIN - 1, INT8_MIN, 3 * BLOCK * 7 + 5])
def test_int8_moments_are_codes_times_a_block_scale(seed, elements):
    """Under int8, per block of 256: at most 128 magnitudes of m and 256 values of v, each
    the code's value times the block's scale (the codec above); params under 4096: fp32."""
    p = torch.randn(elements, requires_grad=True)
    opt = OffloadAdamW([p], state_dtype="int8", lr=1e-3)
    for _ in range(3):
        # a block of tiny grads next to a block of huge ones, and mixed signs within blocks
        g = torch.randn(elements) * torch.exp(torch.randn(elements) * 4)
        g[:BLOCK] *= 1e-6
        g[BLOCK:2 * BLOCK] *= 1e4
        p.grad = g
        opt.step()
    _, m, v = flat_state(opt)[0]
    assert m.abs().max() > 0
    if elements < INT8_MIN:
        assert _distinct_per_block(m.abs()) > 128  # fp32: far more values than a code holds
        return
    assert _distinct_per_block(m.abs()) <= 128
    assert _distinct_per_block(v) <= 256
    assert torch.equal(torch.stack(int8_codec(m, v)), torch.stack([m, v]))  # codes: a fixpoint
    assert bool((v > 0).all())  # positive v never encodes to 0


# --- (b) state dicts: torch's AdamW loads ours, ours quantizes torch's ------------------------
def test_torch_adamw_loads_a_compressed_state_dict(seed):
    gen = torch.Generator().manual_seed(seed)
    net = make_model()
    opt = OffloadAdamW(net.parameters(), state_dtype="int8", **HYPER)
    train(net, opt, data(gen, 4))
    saved = opt.state_dict()
    for s in saved["state"].values():
        assert s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32
    twin = copy.deepcopy(net)
    theirs = torch.optim.AdamW(twin.parameters(), foreach=False, **HYPER)
    theirs.load_state_dict(saved)
    batch = data(gen, 1)[0]
    grads_of(net, batch)
    for p, q in zip(net.parameters(), twin.parameters()):
        q.grad = p.grad.clone()
    opt.step()
    theirs.step()  # from the same (decoded) moments: the same update, to fp32 rounding
    for p, q in zip(net.parameters(), twin.parameters()):
        p, q = p.detach(), q.detach()
        assert float((p - q).abs().max()) <= 1e-6 * float(q.abs().max())


def extreme_moments(gen, n):
    """m and v over blocks of extreme ranges: tiny, huge, mixed signs, zeros, one outlier."""
    m = torch.randn(n, generator=gen) * torch.exp(torch.randn(n, generator=gen) * 3)
    m[:BLOCK] *= 1e-30
    m[BLOCK:2 * BLOCK] *= 1e25
    m[2 * BLOCK:3 * BLOCK] = 0.0
    m[3 * BLOCK + 17] = 1e6  # a block of one outlier
    m[4 * BLOCK:5 * BLOCK:2] = 0.0
    v = (torch.randn(n, generator=gen) * torch.exp(torch.randn(n, generator=gen) * 2)) ** 2
    v[:BLOCK] *= 1e-30
    v[BLOCK:2 * BLOCK] *= 1e20
    v[2 * BLOCK:3 * BLOCK] = 0.0
    v[3 * BLOCK + 40] = 1e12
    v[4 * BLOCK:5 * BLOCK:3] = 0.0
    return m, v


def test_int8_loads_torch_state_within_its_error_bound_and_round_trips_exactly(seed):
    gen = torch.Generator().manual_seed(seed)
    p = nn.Parameter(torch.randn(20 * BLOCK + 100, generator=gen))
    theirs = torch.optim.AdamW([p], foreach=False, **HYPER)
    p.grad = torch.randn_like(p)
    theirs.step()
    saved = theirs.state_dict()
    m, v = extreme_moments(gen, p.numel())
    saved["state"][0]["exp_avg"], saved["state"][0]["exp_avg_sq"] = m, v
    opt = OffloadAdamW([p], state_dtype="int8", **HYPER)
    opt.load_state_dict(saved)
    step, m8, v8 = flat_state(opt)[0]
    assert step == 1
    assert torch.equal(m8, int8_codec(m, v)[0]) and torch.equal(v8, int8_codec(m, v)[1])
    for start in range(0, m.numel(), BLOCK):
        mb, qb = m[start:start + BLOCK].double(), m8[start:start + BLOCK].double()
        rb, sb = v[start:start + BLOCK].double().sqrt(), v8[start:start + BLOCK].double().sqrt()
        near = mb.abs() >= mb.abs().max() * 2.0 ** -14
        err = ((qb - mb).abs() / mb.abs())[near & (mb != 0)]
        assert err.numel() == 0 or float(err.max()) <= (1 + 1e-6) / 16, start
        near = rb >= rb.max() * 2.0 ** -14
        err = ((sb - rb).abs() / rb)[near & (rb != 0)]
        assert err.numel() == 0 or float(err.max()) <= (1 + 1e-6) / 32, start
        assert bool((qb[mb == 0] == 0).all()) and bool((sb[rb == 0] == 0).all()), start
        assert bool(((rb > 0) == (sb > 0)).all()), start  # a positive v stays positive
    # a second round trip is exact
    again = OffloadAdamW([p], state_dtype="int8", **HYPER)
    again.load_state_dict(opt.state_dict())
    assert_same_state(again, opt)


# --- (c) bytes of state ----------------------------------------------------------------------
SLACK = 256 * 1024  # state_bytes counts, after each array of >= 1 MiB, its stagger slack


def state_bytes(dtype, params, **kw):
    opt = OffloadAdamW(params, state_dtype=dtype, lr=1e-3, **kw)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    return opt.metrics()["adam"]["state_bytes"]


@pytest.mark.parametrize("param_dtype", [torch.float32, torch.bfloat16])
def test_state_bytes_per_param(seed, param_dtype):
    """m + v: fp32 8, bf16 4, int8 2 + 8/256 B per element; 16-bit params add their fp32
    master (4 B): 12, 8 and 6.03 (fp32 params are their own master in cpu mode)."""
    n = 1 << 22
    made = {d: state_bytes(d, [torch.randn(n, requires_grad=True, dtype=param_dtype)])
            for d in ("fp32", "bf16", "int8")}
    master = 4 if param_dtype == torch.bfloat16 else 0
    documented = {"fp32": 8 + master, "bf16": 4 + master, "int8": 2 + 8 / BLOCK + master}
    for d in made:
        arrays = 2 + (master > 0)  # the master, m and v (int8's scales are under 1 MiB)
        assert documented[d] * n <= made[d] <= documented[d] * n + arrays * SLACK, d
    assert made["int8"] < made["bf16"] < made["fp32"]
    if master:  # the 12 -> ~6 and 12 -> 8 bytes per param
        assert made["int8"] / made["fp32"] == pytest.approx(6.03 / 12, abs=0.01)
        assert made["bf16"] / made["fp32"] == pytest.approx(8 / 12, abs=0.01)
    # small params keep fp32 moments under int8
    small = [torch.randn(INT8_MIN - 1, requires_grad=True)]
    assert state_bytes("int8", small) == state_bytes("fp32", small) == 8 * (INT8_MIN - 1)


# --- (d) refusals --------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["fp16", 8, None, "INT8"])
def test_unknown_state_dtypes_are_refused_naming_the_allowed(bad):
    with pytest.raises(ValueError, match=r"state_dtype must be one of .*fp32.*bf16.*int8"):
        OffloadAdamW([torch.randn(4, requires_grad=True)], state_dtype=bad)


@pytest.mark.parametrize("dtype", COMPRESSED)
def test_streamed_mode_steps_compressed_state_as_the_cpu_step(dtype, seed):
    # The streamed step stages the moments as stored and runs the same update (on the emulated
    # device its CPU twin): the same bits as cpu mode.
    n = 2 * INT8_MIN + 300
    a = torch.randn(n, requires_grad=True)
    b = a.detach().clone().requires_grad_(True)
    streamed = OffloadAdamW([a], lr=1e-2, state_dtype=dtype, mode="streamed")
    cpu = OffloadAdamW([b], lr=1e-2, state_dtype=dtype, mode="cpu")
    assert streamed.mode == "streamed" and cpu.mode == "cpu"
    for _ in range(4):
        g = torch.randn(n)
        a.grad, b.grad = g.clone(), g.clone()
        streamed.step()
        cpu.step()
    assert torch.equal(a, b)
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(streamed.state[a][key], cpu.state[b][key])
    opt = OffloadAdamW([torch.randn(4, requires_grad=True)], state_dtype=dtype, mode="auto")
    assert opt.mode == "cpu"


def test_a_group_with_an_unknown_state_dtype_is_refused():
    a, b = torch.randn(4, requires_grad=True), torch.randn(5, requires_grad=True)
    with pytest.raises(ValueError, match=r"group 1: state_dtype must be one of"):
        OffloadAdamW([{"params": [a]}, {"params": [b], "state_dtype": "fp8"}])
    opt = OffloadAdamW([{"params": [a]}])
    with pytest.raises(ValueError, match=r"group 1: state_dtype must be one of"):
        opt.add_param_group({"params": [b], "state_dtype": "int4"})


def test_groups_choose_their_own_state_dtype(seed):
    a = torch.randn(INT8_MIN * 2, requires_grad=True)
    b = torch.randn(INT8_MIN * 2, requires_grad=True)
    opt = OffloadAdamW([{"params": [a]}, {"params": [b], "state_dtype": "fp32"}],
                       state_dtype="int8", lr=1e-3)
    for _ in range(2):
        a.grad, b.grad = torch.randn_like(a), torch.randn_like(b)
        opt.step()
    state = flat_state(opt)
    assert _distinct_per_block(state[0][1].abs()) <= 128  # int8
    assert _distinct_per_block(state[1][1].abs()) > 128  # fp32
    assert opt.metrics()["adam"]["state_bytes"] == pytest.approx(
        a.numel() * (2 + 8 / BLOCK) + b.numel() * 8, abs=64)


def test_changing_a_groups_state_dtype_after_the_first_step_is_refused(seed):
    p = torch.randn(INT8_MIN, requires_grad=True)
    opt = OffloadAdamW([{"params": [p], "state_dtype": "int8"}], lr=1e-3)
    p.grad = torch.randn_like(p)
    opt.step()
    before = p.detach().clone()
    opt.param_groups[0]["state_dtype"] = "bf16"
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['state_dtype'\] is now 'bf16', "
                       r"but the group's moments were made 'int8'"):
        opt.step()
    assert torch.equal(p, before)  # refused before anything changed


# --- (e) copies and checkpoints keep the compressed state -------------------------------------
@pytest.mark.parametrize("dtype", COMPRESSED)
@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
def test_a_copy_continues_as_the_original(seed, dtype, how):
    gen = torch.Generator().manual_seed(seed)
    net = make_model()
    opt = OffloadAdamW(net.parameters(), state_dtype=dtype, **HYPER)
    train(net, opt, data(gen, 3))
    if how == "deepcopy":
        net2, opt2 = copy.deepcopy((net, opt))
    else:
        buffer = io.BytesIO()
        torch.save((net, opt), buffer)
        buffer.seek(0)
        net2, opt2 = torch.load(buffer, weights_only=False)
    assert_same_state(opt2, opt)
    later = data(gen, 3)
    train(net, opt, later)
    train(net2, opt2, later)
    for p, q in zip(net.parameters(), net2.parameters()):
        assert torch.equal(p, q)
    assert_same_state(opt2, opt)
    assert opt2.metrics()["adam"]["state_bytes"] == opt.metrics()["adam"]["state_bytes"]


@pytest.mark.parametrize("dtype", COMPRESSED)
def test_a_checkpoint_file_round_trips_bit_for_bit(seed, dtype, tmp_path):
    gen = torch.Generator().manual_seed(seed)
    net = make_model()
    opt = OffloadAdamW(net.parameters(), state_dtype=dtype, **HYPER)
    train(net, opt, data(gen, 3))
    path = tmp_path / "adam.tfck"
    opt.save(path)
    net2 = copy.deepcopy(net)
    opt2 = OffloadAdamW(net2.parameters(), state_dtype=dtype, **HYPER)
    opt2.load(path)
    assert_same_state(opt2, opt)
    later = data(gen, 3)
    train(net, opt, later)
    train(net2, opt2, later)
    for p, q in zip(net.parameters(), net2.parameters()):
        assert torch.equal(p, q)
    assert_same_state(opt2, opt)


# --- (f) overlap modes: the same bits as none ------------------------------------------------
@pytest.mark.parametrize("overlap", ["backward", "backward_publish"])
def test_overlap_modes_give_the_same_bits_with_int8(seed, overlap):
    gen = torch.Generator().manual_seed(seed)
    net = make_model()
    other = copy.deepcopy(net)
    opt = OffloadAdamW(net.parameters(), state_dtype="int8", **HYPER)
    opt2 = OffloadAdamW(other.parameters(), state_dtype="int8", overlap=overlap, **HYPER)
    for k, batch in enumerate(data(gen, 6)):
        if k == 3:
            # a speculative update rolled back: the grads announced, then changed before step()
            opt2.zero_grad()
            grads_of(other, (batch[0] * 2, batch[1]))
        train(net, opt, [batch])
        train(other, opt2, [batch])
        for p, q in zip(net.parameters(), other.parameters()):
            assert torch.equal(p, q), (overlap, k)
    assert_same_state(opt2, opt)
    adam = opt2.metrics()["adam"]
    assert adam["speculative_steps"] > 0 and adam["rollbacks"] >= 1
    # the pre-update copy holds the state as stored: the master and the compressed moments
    assert adam["rollback_bytes"] == adam["state_bytes"] < 12 * adam["params"]


# --- the PyTorch main job: --state-dtype and --accuracy ----------------------------------------
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_train_offload.py"
SMALL = ["--layers", "2", "--width", "32", "--context", "16", "--batch", "4"]


def run_example(*args):
    run = subprocess.run([sys.executable, str(EXAMPLE), *SMALL, *args], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_the_main_job_verifies_with_int8_state_and_an_overlap(tmp_path):
    out = run_example("--steps", "5", "--eval-every", "2", "--verify", "--state-dtype", "int8",
                      "--overlap", "backward_publish", "--out", str(tmp_path))
    assert "verify: against the same training with nothing offloaded: bit-identical" in out
    assert "int8 moments" in out


def test_the_main_job_compares_the_state_dtypes(tmp_path):
    out = run_example("--accuracy", "--steps", "5", "--eval-every", "2", "--eval-rows", "80",
                      "--out", str(tmp_path))
    result = json.loads((tmp_path / "accuracy.json").read_text())
    assert list(result["curves"]) == ["fp32", "bf16", "int8"]
    for curve in result["curves"].values():
        assert [step for step, _ in curve] == [0, 2, 4]
    first = {d: curve[0][1] for d, curve in result["curves"].items()}
    assert first["fp32"] == first["bf16"] == first["int8"]  # the same init, before any step
    assert result["final"]["fp32"] < first["fp32"]
    assert result["int8_over_fp32"] == result["final"]["int8"] / result["final"]["fp32"]
    per = {d: r["state_bytes"] / r["params"] for d, r in result["runs"].items()}
    assert per["int8"] < per["bf16"] < per["fp32"]
    page = (tmp_path / "report.html").read_text()
    assert page.count('data-chart="curves"') == 1
    for name in ("fp32", "bf16", "int8"):
        assert f'<polyline data-mark="{name}"' in page
    assert "int8 / fp32 final held-out loss" in out
    bad = subprocess.run([sys.executable, str(EXAMPLE), "--accuracy", "--verify"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--accuracy and --verify are separate runs" in bad.stderr
