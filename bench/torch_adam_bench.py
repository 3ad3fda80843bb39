#!/usr/bin/python3
"""Time PyTorch's CPU Adam/AdamW step as a peer for tierflow's Adam benchmark.

Run with Debian's python (the one that has python3-torch):

    /usr/bin/python3 bench/torch_adam_bench.py --params 4M --samples 3
    /usr/bin/python3 bench/torch_adam_bench.py --json --threads 2 --no-foreach

One fp32 parameter tensor of N elements (normal random values) with a random
grad (normal * 1e-2, fixed across steps); each sample times one opt.step()
with time.perf_counter after `--warmup` untimed steps (the first step also
allocates exp_avg/exp_avg_sq).  lr 1e-3, betas (0.9, 0.999), eps 1e-8,
weight decay 0.01 for adamw and 0 for adam; amsgrad off.

gbps_28B counts 28 bytes per parameter per step: read param, grad, exp_avg,
exp_avg_sq (16 B) and write param, exp_avg, exp_avg_sq (12 B), divided by the
median step time.  (foreach=False and the unfused ops really move more than
that; the figure is the same traffic model tierflow's kernel is judged by.)

--preallocated runs the same update as torch.optim.Adam's single-tensor step,
written with in-place ops and one denominator buffer allocated once, instead of
the optimizer: no temporaries, so no page faults in the timed step (the foreach
step allocates two fresh tensors of N floats per step, and on a machine that
hands freed memory back to the host every page of them faults again).

--json prints one JSON object:
  {"name": "torch_adam", "torch_version", "params", "threads", "foreach",
   "preallocated", "optimizer", "samples_s": [...], "median_s", "min_s", "max_s",
   "mparams_per_s" (params / median_s / 1e6), "gbps_28B",
   "minor_faults_per_step" (median over the timed steps, getrusage)}
otherwise one human-readable line.
"""

import argparse
import json
import math
import resource
import statistics
import sys
import time

import torch

BYTES_PER_PARAM = 28

_SUFFIX = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}


def parse_count(text):
    """'1000', '64M', '1m', '2K', '1G', '64Mi' -> int (binary suffixes)."""
    t = text.strip().upper()
    if t.endswith("I"):
        t = t[:-1]
    suffix = t[-1] if t and t[-1] in "KMG" else ""
    num = t[:-1] if suffix else t
    try:
        value = float(num) * _SUFFIX[suffix]
    except ValueError:
        raise argparse.ArgumentTypeError("not a count: %r (e.g. 1000, 4M, 64M)" % text)
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError("count must be a positive integer: %r" % text)
    return int(value)


def positive_int(text):
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError("must be >= 1: %r" % text)
    return v


def non_negative_int(text):
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0: %r" % text)
    return v


def preallocated_step(p, kw, weight_decay):
    """torch.optim.Adam's single-tensor update of p (AdamW's when weight_decay > 0), in place,
    with its state and its one temporary (the denominator) allocated here, once."""
    lr, (beta1, beta2), eps = kw["lr"], kw["betas"], kw["eps"]
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    denom = torch.empty_like(p)
    count = [0]

    def step():
        count[0] += 1
        t = count[0]
        g = p.grad
        if weight_decay:
            p.mul_(1 - lr * weight_decay)
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        torch.sqrt(v, out=denom)
        denom.div_(math.sqrt(1 - beta2 ** t)).add_(eps)
        p.addcdiv_(m, denom, value=-lr / (1 - beta1 ** t))

    return step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=parse_count, default=64 * 2 ** 20,
                    help="number of fp32 parameters; suffixes K/M/G = 2**10/2**20/2**30 "
                         "(default 64M)")
    ap.add_argument("--threads", type=positive_int, default=2,
                    help="torch.set_num_threads (default 2)")
    ap.add_argument("--samples", type=positive_int, default=5,
                    help="timed steps (default 5)")
    ap.add_argument("--warmup", type=non_negative_int, default=1,
                    help="untimed steps first (default 1)")
    ap.add_argument("--foreach", action=argparse.BooleanOptionalAction, default=True,
                    help="use the foreach (multi-tensor) implementation (default on)")
    ap.add_argument("--preallocated", action="store_true",
                    help="the same update with in-place ops and buffers allocated once")
    ap.add_argument("--optimizer", choices=("adam", "adamw"), default="adam")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    n = args.params
    p = torch.nn.Parameter(torch.randn(n, generator=gen, dtype=torch.float32))
    p.grad = torch.randn(n, generator=gen, dtype=torch.float32).mul_(1e-2)

    kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, amsgrad=False, foreach=args.foreach)
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW([p], weight_decay=0.01, **kw)
    else:
        opt = torch.optim.Adam([p], weight_decay=0.0, **kw)

    step = preallocated_step(p, kw, 0.01 if args.optimizer == "adamw" else 0.0) \
        if args.preallocated else opt.step
    with torch.no_grad():
        for _ in range(args.warmup):
            step()
        samples = []
        faults = []
        for _ in range(args.samples):
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            step()
            samples.append(time.perf_counter() - t0)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)

    if not torch.isfinite(p).all():
        print("error: parameter became non-finite", file=sys.stderr)
        return 1

    median = statistics.median(samples)
    result = {
        "name": "torch_adam",
        "torch_version": torch.__version__,
        "params": n,
        "threads": torch.get_num_threads(),
        "foreach": args.foreach,
        "preallocated": args.preallocated,
        "optimizer": args.optimizer,
        "samples_s": samples,
        "median_s": median,
        "min_s": min(samples),
        "max_s": max(samples),
        "mparams_per_s": n / median / 1e6,
        "gbps_28B": BYTES_PER_PARAM * n / median / 1e9,
        "minor_faults_per_step": statistics.median(faults),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print("torch %s %s foreach=%s preallocated=%s threads=%d params=%d: median %.3f ms "
              "(min %.3f, max %.3f, %d samples) %.1f Mparam/s %.2f GB/s (28 B/param), "
              "%d minor faults/step"
              % (result["torch_version"], args.optimizer, args.foreach, args.preallocated,
                 result["threads"], n, median * 1e3, result["min_s"] * 1e3,
                 result["max_s"] * 1e3, len(samples), result["mparams_per_s"],
                 result["gbps_28B"], result["minor_faults_per_step"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
