#!/usr/bin/python3
"""Generate the Adam/AdamW reference fixtures for tierflow's optimizer tests.

Regenerate (from the repository root) with:

    /usr/bin/python3 tests/data/adam/make_fixtures.py

Needs PyTorch (Debian's python3-torch, 1.13) and numpy under /usr/bin/python3.
The output is deterministic: every case has a fixed seed, torch runs on one
CPU thread, and the JSON is written with a fixed key order, so regenerating
with the same torch build gives byte-identical files.  After writing, the
script reads every file back and runs self-checks (a float64 hand computation
of AdamW's first step, and an fp32 numpy replay of every step of every case);
it exits non-zero if a check fails.

One JSON file per case, ``tests/data/adam/<name>.json``.

Reference semantics
-------------------
torch.optim.AdamW / torch.optim.Adam with foreach=False (single-tensor path),
amsgrad=False, maximize=False, capturable=False, fp32 tensors on the CPU,
all parameters in one param group.  Before step k (k = 0..S-1) the script sets
param_groups[0]['lr'|'betas'|'eps'|'weight_decay'] from steps[k], then:

  1. grad = grads_file                       (the fp32 values in the file)
     if loss_scale != 1:  grad = grad * fp32(1.0 / loss_scale)
                          (like GradScaler.unscale_: multiply by an fp32
                          tensor holding the reciprocal; done in fp32)
  2. if max_grad_norm > 0: torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        total_norm = || [ ||g_0||_2, ||g_1||_2, ... ] ||_2   (fp32; one
                     global norm over all tensors; recorded in grad_norms[k])
        coef       = max_grad_norm / (total_norm + 1e-6)   (fp32; torch
                     evaluates it as reciprocal(total_norm + 1e-6) * max_norm)
        coef       = min(coef, 1.0);  every g *= coef  (also when coef == 1)
  3. opt.step(), per tensor, with t = k + 1 (1-based step count):
        Adam (L2):     grad = grad + wd * param
        AdamW:         param = param * (1 - lr * wd)      (1 - lr*wd in double,
                                                           applied as fp32)
        exp_avg    = exp_avg * beta1 + (1 - beta1) * grad
        exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad
        bc1 = 1 - beta1**t ; bc2 = 1 - beta2**t          (python doubles)
        step_size = lr / bc1 ; bc2_sqrt = sqrt(bc2)      (python doubles)
        denom = sqrt(exp_avg_sq) / bc2_sqrt + eps        (fp32 tensor ops)
        param = param + ((-step_size) * exp_avg) / denom   (addcdiv_)
     The state starts at exp_avg = exp_avg_sq = 0.  Scalars given to torch
     fp32 ops are rounded to fp32 by the CPU kernels.

  Bit-exact fp32 order of torch 1.13's AVX2/AVX512 CPU kernels (what made
  these files; "torch_cpu_capability" records it).  fma() is a fused
  multiply-add with one rounding, every other op rounds to fp32:
        L2:         g          = fma(param, fp32(wd), g)            add(alpha)
        AdamW:      param      = param * fp32(1 - lr*wd)            mul_
                    exp_avg    = fma(g, fp32(1-b1), exp_avg * fp32(b1))
                    exp_avg_sq = fma(fp32(1-b2) * g, g, exp_avg_sq * fp32(b2))
                    denom      = sqrt(exp_avg_sq) / fp32(bc2_sqrt) + fp32(eps)
                    param      = param + (fp32(-step_size) * exp_avg) / denom
        unscale:    g = g * fp32(1/loss_scale)
        clip:       c = (fp32(1) / (fp32(total_norm) + fp32(1e-6))) * fp32(max_norm)
                    g = g * min(c, 1)
  The self-check replays every case this way in numpy and gets all values
  bit-exact.  Without FMA (two roundings) ~0.1-1% of params and ~20-35% of
  the moments differ by a few ulps; exp_avg can differ by many ulps where
  b1*m and (1-b1)*g cancel, but every value stays within
  3e-7 * (|ref| + rms(ref)), so compare with a tolerance of that form
  (e.g. 1e-6 * (|ref| + rms)) unless the C++ kernel uses the same FMA order.

JSON schema ("format": "tierflow-adam-fixture-1")
------------------------------------------------
{
  "format": "tierflow-adam-fixture-1",
  "name": "adamw_basic",                   // case name (= file stem)
  "description": "...",                    // free text
  "seed": 1001,                            // torch seed used for the data
  "torch_version": "1.13.0a0",             // torch.__version__ that made it
  "torch_cpu_capability": "AVX2",          // ATen CPU kernel set used
  "optimizer": "AdamW" | "Adam",           // AdamW = decoupled weight decay,
                                           // Adam  = L2 (grad += wd * param)
  "max_grad_norm": 0.0,                    // 0 = no clipping
  "loss_scale": 1.0,                       // grads in the file are multiplied
                                           // by fp32(1/loss_scale) before clip
  "steps": [                               // one entry per step (S entries),
    {"lr": ..., "beta1": ..., "beta2": ...,//   python floats (doubles, exact
     "eps": ..., "weight_decay": ...},     //   round-trip)
    ...
  ],
  "params": [                              // one entry per parameter tensor,
    {"name": "p0", "n": 1000,              //   in param-group order
     "initial": [u32, ...],                // n fp32 bit patterns
     "grads": [[u32, ...], ...],           // S lists: grad as given, i.e.
                                           //   before unscale and clipping
     "expected_param": [[u32, ...], ...],  // S lists: param after each step
     "expected_exp_avg": [[...], ...],     // S lists: state['exp_avg']
     "expected_exp_avg_sq": [[...], ...]}  // S lists: state['exp_avg_sq']
  ],
  "grad_norms": [ ... ]                    // S doubles: the fp32 total norm
                                           // clip_grad_norm_ returned (of the
                                           // unscaled grads), or [] when
                                           // max_grad_norm == 0
}
All tensors' values are stored as the uint32 bit pattern of the fp32 value
(bit-exact); decode with std::bit_cast<float>(uint32_t).
"""

