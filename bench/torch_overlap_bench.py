"""OffloadAdamW(overlap="backward"/"backward_publish") against overlap="none" in one run: the
optimizer time left
exposed after the backward pass (the wall time of step()), and the whole iteration against
max(forward + backward, the plain Adam step), medians and p10-p90. The cases are interleaved
(each runs --rounds times, in turn), so that the machine's load falls on all alike.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/torch_overlap_bench.py

torch computes on one thread (the stand-in for a GPU's compute) and the optimizer's workers get
the other cores; the model's last layers are wide, so their grads arrive early in the backward
pass and the Adam step is a sizeable share of the iteration. --clip-every-step sets
max_grad_norm below every step's norm: the worst case, each speculative update rolled back.
"""
import argparse
import statistics
import sys
import time


def spread(xs):
    xs = sorted(xs)
    return statistics.median(xs), xs[len(xs) // 10], xs[(9 * len(xs)) // 10]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--overlaps", default="none,backward,backward_publish",
                   help="comma-separated cases; 'none' (the baseline) is always run")
    p.add_argument("--clip-every-step", action="store_true")
    p.add_argument("--offload-params", action="store_true",
                   help="the weights in a host tier too (offload_parameters, as the main job): "
                        "the params the step writes are then in host memory")
    args = p.parse_args()
    import torch
    from torch import nn

    from tierflow.torch import OffloadAdamW, offload_parameters

    torch.set_num_threads(1)

    def model():
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Sequential(nn.Linear(args.width, args.width), nn.Tanh())
                               for _ in range(args.layers)])

    x = torch.randn(args.rows, args.width)
    clip = 1e-6 if args.clip_every_step else None
    results = {}
    cases = ["none"] + [c for c in args.overlaps.split(",") if c and c != "none"]
    for overlap in cases * args.rounds:  # interleaved: fair to every case
        net = model()
        handle = offload_parameters(net) if args.offload_params else None
        opt = OffloadAdamW(net.parameters(), lr=1e-4, mode="cpu", max_grad_norm=clip,
                           overlap=overlap)
        fb, st, it = [], [], []
        for i in range(args.steps + 2):
            opt.zero_grad(set_to_none=False)
            start = time.perf_counter()
            net(x).square().mean().backward()
            mid = time.perf_counter()
            opt.step()
            end = time.perf_counter()
            if i >= 2:  # the first builds the optimizer, the second is the first announced
                fb.append(mid - start)
                st.append(end - mid)
                it.append(end - start)
        r = results.setdefault(overlap, {"fb": [], "step": [], "iter": []})
        r["fb"] += fb
        r["step"] += st
        r["iter"] += it
        r["metrics"] = opt.metrics()["adam"]
        if handle is not None:
            handle.remove()
    params = sum(q.numel() for q in model().parameters())
    print(f"# {args.layers} x Linear({args.width}) + Tanh ({params / 1e6:.1f} M params), "
          f"{args.rows} rows, torch 1 thread, clip every step: {args.clip_every_step}, "
          f"weights offloaded: {args.offload_params}, "
          f"{args.rounds * args.steps} timed iterations each")
    plain_step = spread(results["none"]["step"])[0]
    fwd_bwd = spread(results["none"]["fb"])[0]
    bound = max(fwd_bwd, plain_step)
    print("| overlap | fwd+bwd ms | step() after backward ms (p10-p90) | exposed / plain step | "
          "iteration ms | iteration / max(fwd+bwd, plain step) | rollbacks |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        s, s10, s90 = spread(r["step"])
        print(f"| {name} | {spread(r['fb'])[0] * 1e3:.1f} | {s * 1e3:.1f} ({s10 * 1e3:.1f}-"
              f"{s90 * 1e3:.1f}) | {s / plain_step:.2f} | {spread(r['iter'])[0] * 1e3:.1f} | "
              f"{spread(r['iter'])[0] / bound:.2f} | {r['metrics']['rollbacks']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
