#!/usr/bin/env python3
"""Time PyTorch's AdamW at one parameter count, as peers for tierflow's streamed Adam.

    python3 bench/torch_gpu_adam.py --params 256M --samples 5 --json

cuda: torch.optim.AdamW(fused=True) on the GPU, params, grads and state resident in HBM
      (each sample: one opt.step() between torch.cuda.synchronize() calls).
cpu:  torch.optim.AdamW (foreach) on the host, state in host memory, with every CPU
      (torch.get_num_threads(), or --threads).
One fp32 tensor of N elements (normal values), grads normal * 1e-2; lr 1e-3, betas
(0.9, 0.999), eps 1e-8, weight decay 0.01; one untimed warm-up step (it also allocates
the state), then the median of --samples timed steps.

--json prints one JSON object:
  {"name": "torch_gpu_adam", "torch_version", "params",
   "cuda": {"status": "ok", "device", "median_s", "min_s", "max_s", "params_per_s"}
           or {"status": "WAIVED", "reason"},
   "cpu":  the same keys, plus "threads"}
A missing torch prints {"status": "WAIVED", "reason"} and exits 0.
"""

import argparse
import json
import statistics
import sys
import time


def parse_count(text):
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in scale:
        return int(float(text[:-1]) * scale[text[-1]])
    return int(text)


def time_steps(torch, params, samples, sync):
    opt = torch.optim.AdamW(params["list"], lr=1e-3, weight_decay=0.01, **params["kwargs"])
    opt.step()  # warm-up: allocates exp_avg / exp_avg_sq
    sync()
    times = []
    for _ in range(samples):
        sync()
        start = time.perf_counter()
        opt.step()
        sync()
        times.append(time.perf_counter() - start)
    return times


def summary(times, n):
    med = statistics.median(times)
    return {"status": "ok", "median_s": med, "min_s": min(times), "max_s": max(times),
            "params_per_s": n / med}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="256M", help="parameter count (suffix K, M, G)")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU AdamW")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n = parse_count(args.params)
    try:
        import torch
    except ImportError as e:
        doc = {"name": "torch_gpu_adam", "status": "WAIVED", "reason": f"no torch: {e}"}
        print(json.dumps(doc) if args.json else f"WAIVED: {doc['reason']}")
        return 0
    doc = {"name": "torch_gpu_adam", "torch_version": torch.__version__, "params": n}
    gen = torch.Generator().manual_seed(1)

    if torch.cuda.is_available():
        dev = torch.device("cuda")
        p = torch.randn(n, generator=gen).to(dev).requires_grad_()
        p.grad = (torch.randn(n, generator=gen) * 1e-2).to(dev)
        times = time_steps(torch, {"list": [p], "kwargs": {"fused": True}}, args.samples,
                           torch.cuda.synchronize)
        doc["cuda"] = summary(times, n)
        doc["cuda"]["device"] = torch.cuda.get_device_name(0)
        del p
        torch.cuda.empty_cache()
    else:
        doc["cuda"] = {"status": "WAIVED", "reason": "torch.cuda.is_available() is False"}

    if args.no_cpu:
        doc["cpu"] = {"status": "WAIVED", "reason": "--no-cpu"}
    else:
        if args.threads > 0:
            torch.set_num_threads(args.threads)
        p = torch.randn(n, generator=gen).requires_grad_()
        p.grad = torch.randn(n, generator=gen) * 1e-2
        times = time_steps(torch, {"list": [p], "kwargs": {"foreach": True}}, args.samples,
                           lambda: None)
        doc["cpu"] = summary(times, n)
        doc["cpu"]["threads"] = torch.get_num_threads()

    if args.json:
        print(json.dumps(doc))
    else:
        for key in ("cuda", "cpu"):
            r = doc[key]
            if r["status"] == "ok":
                print(f"torch AdamW {key}: {r['median_s'] * 1e3:.2f} ms per step, "
                      f"{r['params_per_s']:.3g} params/s")
            else:
                print(f"torch AdamW {key}: WAIVED ({r['reason']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