import json
import math
import os
import re
import sys

import numpy as np
import torch

FORMAT = "tierflow-adam-fixture-1"
HERE = os.path.dirname(os.path.abspath(__file__))


def bits(t):
    """fp32 tensor -> list of uint32 bit patterns."""
    assert t.dtype == torch.float32
    return t.detach().contiguous().view(torch.int32).numpy().view(np.uint32).tolist()


def from_bits(lst):
    """list of uint32 bit patterns -> np.float32 array."""
    return np.asarray(lst, dtype=np.uint32).view(np.float32)


def cpu_capability():
    """ATen's CPU kernel set (DEFAULT / AVX2 / AVX512), from torch's config."""
    m = re.search(r"CPU capability usage: *(\S+)", torch.__config__.show())
    return m.group(1) if m else "unknown"


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------

def lr_decay(base, steps, gamma=0.9):
    return [base * gamma ** k for k in range(steps)]


def lr_warmup(base, steps, warmup=4, gamma=0.85):
    out = []
    for k in range(steps):
        if k < warmup:
            out.append(base * (k + 1) / warmup)
        else:
            out.append(base * gamma ** (k - warmup + 1))
    return out


def const_steps(lrs, beta1, beta2, eps, wd):
    return [{"lr": float(lr), "beta1": float(beta1), "beta2": float(beta2),
             "eps": float(eps), "weight_decay": float(wd)} for lr in lrs]


