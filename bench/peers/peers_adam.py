#!/usr/bin/env python3
"""OffloadAdamW's CPU step against its peers, in one process, on the same params and grads.

Run with the peers venv's python (bench/peers/make_venv.sh makes it; see README.md there):

    PYTHONPATH=build/dev/python ~/.cache/tierflow/peers-venv/bin/python \\
        bench/peers/peers_adam.py --params 16M,64M --threads 1,2

Cases (--list; select with --cases by name or prefix):
  offload_adamw     tierflow.torch.OffloadAdamW(mode="cpu", threads=T)
  offload_adamw_bf16  the same with state_dtype="bf16" (checked to 1e-2: its moments round)
  offload_adamw_int8  the same with state_dtype="int8" (checked to 1e-2)
  deepspeed_cpu     deepspeed.ops.adam.DeepSpeedCPUAdam(adamw_mode=True)
  torch_foreach     torch.optim.AdamW(foreach=True)
  torch_fused       torch.optim.AdamW(fused=True), WAIVED where this torch has no CPU fused AdamW
A case that cannot run here (a package missing) is reported WAIVED with the reason.

All take lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01. Each owns its own fp32 params
(the same normal random values, split into --tensors tensors) and its own grads (the same values,
normal * 1e-2, fixed across steps). --clip clips the global grad norm to 1.0 in every step:
OffloadAdamW through max_grad_norm, the others with torch.nn.utils.clip_grad_norm_ before step()
(which rescales .grad in place; the grads being fixed, the coefficient is ~1 after the first step,
but the norm and the scaling are computed every step, as OffloadAdamW computes them).

Threads: one process per thread count T, with OMP_NUM_THREADS=T set before torch and DeepSpeed
are imported, torch.set_num_threads(T) and OffloadAdamW(threads=T). (DeepSpeed's cpu_adam op is an
OpenMP loop; its GOMP symbols resolve to the libgomp torch's wheel bundles, so torch's thread count
governs it too; the variable makes sure both start from T.) With --threads listing several
counts, or one that differs from OMP_NUM_THREADS, the script runs itself once per count and
gathers the results.

Check: the first --check-steps steps of every case (untimed; they are the warm-up too) are
compared with torch.optim.AdamW(foreach=False) run on its own copy: the max |difference| over the
max |reference value| must be <= 1e-5 ("within 1e-5 of scale"); also reported, the difference over
the largest change the reference made to a param (a stricter, informative figure). A failed check
is reported and makes the exit status 1.

Timing: --rounds rounds; each round times one step() of every case (time.perf_counter), the order
rotated by one case each round. Reported per case: median and [min - max] ms, Mparam/s, GB/s
(10^9 B/s at 28 B per param: read param, grad, m, v; write param, m, v), and the median time over
OffloadAdamW's median time (> 1: OffloadAdamW is faster). os.getloadavg() at start and end.

--json prints one JSON document instead of the table:
  {"name": "peers_adam", "command", "hyper", "clip", "max_grad_norm", "rounds", "check_steps",
   "tensors", "loadavg_start", "loadavg_end",
   "runs": [{"threads", "omp_num_threads", "torch_threads", "params",
             "versions": {"python", "torch", "deepspeed", "tierflow"}, "deepspeed_cxx_args", "cpu",
             "loadavg_start", "loadavg_end",
             "cases": [{"name", "description", "status": "ok" | "waived" | "check_failed",
                        "reason", "check_max_rel_diff", "check_update_rel_diff", "samples_ms",
                        "median_ms", "min_ms", "max_ms", "mparams_per_s", "gbps_28B",
                        "time_ratio_to_offload_adamw"}]}]}
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_adam_bench import parse_count, positive_int  # noqa: E402  (one count parser)

BYTES_PER_PARAM = 28
HYPER = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
MAX_GRAD_NORM = 1.0
CHECK_TOLERANCE = 1e-5
BASELINE = "offload_adamw"


# --- cases -----------------------------------------------------------------------------------

def clipped(step, params, clip):
    """step() preceded by torch's global-norm clip when `clip`; step itself otherwise."""
    if not clip:
        return step

    def clip_then_step():
        import torch
        torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        step()
    return clip_then_step


def make_offload_adamw(params, threads, clip, state_dtype="fp32"):
    from tierflow.torch import OffloadAdamW
    opt = OffloadAdamW(params, **HYPER, mode="cpu", threads=threads,
                       max_grad_norm=MAX_GRAD_NORM if clip else None, state_dtype=state_dtype)
    return opt.step


