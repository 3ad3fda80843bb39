"""The processes of test_distributed.py: gloo on 127.0.0.1, one process per rank.

Each scenario is one function ``scenario(rank, world, port, args)`` run in every rank; it
raises (AssertionError with the numbers) on a mismatch, which torch.multiprocessing reports to
the test with the rank's traceback.
"""
import copy
import datetime
import os
import socket
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import tierflow.distributed as tfd
from tierflow.torch import OffloadAdamW

ROWS = 12  # the global batch: divisible by 2 and 3 ranks
HYPER = {"lr": 1e-2, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.01}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(rank, world, port, timeout_s=60.0):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["LOCAL_RANK"] = str(rank)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


class Mlp(nn.Module):
    """Three linear layers: a real small model."""

    def __init__(self, width=24, hidden=48, out=6):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                                    nn.Tanh(), nn.Linear(hidden, out))

    def forward(self, x):
        return self.layers(x)


def batches(seed, steps):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(ROWS, 24, generator=g), torch.randn(ROWS, 6, generator=g))
            for _ in range(steps)]


def model(seed):
    torch.manual_seed(seed)
    return Mlp()


def reference_of(net):
    """(a copy of `net`, torch.optim.AdamW over it): train() gives it each step the grads of
    the run of `net`."""
    twin = copy.deepcopy(net)
    return twin, torch.optim.AdamW(twin.parameters(), **HYPER)


def step_reference(run, reference):
    """AdamW steps the grads the run's backward pass made (DDP's average of the ranks' chunks,
    or FSDP's shard of it). Not a single-process AdamW on the whole batch: the averaged grads
    differ from the whole batch's by rounding, and where a first grad is near eps Adam's
    g / (|g| + eps) turns that into up to 1e-3 of a param's scale (seed 1946513985 with 3
    ranks: 2.7e-4), a tail no tolerance bounds for every seed."""
    twin, twin_opt = reference
    twin_opt.zero_grad()
    for p, q in zip(run.parameters(), twin.parameters()):
        q.grad = None if p.grad is None else p.grad.detach().clone()
    twin_opt.step()


def train(ddp, opt, data, rank, world, start, stop, reference=None):
    """Steps start..stop of the run; a `reference` (reference_of) steps each one's grads too."""
    for x, y in data[start:stop]:
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x.chunk(world)[rank]), y.chunk(world)[rank]).backward()
        if reference is not None:
            step_reference(ddp, reference)
        opt.step()


def reference_params(reference):
    return [q.detach().clone() for q in reference[0].parameters()]


def assert_params(net, expected, what, tolerance=1e-5):
    """Within `tolerance` of each param's scale: the optimizers' rounding, as test_parity.py's
    (the reference stepped the same grads)."""
    for i, (p, q) in enumerate(zip(net.parameters(), expected)):
        scale = max(float(q.abs().max()), 1e-12)
        err = float((p.detach() - q).abs().max())
        assert err <= tolerance * scale, \
            f"{what}: param {i} max error {err:.3g} > {tolerance} * {scale:.3g}"


def zero(net, placement=None):
    extra = {"placement": placement} if placement is not None else {}
    return ZeroRedundancyOptimizer(net.parameters(), optimizer_class=OffloadAdamW, **HYPER,
                                   **extra)


def check_shards(opt, net, rank, world):
    """Each rank's OffloadAdamW holds its shard only; the shards cover the model once."""
    local = sum(p.numel() for g in opt.optim.param_groups for p in g["params"])
    counts = [None] * world
    dist.all_gather_object(counts, local)
    total = sum(p.numel() for p in net.parameters())
    assert sum(counts) == total and all(0 < c < total for c in counts), (counts, total)
    assert opt.optim.metrics()["adam"]["params"] == local


def check_metrics(opt, rank, world, total):
    records = tfd.gather_metrics(opt)
    if rank != 0:
        assert records is None
        return
    assert [r["rank"] for r in records] == list(range(world))
    assert sum(r["adam"]["params"] for r in records) == total
    assert all(r["adam"]["steps"] > 0 for r in records)
    table = tfd.format_table(records)
    lines = table.splitlines()
    assert lines[0].startswith("rank") and len(lines) == world + 1, table
    print(table)


def scenario_zero(rank, world, port, args):
    """ZeRO + DDP against AdamW given the same grads; checkpoint at k (with the reference's
    model and AdamW); resume it (ours, and args['resume_from'] when given, written by a run
    with another rank count), each resumed run against the reference resumed with it."""
    seed, steps, k, out = args["seed"], args["steps"], args["k"], args["checkpoint"]
    init(rank, world, port)
    data = batches(seed, steps)
    net = model(seed)
    reference = reference_of(net)
    ddp = DistributedDataParallel(net)
    opt = zero(ddp, placement=tfd.local_placement())
    train(ddp, opt, data, rank, world, 0, k, reference)
    assert_params(net, reference_params(reference), f"rank {rank}/{world} after {k} steps")
    opt.consolidate_state_dict(to=0)
    if rank == 0:
        torch.save({"model": net.state_dict(), "optim": opt.state_dict(),
                    "reference": {"model": reference[0].state_dict(),
                                  "optim": reference[1].state_dict()}}, out)
    dist.barrier()
    train(ddp, opt, data, rank, world, k, steps, reference)
    assert_params(net, reference_params(reference), f"rank {rank}/{world} after {steps} steps")
    check_shards(opt, net, rank, world)
    check_metrics(opt, rank, world, sum(p.numel() for p in net.parameters()))
    where = opt.optim.where()
    assert set(where["node_tiers"].values()) == {"dram0"}, where
    for source in [out] + ([args["resume_from"]] if args.get("resume_from") else []):
        saved = torch.load(source)
        fresh = model(seed + 1)  # other weights: the checkpoint must replace them
        fresh.load_state_dict(saved["model"])
        resumed_reference = reference_of(model(seed + 1))
        resumed_reference[0].load_state_dict(saved["reference"]["model"])
        resumed_reference[1].load_state_dict(saved["reference"]["optim"])
        fresh_ddp = DistributedDataParallel(fresh)
        resumed = zero(fresh_ddp)
        resumed.load_state_dict(saved["optim"])
        train(fresh_ddp, resumed, data, rank, world, k, steps, resumed_reference)
        assert_params(fresh, reference_params(resumed_reference),
                      f"rank {rank}/{world} resumed from {source}")
    dist.destroy_process_group()