# grad_scales[k] multiplies a std-1 normal grad at step k.  The ranges are
# chosen so that clipping triggers on some steps and not on others.
CASES = [
    dict(name="adamw_basic", seed=1001, optimizer="AdamW", sizes=[1000],
         description="AdamW, lr 1e-3 decaying 0.9/step, betas (0.9, 0.999), eps 1e-8, wd 0.01",
         steps=const_steps(lr_decay(1e-3, 8), 0.9, 0.999, 1e-8, 0.01),
         grad_scales=[1.0, 0.1, 3.0, 0.5, 10.0, 0.2, 1.5, 0.05]),
    dict(name="adamw_betas", seed=1002, optimizer="AdamW", sizes=[777],
         description="AdamW, betas (0.8, 0.95), eps 1e-6, wd 0.1, lr 3e-3 with 4-step warmup then decay",
         steps=const_steps(lr_warmup(3e-3, 9), 0.8, 0.95, 1e-6, 0.1),
         grad_scales=[0.3, 2.0, 0.1, 5.0, 1.0, 0.2, 8.0, 0.5, 1.0]),
    dict(name="adam_l2", seed=1003, optimizer="Adam", sizes=[1537],
         description="Adam with L2 weight decay 0.05 (grad += wd*param), lr 1e-3 decaying 0.9/step",
         steps=const_steps(lr_decay(1e-3, 7), 0.9, 0.999, 1e-8, 0.05),
         grad_scales=[0.1, 1.0, 0.5, 4.0, 0.2, 2.0, 0.1]),
    dict(name="adam_nodecay", seed=1004, optimizer="Adam", sizes=[999],
         description="Adam, wd 0, betas (0.95, 0.99), eps 1e-7, lr 2e-3 decaying 0.85/step",
         steps=const_steps(lr_decay(2e-3, 10, 0.85), 0.95, 0.99, 1e-7, 0.0),
         grad_scales=[1.0, 0.5, 0.1, 2.0, 10.0, 0.3, 1.0, 0.05, 3.0, 0.7]),
    dict(name="adamw_clip", seed=1005, optimizer="AdamW", sizes=[1000], max_grad_norm=1.0,
         description="AdamW wd 0.01, clip_grad_norm_(max_norm=1.0) before each step; "
                     "norm ~31.6*scale, so steps with scale <= 0.03 are not clipped",
         steps=const_steps(lr_decay(1e-3, 8), 0.9, 0.999, 1e-8, 0.01),
         grad_scales=[1.0, 0.01, 0.5, 0.02, 2.0, 0.005, 0.1, 0.03]),
    dict(name="adamw_loss_scale", seed=1006, optimizer="AdamW", sizes=[1000], loss_scale=1024.0,
         description="AdamW wd 0.01; file grads are loss-scaled (x1024), unscaled in fp32 "
                     "by multiplying with fp32(1/1024) before the step",
         steps=const_steps(lr_decay(1e-3, 8), 0.9, 0.999, 1e-8, 0.01),
         grad_scales=[1.0, 0.1, 3.0, 0.5, 10.0, 0.2, 1.5, 0.05]),
    dict(name="adamw_loss_scale_clip", seed=1007, optimizer="AdamW", sizes=[1000],
         loss_scale=32768.0, max_grad_norm=1.0,
         description="AdamW wd 0.01; unscale by fp32(1/32768), then clip_grad_norm_(1.0) on "
                     "the unscaled grads, then step",
         steps=const_steps(lr_warmup(1e-3, 8, warmup=3), 0.9, 0.999, 1e-8, 0.01),
         grad_scales=[0.5, 0.01, 2.0, 0.02, 1.0, 0.004, 5.0, 0.03]),
    dict(name="adamw_two_params", seed=1008, optimizer="AdamW", sizes=[300, 513], max_grad_norm=0.5,
         description="AdamW wd 0.01, two tensors (300, 513) in one group, one global "
                     "clip_grad_norm_(0.5) over both; norm ~28.5*scale",
         steps=const_steps(lr_decay(1e-3, 8), 0.9, 0.999, 1e-8, 0.01),
         grad_scales=[1.0, 0.01, 0.3, 0.015, 3.0, 0.005, 0.1, 0.02]),
]