def make_offload_compressed(state_dtype):
    def make(params, threads, clip):
        return make_offload_adamw(params, threads, clip, state_dtype)
    return make


def make_deepspeed_cpu(params, threads, clip):
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    return clipped(DeepSpeedCPUAdam(params, **HYPER, adamw_mode=True).step, params, clip)


def make_torch(**flags):
    def make(params, threads, clip):
        import torch
        return clipped(torch.optim.AdamW(params, **HYPER, **flags).step, params, clip)
    return make


def waived_unless_imports(module):
    def waived():
        try:
            __import__(module)
        except Exception as e:  # an ImportError, or DeepSpeed failing to pick an accelerator
            return "cannot import %s: %s" % (module, e)
        return None
    return waived


def waived_unless_cpu_fused():
    import torch
    p = torch.nn.Parameter(torch.randn(8))
    p.grad = torch.randn(8)
    try:
        torch.optim.AdamW([p], fused=True).step()
    except (RuntimeError, ValueError, TypeError) as e:
        return "torch %s has no CPU fused AdamW: %s" % (torch.__version__, str(e).splitlines()[0])
    return None


class Case:
    """One optimizer under test: make(params, threads, clip) returns its step()."""

    def __init__(self, name, description, make, waived=lambda: None, tolerance=CHECK_TOLERANCE):
        self.name, self.description, self.make, self.waived = name, description, make, waived
        self.tolerance = tolerance  # of the check against torch's AdamW


CASES = [
    Case(BASELINE, 'tierflow.torch.OffloadAdamW(mode="cpu", threads=T)', make_offload_adamw,
         waived_unless_imports("tierflow.torch")),
    Case(BASELINE + "_bf16", 'OffloadAdamW(..., state_dtype="bf16")',
         make_offload_compressed("bf16"), waived_unless_imports("tierflow.torch"), 1e-2),
    Case(BASELINE + "_int8", 'OffloadAdamW(..., state_dtype="int8")',
         make_offload_compressed("int8"), waived_unless_imports("tierflow.torch"), 1e-2),
    Case("deepspeed_cpu", "deepspeed.ops.adam.DeepSpeedCPUAdam(adamw_mode=True)",
         make_deepspeed_cpu, waived_unless_imports("deepspeed.ops.adam")),
    Case("torch_foreach", "torch.optim.AdamW(foreach=True)", make_torch(foreach=True)),
    Case("torch_fused", "torch.optim.AdamW(fused=True)", make_torch(fused=True),
         waived_unless_cpu_fused),
]


def select_cases(selection):
    """Cases whose name equals or starts with one of the comma-separated `selection`."""
    if not selection:
        return list(CASES)
    wanted = [s.strip() for s in selection.split(",") if s.strip()]
    chosen = [c for c in CASES if any(c.name.startswith(w) for w in wanted)]
    unknown = [w for w in wanted if not any(c.name.startswith(w) for c in CASES)]
    if unknown:
        raise SystemExit("peers_adam: no case matches %s (--list shows them)" % ", ".join(unknown))
    return chosen


# --- data, check, timing ---------------------------------------------------------------------

