#!/usr/bin/python3
"""The binding's overhead: OffloadAdamW.step() against the C ABI's step (tf_adam_step, the C++
offload_adam step with nothing in between) and torch.optim.AdamW(foreach=True), at the same
size and threads, one process, cases interleaved per sample (each sample runs the three in a
rotated order).

    PYTHONPATH=build/release/python /usr/bin/python3 bench/torch_binding_bench.py --params 64M

One fp32 CPU param of N elements with a fixed random grad (tierflow's emulated device plays
the GPU, so grads and params cross its link model: 2 x 4N bytes at 25 GB/s). Prints a JSON
object with each case's samples, median, min and max in seconds, and the ratios
offload_adamw / c_step (target <= 1.05) and torch / offload_adamw.
"""
import argparse
import ctypes
import json
import statistics
import time

import torch

from tierflow import _capi
from tierflow.torch import OffloadAdamW, _device_handle


def count(text):
    t = text.strip().upper().rstrip("I")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(t[-1:], 1)
    return int(float(t[:-1] if scale > 1 else t) * scale)


def c_step_case(n, threads):
    p = torch.randn(n)
    g = torch.randn(n) * 1e-2
    params = (_capi.AdamParam * 1)(_capi.AdamParam(b"w", p.data_ptr(), g.data_ptr(),
                                                   _capi.DTYPE_F32, n, 0, 0))
    hyper = _capi.AdamHyper()
    _capi.lib.tf_adam_hyper_default(ctypes.byref(hyper))
    options = _capi.AdamOptions()
    _capi.lib.tf_adam_options_default(ctypes.byref(options))
    options.mode, options.threads = _capi.ADAM_CPU, threads
    adam = ctypes.c_void_p()
    _capi.call("tf_adam_create", _device_handle(torch.device("cpu")), params, 1,
               ctypes.byref(hyper), 1, ctypes.byref(options), ctypes.byref(adam))
    applied = ctypes.c_int()

    def run():
        _capi.call("tf_adam_step", adam, ctypes.byref(applied), None)

    return run, (p, g, adam)


def optimizer_case(n, make):
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n) * 1e-2
    opt = make([p])
    return opt.step, (p, opt)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=count, default=count("64M"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--samples", type=int, default=7)
    args = ap.parse_args()
    if args.params < 1 or args.threads < 1 or args.samples < 1:
        ap.error("--params, --threads and --samples must be >= 1")
    torch.set_num_threads(args.threads)
    cases = {
        "c_step": c_step_case(args.params, args.threads),
        "offload_adamw": optimizer_case(args.params, lambda ps: OffloadAdamW(
            ps, lr=1e-3, weight_decay=0.01, mode="cpu", threads=args.threads)),
        "torch_adamw_foreach": optimizer_case(args.params, lambda ps: torch.optim.AdamW(
            ps, lr=1e-3, weight_decay=0.01, foreach=True)),
    }
    for run, _ in cases.values():
        run()  # warm-up: first-touch of the state, the C optimizer built
    names = list(cases)
    times = {k: [] for k in names}
    for s in range(args.samples):
        for k in names[s % 3:] + names[:s % 3]:
            start = time.perf_counter()
            cases[k][0]()
            times[k].append(time.perf_counter() - start)
    out = {"params": args.params, "threads": args.threads, "torch": torch.__version__}
    for k, v in times.items():
        out[k] = {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v),
                  "samples_s": v}
    out["offload_adamw_over_c_step"] = out["offload_adamw"]["median_s"] / out["c_step"]["median_s"]
    out["torch_over_offload_adamw"] = (out["torch_adamw_foreach"]["median_s"]
                                       / out["offload_adamw"]["median_s"])
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