def run_case(case):
    gen = torch.Generator().manual_seed(case["seed"])
    sizes = case["sizes"]
    steps = case["steps"]
    S = len(steps)
    assert len(case["grad_scales"]) == S
    max_norm = float(case.get("max_grad_norm", 0.0))
    loss_scale = float(case.get("loss_scale", 1.0))

    params = [torch.nn.Parameter(torch.randn(n, generator=gen, dtype=torch.float32))
              for n in sizes]
    initial = [bits(p) for p in params]
    # file grads: normal * scale * loss_scale, rounded to fp32 once
    file_grads = [[(torch.randn(n, generator=gen, dtype=torch.float64)
                    * case["grad_scales"][k] * loss_scale).to(torch.float32)
                   for n in sizes] for k in range(S)]

    s0 = steps[0]
    common = dict(lr=s0["lr"], betas=(s0["beta1"], s0["beta2"]), eps=s0["eps"],
                  weight_decay=s0["weight_decay"], amsgrad=False, maximize=False,
                  foreach=False)
    if case["optimizer"] == "AdamW":
        opt = torch.optim.AdamW(params, **common)
    elif case["optimizer"] == "Adam":
        opt = torch.optim.Adam(params, **common)
    else:
        raise ValueError(case["optimizer"])

    inv_scale = torch.tensor(1.0 / loss_scale, dtype=torch.float32)
    grad_norms = []
    exp_p = [[] for _ in sizes]
    exp_m = [[] for _ in sizes]
    exp_v = [[] for _ in sizes]
    for k in range(S):
        hp = steps[k]
        g = opt.param_groups[0]
        g["lr"] = hp["lr"]
        g["betas"] = (hp["beta1"], hp["beta2"])
        g["eps"] = hp["eps"]
        g["weight_decay"] = hp["weight_decay"]
        for p, fg in zip(params, file_grads[k]):
            if loss_scale != 1.0:
                p.grad = fg * inv_scale
            else:
                p.grad = fg.clone()
        if max_norm > 0.0:
            tn = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)
            grad_norms.append(float(tn))
        opt.step()
        for i, p in enumerate(params):
            st = opt.state[p]
            assert float(st["step"]) == k + 1
            exp_p[i].append(bits(p))
            exp_m[i].append(bits(st["exp_avg"]))
            exp_v[i].append(bits(st["exp_avg_sq"]))

    return {
        "format": FORMAT,
        "name": case["name"],
        "description": case["description"],
        "seed": case["seed"],
        "torch_version": torch.__version__,
        "torch_cpu_capability": cpu_capability(),
        "optimizer": case["optimizer"],
        "max_grad_norm": max_norm,
        "loss_scale": loss_scale,
        "steps": steps,
        "params": [{
            "name": "p%d" % i,
            "n": n,
            "initial": initial[i],
            "grads": [bits(file_grads[k][i]) for k in range(S)],
            "expected_param": exp_p[i],
            "expected_exp_avg": exp_m[i],
            "expected_exp_avg_sq": exp_v[i],
        } for i, n in enumerate(sizes)],
        "grad_norms": grad_norms,
    }


def write_json(path, obj):
    # Top-level keys one per line, each value compact: small, diffable, stable.
    with open(path, "w") as f:
        f.write("{\n")
        items = list(obj.items())
        for j, (key, val) in enumerate(items):
            f.write(" %s: %s%s\n" % (json.dumps(key),
                                     json.dumps(val, separators=(",", ":")),
                                     "," if j + 1 < len(items) else ""))
        f.write("}\n")


# ---------------------------------------------------------------------------
# Self-checks
# ---------------------------------------------------------------------------

def rel_err(a, b, floor):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), floor)))