def make_data(params, tensors, seed):
    """The initial values and grads every case copies: `tensors` pieces of ~params/tensors."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    sizes = [params // tensors + (1 if i < params % tensors else 0) for i in range(tensors)]
    init = [torch.randn(n, generator=gen) for n in sizes]
    grads = [torch.randn(n, generator=gen) * 1e-2 for n in sizes]
    return init, grads


def own_copy(init, grads):
    import torch
    params = [torch.nn.Parameter(t.clone()) for t in init]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    return params


def compare(params, reference, init):
    """(max |p - ref| / max |ref|, max |p - ref| / max |ref - init|) over every tensor."""
    diff = max(float((p.detach() - r.detach()).abs().max()) for p, r in zip(params, reference))
    scale = max(float(r.detach().abs().max()) for r in reference)
    moved = max(float((r.detach() - i).abs().max()) for r, i in zip(reference, init))
    return diff / max(scale, 1e-30), diff / max(moved, 1e-30)


def reference_params(init, grads, clip, steps):
    import torch
    params = own_copy(init, grads)
    step = clipped(torch.optim.AdamW(params, **HYPER, foreach=False).step, params, clip)
    for _ in range(steps):
        step()
    return params


def prepare(cases, init, grads, threads, clip, steps):
    """Builds every case on its own copy, runs `steps` untimed steps, checks against torch."""
    reference = reference_params(init, grads, clip, steps)
    results, steppers = [], {}
    for case in cases:
        result = {"name": case.name, "description": case.description, "status": "ok"}
        results.append(result)
        reason = case.waived()
        if reason:
            result.update(status="waived", reason=reason)
            continue
        params = own_copy(init, grads)
        step = case.make(params, threads, clip)
        for _ in range(steps):
            step()
        rel, update_rel = compare(params, reference, init)
        result.update(check_max_rel_diff=rel, check_update_rel_diff=update_rel)
        if not rel <= case.tolerance:
            result.update(status="check_failed",
                          reason="max rel diff %.3g > %g after %d steps" % (rel, case.tolerance,
                                                                           steps))
        steppers[case.name] = (step, params)
    return results, steppers


def time_rounds(steppers, rounds, progress):
    """{case: [seconds per step]}: each round one step of every case, order rotated."""
    names = list(steppers)
    samples = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            step = steppers[name][0]
            t0 = time.perf_counter()
            step()
            samples[name].append(time.perf_counter() - t0)
        progress("round %d/%d" % (r + 1, rounds))
    return samples


def summarize(results, samples, params):
    """Adds median/min/max, throughput and the time ratio to OffloadAdamW to each result."""
    for result in results:
        s = samples.get(result["name"])
        if not s:
            continue
        median = statistics.median(s)
        result.update(samples_ms=[x * 1e3 for x in s], median_ms=median * 1e3,
                      min_ms=min(s) * 1e3, max_ms=max(s) * 1e3,
                      mparams_per_s=params / median / 1e6,
                      gbps_28B=BYTES_PER_PARAM * params / median / 1e9)
    base = next((r for r in results if r["name"] == BASELINE and "median_ms" in r), None)
    for result in results:
        if base and "median_ms" in result:
            result["time_ratio_to_offload_adamw"] = result["median_ms"] / base["median_ms"]


# --- one process, one thread count -----------------------------------------------------------

def versions():
    import torch
    found = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import deepspeed
        found["deepspeed"] = deepspeed.__version__
    except Exception as e:
        found["deepspeed"] = "unavailable (%s)" % str(e).splitlines()[0]
    try:
        import tierflow
        info = tierflow.build_info()
        found["tierflow"] = "%s (%s)" % (info["version"], info["library"])
    except Exception as e:
        found["tierflow"] = "unavailable (%s)" % str(e).splitlines()[0]
    return found


def deepspeed_build():
    """The compiler flags DeepSpeed's cpu_adam op is JIT-built with, as its builder states them."""
    try:
        from deepspeed.ops.op_builder import CPUAdamBuilder
        return " ".join(CPUAdamBuilder().cxx_args())
    except Exception as e:
        return "unavailable (%s)" % str(e).splitlines()[0]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_size(args, cases, threads, params):
    import torch

    def progress(what):
        print("peers_adam: threads=%d params=%d %s" % (threads, params, what), file=sys.stderr,
              flush=True)

    run = {"threads": threads, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
           "torch_threads": torch.get_num_threads(), "params": params,
           "versions": versions(), "deepspeed_cxx_args": deepspeed_build(), "cpu": cpu_model(),
           "loadavg_start": os.getloadavg()}
    init, grads = make_data(params, args.tensors, args.seed)
    progress("check (%d steps against torch.optim.AdamW(foreach=False))" % args.check_steps)
    results, steppers = prepare(cases, init, grads, threads, args.clip, args.check_steps)
    del init, grads
    samples = time_rounds(steppers, args.rounds, progress)
    summarize(results, samples, params)
    run.update(loadavg_end=os.getloadavg(), cases=results)
    return run


def run_here(args, threads):
    """Every size at `threads` threads in this process."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    torch.set_num_threads(threads)
    cases = select_cases(args.cases)
    return [run_size(args, cases, threads, n) for n in args.params]


def run_child(args, threads):
    """Runs this script for one thread count with OMP_NUM_THREADS set before any import."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.setdefault("DS_ACCELERATOR", "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "runs.json")
        argv = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:] + [
            "--threads", str(threads), "--result-file", out]
        # The child's stdout (DeepSpeed's op build log, its banner) goes to our stderr.
        code = subprocess.call(argv, env=env, stdout=sys.stderr.fileno())
        if not os.path.exists(out):
            raise SystemExit("peers_adam: the run at %d threads failed (exit %d)" % (threads, code))
        with open(out) as f:
            return json.load(f)