def scenario_killed(rank, world, port, args):
    """Rank 1 dies (os._exit) after two steps; rank 0 keeps stepping and writes what it got."""
    init(rank, world, port, timeout_s=args["timeout_s"])
    data = batches(args["seed"], 50)
    net = model(args["seed"])
    ddp = DistributedDataParallel(net)
    opt = zero(ddp)
    train(ddp, opt, data, rank, world, 0, 2)
    if rank == 1:
        dist.barrier()
        os._exit(3)
    started = time.monotonic()
    try:
        dist.barrier()  # rank 1 may be gone before rank 0 is through it
        train(ddp, opt, data, rank, world, 2, 50)
        outcome = "no error"
    except Exception as e:  # noqa: BLE001 -- the outcome is the test's to judge
        outcome = f"{type(e).__name__}: {e}"
    with open(args["outcome"], "w") as f:
        f.write(f"{time.monotonic() - started:.3f}\n{outcome}\n")


def run_rank(scenario, rank, world, port, args):
    """Entry point of a manually started rank process (the killed-rank test)."""
    globals()[scenario](rank, world, port, args)


def scenario_fsdp(rank, world, port, args):
    """torch.distributed.fsdp.FullyShardedDataParallel (flat params) with OffloadAdamW over
    its flat shards, against AdamW over the flat shards of a twin FSDP model given the same
    grads."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    seed, steps = args["seed"], args["steps"]
    init(rank, world, port)
    try:
        net = FullyShardedDataParallel(model(seed))
    except RuntimeError as e:  # torch's own FSDP, before tierflow has a part: the test skips
        if rank == 0:
            with open(args["skip"], "w") as f:
                f.write(f"torch {torch.__version__}'s FullyShardedDataParallel fails on this "
                        f"CPU machine, before tierflow has a part: {str(e)[:200]}")
        dist.destroy_process_group()
        return
    twin = FullyShardedDataParallel(model(seed))
    reference = (twin, torch.optim.AdamW(twin.parameters(), **HYPER))
    opt = OffloadAdamW(net.parameters(), **HYPER)
    train(net, opt, batches(seed, steps), rank, world, 0, steps, reference)
    with FullyShardedDataParallel.summon_full_params(twin):
        expected = reference_params(reference)
    with FullyShardedDataParallel.summon_full_params(net):
        assert len(expected) == 6, [tuple(q.shape) for q in expected]
        assert_params(net, expected, f"FSDP rank {rank}/{world} after {steps} steps")
    dist.destroy_process_group()


def dtensor_api():
    """(init_device_mesh, distribute_tensor, Replicate, Shard) of torch >= 2.2 (DTensor in
    torch.distributed.tensor from 2.5, torch.distributed._tensor before), or None."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        try:
            from torch.distributed.tensor import Replicate, Shard, distribute_tensor
        except ImportError:
            from torch.distributed._tensor import Replicate, Shard, distribute_tensor
    except Exception:  # noqa: BLE001 -- torch 1.13 has neither
        return None
    return init_device_mesh, distribute_tensor, Replicate, Shard


def scenario_dtensor_refusals(rank, world, port, args):
    """DTensor params laid out other than FSDP2's Shard(0) on a 1-D mesh are refused, naming
    the param and the layout: Replicate, Shard(1), and a 2-D mesh (HSDP's)."""
    init_device_mesh, distribute_tensor, Replicate, Shard = dtensor_api()
    init(rank, world, port)
    torch.manual_seed(args["seed"])
    flat = init_device_mesh("cpu", (world,))
    square = init_device_mesh("cpu", (1, world), mesh_dim_names=("replicate", "shard"))
    cases = [(flat, [Replicate()], "placement Replicate"), (flat, [Shard(1)], "placement Shard"),
             (square, [Replicate(), Shard(0)], "on a 2-D mesh")]
    for mesh, placements, named in cases:
        param = nn.Parameter(distribute_tensor(torch.randn(4, 6), mesh, placements))
        try:
            OffloadAdamW([param], **HYPER)
        except TypeError as e:
            assert "param 0 (group 0, shape (4, 6)" in str(e) and named in str(e), e
            assert "DTensor" in str(e) and "docs/distributed.md" in str(e), e
        else:
            raise AssertionError(f"OffloadAdamW took a DTensor param with {placements}")
    dist.destroy_process_group()