def check_first_step_by_hand(fx):
    """float64 hand computation of AdamW's first step vs the fixture."""
    assert fx["optimizer"] == "AdamW" and fx["max_grad_norm"] == 0 and fx["loss_scale"] == 1
    hp = fx["steps"][0]
    lr, b1, b2, eps, wd = hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"]
    p0 = fx["params"][0]
    p = from_bits(p0["initial"]).astype(np.float64)
    g = from_bits(p0["grads"][0]).astype(np.float64)
    m = (1 - b1) * g
    v = (1 - b2) * g * g
    pn = p * (1 - lr * wd) - lr / (1 - b1) * m / (np.sqrt(v) / math.sqrt(1 - b2) + eps)
    em = from_bits(p0["expected_exp_avg"][0])
    ev = from_bits(p0["expected_exp_avg_sq"][0])
    ep = from_bits(p0["expected_param"][0])
    errs = {"exp_avg": rel_err(em, m, 1e-30),
            "exp_avg_sq": rel_err(ev, v, 1e-30),
            # param: relative to max(|p|, 1e-3) so params that land near 0 do
            # not blow up the ratio (their absolute error is ~1e-10)
            "param": rel_err(ep, pn, 1e-3)}
    i = 0
    print("  hand check %s step 1, element %d: g=%.9g p0=%.9g -> m=%.9g (torch %.9g) "
          "v=%.9g (torch %.9g) p=%.9g (torch %.9g)"
          % (fx["name"], i, g[i], p[i], m[i], em[i], v[i], ev[i], pn[i], ep[i]))
    ok = all(e <= 1e-6 for e in errs.values())
    print("  hand check max rel err over %d elements: exp_avg %.3g, exp_avg_sq %.3g, "
          "param %.3g (tol 1e-6): %s" % (len(p), errs["exp_avg"], errs["exp_avg_sq"],
                                         errs["param"], "OK" if ok else "FAIL"))
    return ok


def ulp_diff(a, b):
    """max |a-b| in units of fp32 ulps (via ordered integer mapping)."""
    def ordered(x):
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return int(np.max(np.abs(ordered(a) - ordered(b)))) if a.size else 0


def fma32(a, b, c):
    """fp32 fused multiply-add a*b + c, emulated in float64 (a*b is exact in
    double; the final double->float rounding can, very rarely, differ from a
    true single rounding)."""
    return (np.asarray(a, np.float64) * np.float64(b) + np.asarray(c, np.float64)).astype(np.float32)