# --- output ----------------------------------------------------------------------------------

def format_table(doc):
    lines = ["peers_adam: AdamW step, fp32 CPU, clip=%s, %d rounds (after %d checked steps); "
             "GB/s = 10^9 B/s at %d B/param; ratio = median time / OffloadAdamW's (> 1: "
             "OffloadAdamW faster)" % ("on" if doc["clip"] else "off", doc["rounds"],
                                       doc["check_steps"], BYTES_PER_PARAM),
             "loadavg (1, 5, 15 min) at start %s, at end %s" % (
                 format_load(doc["loadavg_start"]), format_load(doc["loadavg_end"]))]
    for run in doc["runs"]:
        v = run["versions"]
        lines.append("")
        lines.append("threads=%d (OMP_NUM_THREADS=%s, torch %d)  params=%d (%g Mi) in %d "
                     "tensor(s)  loadavg %.2f -> %.2f" % (
                         run["threads"], run["omp_num_threads"], run["torch_threads"],
                         run["params"], run["params"] / 2 ** 20, doc["tensors"],
                         run["loadavg_start"][0], run["loadavg_end"][0]))
        lines.append("%s; python %s, torch %s, deepspeed %s, tierflow %s" % (
            run["cpu"], v["python"], v["torch"], v["deepspeed"], v["tierflow"]))
        lines.append("deepspeed cpu_adam built with: %s" % run["deepspeed_cxx_args"])
        lines.append("%-14s %-11s %10s %21s %9s %7s %7s" % (
            "case", "check", "median ms", "[min - max] ms", "Mparam/s", "GB/s", "ratio"))
        lines.extend(format_case(c) for c in run["cases"])
    return "\n".join(lines)


def format_load(load):
    return "/".join("%.2f" % x for x in load)


def format_case(c):
    check = "%.1e" % c["check_max_rel_diff"] if "check_max_rel_diff" in c else "-"
    if c["status"] == "waived":
        return "%-14s WAIVED: %s" % (c["name"], c["reason"])
    if c["status"] == "check_failed":
        check = "FAILED " + check
    ratio = c.get("time_ratio_to_offload_adamw")
    return "%-14s %-11s %10.2f %21s %9.0f %7.2f %7s" % (
        c["name"], check, c["median_ms"], "[%.2f - %.2f]" % (c["min_ms"], c["max_ms"]),
        c["mparams_per_s"], c["gbps_28B"], "%.2f" % ratio if ratio else "-")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default="16M,64M",
                    help="comma-separated param counts (binary suffixes: 1M = 2^20)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--cases", default="", help="comma-separated names or prefixes (all)")
    ap.add_argument("--rounds", type=positive_int, default=15, help="timed rounds")
    ap.add_argument("--check-steps", type=positive_int, default=5,
                    help="untimed steps before timing, checked against torch's AdamW")
    ap.add_argument("--tensors", type=positive_int, default=1,
                    help="tensors the params are split into")
    ap.add_argument("--clip", action=argparse.BooleanOptionalAction, default=False,
                    help="clip the global grad norm to %g in every step" % MAX_GRAD_NORM)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--result-file", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.params = [parse_count(t) for t in args.params.split(",") if t.strip()]
    args.threads = [positive_int(t) for t in args.threads.split(",") if t.strip()]
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.list:
        for c in CASES:
            print("%-14s %s" % (c.name, c.description))
        return 0
    select_cases(args.cases)
    in_process = (len(args.threads) == 1
                  and os.environ.get("OMP_NUM_THREADS") == str(args.threads[0]))
    if args.result_file and not in_process:
        raise SystemExit("peers_adam: --result-file needs one --threads equal to OMP_NUM_THREADS")
    doc = {"name": "peers_adam", "command": " ".join(sys.argv), "hyper": HYPER,
           "clip": args.clip, "max_grad_norm": MAX_GRAD_NORM if args.clip else None,
           "rounds": args.rounds, "check_steps": args.check_steps, "tensors": args.tensors,
           "loadavg_start": os.getloadavg(), "runs": []}
    for threads in args.threads:
        doc["runs"] += run_here(args, threads) if in_process else run_child(args, threads)
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump(doc["runs"], f)
        return 0
    doc["loadavg_end"] = os.getloadavg()
    print(json.dumps(doc, indent=1) if args.json else format_table(doc))
    failed = [c for r in doc["runs"] for c in r["cases"] if c["status"] == "check_failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
