#!/usr/bin/python3
"""The binding's overhead: OffloadAdamW.step() against the C ABI's step (tf_adam_step, the C++
offload_adam step with nothing in between) and torch.optim.AdamW(foreach=True), at the same
size and threads, one process, cases interleaved per sample (each sample runs the cases in a
rotated order).

    PYTHONPATH=build/release/python /usr/bin/python3 bench/torch_binding_bench.py --params 64M

One fp32 CPU param of N elements with a fixed random grad (tierflow's emulated device plays
the GPU, so grads and params cross its link model: 2 x 4N bytes at 25 GB/s). Prints a JSON
object with each case's samples, median, min and max in seconds, and the ratios
offload_adamw / c_step (target <= 1.05) and torch / offload_adamw.

Two optional peers, each one more case in the rotation:
  --deepspeed-lib PATH  DeepSpeed's CPU Adam (ds_adam_step -> Adam_Optimizer::Step_8) through
        a small C shim library built outside the repository; see BENCHMARKS.md ("DeepSpeed's
        CPU Adam beside OffloadAdamW") for how. It must export
        dsadam_create(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, adamw, threads),
        dsadam_step(handle) -> 0 and dsadam_max_threads(). A pure host update over fp32
        p, g, m, v in this process: no device copies, unlike the two tierflow steps.
  --adam-bench PATH     tierflow-adam-bench (the C++ bench), run once per sample as a
        subprocess (--samples 1 --no-torch): tierflow's host-only Adam kernel and the
        Adam-shaped memory bound (28 B/param) at the same size and threads, for a kernel to
        kernel comparison with DeepSpeed's pure host update.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import time

import torch

from tierflow import _capi
from tierflow._devices import device_handle as _device_handle
from tierflow.torch import OffloadAdamW


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


def deepspeed_case(n, threads, path):
    lib = ctypes.CDLL(os.path.abspath(path))
    lib.dsadam_create.restype = ctypes.c_void_p
    f = ctypes.c_float
    lib.dsadam_create.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64, f, f, f, f, f,
                                                          ctypes.c_int, ctypes.c_int]
    lib.dsadam_step.argtypes = [ctypes.c_void_p]
    p, g = torch.randn(n), torch.randn(n) * 1e-2
    m, v = torch.zeros(n), torch.zeros(n)  # torch's and tierflow's initial state
    handle = lib.dsadam_create(p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), n,
                               1e-3, 0.9, 0.999, 1e-8, 0.01, 1, threads)
    if not handle:
        raise SystemExit(f"{path}: dsadam_create failed")

    def run():
        if lib.dsadam_step(handle) != 0:
            raise SystemExit(f"{path}: dsadam_step failed")

    return run, (lib, handle, p, g, m, v)


def adam_bench_case(n, threads, path, kept):
    """One tierflow-adam-bench process: appends its kernel and bound seconds to `kept`."""
    cmd = [path, "--params", str(n), "--threads", str(threads), "--samples", "1",
           "--no-torch", "--json"]

    def run():
        doc = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        kept["tierflow_kernel_host"].append(doc["kernel_case"]["seconds"]["median"])
        kept["bound_28B"].append(doc["bound"]["seconds"]["median"])
        kept["isa"] = doc["kernel"]

    return run, None


def optimizer_case(n, make):
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n) * 1e-2
    opt = make([p])
    return opt.step, (p, opt)


def summary(v):
    return {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v), "samples_s": v}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=count, default=count("64M"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--deepspeed-lib", help="DeepSpeed CPU Adam shim library (see above)")
    ap.add_argument("--adam-bench", help="tierflow-adam-bench binary, for the host kernel")
    args = ap.parse_args()
    if args.params < 1 or args.threads < 1 or args.samples < 1:
        ap.error("--params, --threads and --samples must be >= 1")
    for flag, path in (("--deepspeed-lib", args.deepspeed_lib), ("--adam-bench", args.adam_bench)):
        if path is not None and not os.path.isfile(path):
            ap.error(f"{flag}: no file {path}")
    torch.set_num_threads(args.threads)
    cases = {
        "c_step": c_step_case(args.params, args.threads),
        "offload_adamw": optimizer_case(args.params, lambda ps: OffloadAdamW(
            ps, lr=1e-3, weight_decay=0.01, mode="cpu", threads=args.threads)),
        "torch_adamw_foreach": optimizer_case(args.params, lambda ps: torch.optim.AdamW(
            ps, lr=1e-3, weight_decay=0.01, foreach=True)),
    }
    if args.deepspeed_lib:
        cases["deepspeed_cpu_adam"] = deepspeed_case(args.params, args.threads,
                                                     args.deepspeed_lib)
    for run, _ in cases.values():
        run()  # warm-up: first-touch of the state, the C optimizer built
    host = {"tierflow_kernel_host": [], "bound_28B": []}
    if args.adam_bench:  # its own process warms up by itself
        cases["adam_bench"] = adam_bench_case(args.params, args.threads, args.adam_bench, host)
    names = list(cases)
    times = {k: [] for k in names}
    for s in range(args.samples):
        for k in names[s % len(names):] + names[:s % len(names)]:
            start = time.perf_counter()
            cases[k][0]()
            times[k].append(time.perf_counter() - start)
    out = {"params": args.params, "threads": args.threads, "torch": torch.__version__,
           "cases_rotated": names}
    if args.adam_bench:
        del times["adam_bench"]
        out["tierflow_kernel_isa"] = host.pop("isa")
        times.update(host)
    if args.deepspeed_lib:
        out["deepspeed_omp_threads"] = cases["deepspeed_cpu_adam"][1][0].dsadam_max_threads()
    for k, v in times.items():
        out[k] = summary(v)
        out[k]["gbps_28B"] = args.params * 28 / out[k]["median_s"] / 1e9
    med = {k: out[k]["median_s"] for k in times}
    out["offload_adamw_over_c_step"] = med["offload_adamw"] / med["c_step"]
    out["torch_over_offload_adamw"] = med["torch_adamw_foreach"] / med["offload_adamw"]
    if args.deepspeed_lib:  # time over time: < 1 is faster than DeepSpeed
        out["offload_adamw_over_deepspeed"] = med["offload_adamw"] / med["deepspeed_cpu_adam"]
        out["torch_over_deepspeed"] = med["torch_adamw_foreach"] / med["deepspeed_cpu_adam"]
    if args.adam_bench:  # x bound: the bound's median over the case's
        out["x_bound"] = {k: med["bound_28B"] / med[k] for k in times}
        if args.deepspeed_lib:
            out["tierflow_kernel_over_deepspeed"] = (med["tierflow_kernel_host"]
                                                     / med["deepspeed_cpu_adam"])
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