def replay_fp32(fx, use_fma):
    """Replay all steps in numpy fp32 following torch 1.13's CPU op order.

    use_fma=True mirrors the AVX2/AVX512 kernels, where add(alpha) and
    addcmul use vec::fmadd:
        L2:         g = fma(param, wd, g)
        exp_avg    = fma(g, 1-b1, exp_avg*b1)
        exp_avg_sq = fma((1-b2)*g, g, exp_avg_sq*b2)
        param      = param + ((-step_size)*exp_avg) / denom     (addcdiv)
    use_fma=False is the naive two-rounding version of the same.
    The clip coefficient uses the recorded grad_norms (torch's own norm
    reduction order).  Returns, per field, (max ulp diff, fraction of
    bit-exact elements, max |diff| / (|ref| + rms(ref)))."""
    f32 = np.float32
    mad = fma32 if use_fma else (lambda a, b, c: a * b + c)
    P = [from_bits(pp["initial"]).copy() for pp in fx["params"]]
    M = [np.zeros_like(p) for p in P]
    V = [np.zeros_like(p) for p in P]
    names = ("param", "exp_avg", "exp_avg_sq")
    worst = dict.fromkeys(names, 0)
    rel = dict.fromkeys(names, 0.0)
    exact = {k: [0, 0] for k in names}
    inv = f32(1.0 / fx["loss_scale"])
    for k, hp in enumerate(fx["steps"]):
        lr, b1, b2, eps, wd = hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"]
        G = [from_bits(pp["grads"][k]) for pp in fx["params"]]
        if fx["loss_scale"] != 1.0:
            G = [g * inv for g in G]
        if fx["max_grad_norm"] > 0:
            tn = f32(fx["grad_norms"][k])
            coef = (f32(1.0) / (tn + f32(1e-6))) * f32(fx["max_grad_norm"])
            coef = min(coef, f32(1.0))
            G = [g * coef for g in G]
        t = k + 1
        bc1 = 1 - b1 ** t
        bc2s = math.sqrt(1 - b2 ** t)
        step_size = lr / bc1
        for i in range(len(P)):
            g = G[i]
            if fx["optimizer"] == "Adam":
                if wd != 0:
                    g = mad(P[i], f32(wd), g)
            else:
                P[i] = P[i] * f32(1 - lr * wd)
            M[i] = mad(g, f32(1 - b1), M[i] * f32(b1))
            V[i] = mad(f32(1 - b2) * g, g, V[i] * f32(b2))
            denom = np.sqrt(V[i]) / f32(bc2s) + f32(eps)
            P[i] = P[i] + (f32(-step_size) * M[i]) / denom
            pp = fx["params"][i]
            for key, arr, name in (("expected_param", P[i], "param"),
                                   ("expected_exp_avg", M[i], "exp_avg"),
                                   ("expected_exp_avg_sq", V[i], "exp_avg_sq")):
                ref = from_bits(pp[key][k])
                worst[name] = max(worst[name], ulp_diff(arr, ref))
                exact[name][0] += int(np.sum(arr.view(np.uint32) == ref.view(np.uint32)))
                exact[name][1] += arr.size
                r64 = ref.astype(np.float64)
                rms = math.sqrt(float(np.mean(r64 * r64)))
                rel[name] = max(rel[name], float(np.max(np.abs(arr.astype(np.float64) - r64)
                                                        / (np.abs(r64) + rms))))
    return {k: (worst[k], exact[k][0] / exact[k][1], rel[k]) for k in names}


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    ok = True
    written = []
    for case in CASES:
        fx = run_case(case)
        path = os.path.join(HERE, case["name"] + ".json")
        write_json(path, fx)
        written.append(path)
        print("wrote %s (%d bytes, %s, %d steps, sizes %s, clip %g, loss_scale %g)"
              % (os.path.relpath(path), os.path.getsize(path), fx["optimizer"],
                 len(fx["steps"]), case["sizes"], fx["max_grad_norm"], fx["loss_scale"]))
        if fx["grad_norms"]:
            clipped = sum(1 for tn in fx["grad_norms"] if tn + 1e-6 > fx["max_grad_norm"])
            print("  grad_norms %s (clipped on %d of %d steps)"
                  % (["%.4g" % x for x in fx["grad_norms"]], clipped, len(fx["grad_norms"])))
            if not 0 < clipped < len(fx["grad_norms"]):
                print("  FAIL: want some clipped and some unclipped steps")
                ok = False

    print("self-checks (files read back with json.load):")
    for path in written:
        with open(path) as f:
            fx = json.load(f)
        assert fx["format"] == FORMAT
        S = len(fx["steps"])
        for pp in fx["params"]:
            for key in ("grads", "expected_param", "expected_exp_avg", "expected_exp_avg_sq"):
                assert len(pp[key]) == S and all(len(x) == pp["n"] for x in pp[key]), key
            assert len(pp["initial"]) == pp["n"]
        assert len(fx["grad_norms"]) == (S if fx["max_grad_norm"] > 0 else 0)
        if fx["grad_norms"]:
            inv = np.float32(1.0 / fx["loss_scale"])
            worst = 0.0
            for k, tn in enumerate(fx["grad_norms"]):
                g64 = np.concatenate([(from_bits(pp["grads"][k]) * inv).astype(np.float64)
                                      for pp in fx["params"]])
                worst = max(worst, abs(tn - math.sqrt(float(np.dot(g64, g64)))) / tn)
            print("  grad_norms %-22s vs float64 norm: max rel err %.2e (tol 1e-6): %s"
                  % (fx["name"], worst, "OK" if worst <= 1e-6 else "FAIL"))
            ok = ok and worst <= 1e-6
        if fx["name"] == "adamw_basic":
            ok = check_first_step_by_hand(fx) and ok
        for use_fma in (True, False):
            r = replay_fp32(fx, use_fma)
            print("  fp32 replay %-4s %-22s param %s | exp_avg %s | exp_avg_sq %s"
                  % ("fma" if use_fma else "nofma", fx["name"],
                     *("%5.1f%% exact, %4d ulp, rel %.1e" % (100 * e, u, q)
                       for (u, e, q) in (r["param"], r["exp_avg"], r["exp_avg_sq"]))))
            # robust check, independent of FMA use: every element within
            # 1e-5 * (|ref| + rms(ref)) of torch
            if max(q for (_, _, q) in r.values()) > 1e-5:
                print("  FAIL: fp32 replay too far from torch")
                ok = False
    print("ALL CHECKS OK" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
