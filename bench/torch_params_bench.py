"""offload_parameters on the emulated device: a sweep of window x HBM budget, each configuration's
forward + backward time against its bound max(compute with everything resident, bytes in /
link), and the stall fraction; medians and p10-p90 over the timed passes.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/torch_params_bench.py [--link-gbps 0.5]

The link is the emulated device's (TIERFLOW_EMU_LINK, set here before the device opens), so the
bound's bytes / link is the rate the device really enforces.
"""
import argparse
import os
import statistics
import sys
import time


def quantiles(xs):
    xs = sorted(xs)
    return statistics.median(xs), xs[len(xs) // 10], xs[(9 * len(xs)) // 10]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--passes", type=int, default=12)
    p.add_argument("--link-gbps", type=float, default=0.5)
    args = p.parse_args()
    if not 0 < args.link_gbps < 1e4:
        p.error(f"--link-gbps must be in (0, 1e4), not {args.link_gbps}")
    os.environ["TIERFLOW_EMU_LINK"] = (f"h2d={args.link_gbps}GB/s,d2h={args.link_gbps}GB/s,"
                                       "latency=10us")
    import torch
    from torch import nn

    from tierflow.torch import offload_parameters

    torch.manual_seed(0)
    x = torch.randn(args.rows, args.width)

    def model():
        torch.manual_seed(1)
        return nn.Sequential(*[nn.Sequential(nn.Linear(args.width, args.width), nn.GELU())
                               for _ in range(args.blocks)])

    def passes(m, handle=None):
        times, stalls, bytes_in = [], [], []
        for i in range(args.passes + 1):
            start = time.perf_counter()
            m(x).square().mean().backward()
            took = time.perf_counter() - start
            if i == 0:
                continue  # the first pass warms up
            times.append(took)
            if handle is not None:
                last = handle.metrics()["last_pass"]
                stalls.append(last["stall_s"])
                bytes_in.append(last["bytes_in"])
        return times, stalls, bytes_in

    block = sum(q.numel() * q.element_size() for q in model()[0].parameters())
    print(f"# {args.blocks} blocks of Linear({args.width}) + GELU ({block / 2**20:.2f} MiB each), "
          f"{args.rows} rows, link {args.link_gbps} GB/s, {args.passes} timed passes, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}")
    resident, _, _ = passes(model())
    compute, c10, c90 = quantiles(resident)
    print(f"resident (nothing offloaded): median {compute * 1e3:.1f} ms "
          f"(p10 {c10 * 1e3:.1f}, p90 {c90 * 1e3:.1f})")
    print("| window | budget (blocks) | pass median ms (p10-p90) | stall % | bytes/link ms | "
          "bound ms | ratio to bound | ratio to resident |")
    print("|---|---|---|---|---|---|---|---|")
    for window in (0, 1, 2, 4):
        for slots in sorted({window + 1, window + 2, 2 * window + 2}):
            budget = slots * (block + 4096)
            m = model()
            with offload_parameters(m, blocks=list(m), window=window, hbm_budget=budget) as h:
                times, stalls, bytes_in = passes(m, h)
            med, lo, hi = quantiles(times)
            link_s = statistics.median(bytes_in) / (args.link_gbps * 1e9)
            bound = max(compute, link_s)
            stall = sum(stalls) / sum(times)
            print(f"| {window} | {slots} | {med * 1e3:.1f} ({lo * 1e3:.1f}-{hi * 1e3:.1f}) | "
                  f"{100 * stall:.1f} | {link_s * 1e3:.1f} | {bound * 1e3:.1f} | "
                  f"{med / bound:.3f} | {med / compute:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
