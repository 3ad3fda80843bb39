#!/usr/bin/env python3
"""The 2-rank ZeRO step (ZeroRedundancyOptimizer + DDP, gloo on 127.0.0.1, OffloadAdamW) against
2 x the single-rank OffloadAdamW step on the same model and per-rank batch (issue 26).

Each rank, and the single-rank run, uses one torch thread: the 2-rank step does twice the
single-rank step's work (two batches, one model's Adam state split in two), so a ratio
2-rank / (2 x single) below 1 means the two ranks overlap; above 1, what sharding costs here.
Every step (forward, backward, grad all-reduce, optimizer, param broadcast) is timed on rank 0
after a barrier; medians and the 10th/90th percentiles of the samples.

  PYTHONPATH=build/release/python /usr/bin/python3 bench/torch_distributed_bench.py [--json]
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def mlp(width, layers):
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*blocks)


def timed_steps(net, opt, args, rank, barrier):
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.width, generator=g)
    y = torch.randn(args.batch, args.width, generator=g)
    samples = []
    for step in range(args.warmup + args.steps):
        barrier()
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        if step >= args.warmup:
            samples.append(time.perf_counter() - start)
    return samples


def summary(samples):
    s = sorted(samples)

    def percentile(q):
        return s[min(len(s) - 1, int(q * len(s)))] * 1e3

    return {"median_ms": statistics.median(s) * 1e3, "p10_ms": percentile(0.1),
            "p90_ms": percentile(0.9), "samples": len(s)}


def single(args, out):
    from tierflow.torch import OffloadAdamW

    torch.set_num_threads(1)
    net = mlp(args.width, args.layers)
    opt = OffloadAdamW(net.parameters(), lr=1e-4)
    out.put(summary(timed_steps(net, opt, args, 0, lambda: None)))


def zero_rank(rank, world, port, args, out):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    import tierflow.distributed as tfd
    from tierflow.torch import OffloadAdamW

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    net = DistributedDataParallel(mlp(args.width, args.layers))
    opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=OffloadAdamW, lr=1e-4,
                                  placement=tfd.local_placement())
    samples = timed_steps(net, opt, args, rank, dist.barrier)
    records = tfd.gather_metrics(opt)
    if rank == 0:
        out.put({**summary(samples), "ranks": records})
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="rows per rank per step")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    p = ctx.Process(target=single, args=(args, out))
    p.start()
    one = out.get()
    p.join()
    mp.start_processes(zero_rank, args=(2, free_port(), args, out), nprocs=2,
                       start_method="spawn")
    two = out.get()
    params = sum(p.numel() for p in mlp(args.width, args.layers).parameters())
    result = {"model_params": params, "batch_per_rank": args.batch, "single": one,
              "zero2": {k: v for k, v in two.items() if k != "ranks"},
              "ratio_zero2_to_2x_single": two["median_ms"] / (2 * one["median_ms"]),
              "nproc": os.cpu_count(), "torch": torch.__version__}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    import tierflow.distributed as tfd
    print(f"model {params / 1e6:.2f} M params ({args.layers} x Linear({args.width})), "
          f"{args.batch} rows per rank, {args.steps} steps after {args.warmup} warm-up")
    for name, r in (("single rank (OffloadAdamW)", one), ("2 ranks (ZeRO + DDP)", two)):
        print(f"{name:28s} step median {r['median_ms']:8.2f} ms  "
              f"(p10 {r['p10_ms']:.2f}, p90 {r['p90_ms']:.2f})")
    print(f"2-rank step / (2 x single-rank step) = {result['ratio_zero2_to_2x_single']:.2f}")
    print(tfd.format_table(two["ranks"]))


if __name__ == "__main__":
    main()
