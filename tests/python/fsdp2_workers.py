"""The processes of test_fsdp2.py: FSDP2's fully_shard on a 1-D CPU mesh, gloo on 127.0.0.1,
one process per rank (spawned as test_distributed.py spawns dist_workers.py's).

A scenario raises AssertionError with the numbers on a mismatch, which torch.multiprocessing
reports to the test with the rank's traceback. torch's own run (torch.optim.AdamW under the
same fully_shard) goes first: when it fails, FSDP2 does not run on this torch's CPU, and the
scenario writes why to ``args["skip"]`` for the test to skip with, instead of failing.
"""
import copy
import importlib
import os

import torch
import torch.distributed as dist
from torch import nn

from dist_workers import init
from tf_helpers import assert_close_to_scale
from tierflow.torch import OffloadAdamW

HYPER = {"lr": 1e-2, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.01}
ROWS = 8  # the global batch, split over the ranks


def fully_shard_function():
    """torch's fully_shard (torch.distributed.fsdp from 2.6, torch.distributed._composable.fsdp
    from 2.4), or None."""
    for name in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 -- torch 1.13's FSDP fails to import on Python 3.11
            continue
        if hasattr(module, "fully_shard"):
            return module.fully_shard
    return None


def why_not():
    """Why FSDP2 cannot run here (None: it can): the tests' skip reason."""
    if not dist.is_available() or not dist.is_gloo_available():
        return "torch.distributed with gloo is not available"
    if fully_shard_function() is None:
        return (f"torch {torch.__version__} has no fully_shard (FSDP2: torch >= 2.4, in "
                "torch.distributed._composable.fsdp, torch.distributed.fsdp from 2.6)")
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 4):
        return (f"torch {torch.__version__}'s fully_shard needs CUDA streams "
                "(FSDPCommContext.lazy_init); FSDP2 on CPU is torch >= 2.4")
    return None


class Uneven(nn.Module):
    """Layers of 7, 5 and 3 rows, which 2 ranks hold as 4 + 3, 3 + 2 and 2 + 1 rows (torch.chunk),
    and a 1-row head, of which rank 1 holds nothing."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(10, 7), nn.Linear(7, 5), nn.Linear(5, 3)
        self.head = nn.Linear(3, 1)

    def forward(self, x):
        return self.head(torch.tanh(self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))))


def cpu_offload_policy():
    """FSDP2's CPUOffloadPolicy (params, grads and optimizer state on the CPU, the step there),
    unpinned (a CPU mesh has no device to pin for), or None where this torch has none."""
    for module in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            return getattr(__import__(module, fromlist=["CPUOffloadPolicy"]),
                           "CPUOffloadPolicy")(pin_memory=False)
        except Exception:  # noqa: BLE001 -- torch 1.13's FSDP raises ValueError on import
            continue
    return None


def sharded_model(seed, offload_policy=None):
    """Uneven from the seed's init; each layer, then the root, fully_shard on a 1-D CPU mesh
    (named: on a machine with a GPU the default mesh would be CUDA's, which gloo cannot
    reduce), with @p offload_policy when given."""
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard = fully_shard_function()
    torch.manual_seed(seed)
    net = Uneven()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    extra = {} if offload_policy is None else {"offload_policy": offload_policy}
    for layer in (net.a, net.b, net.c, net.head):
        fully_shard(layer, mesh=mesh, **extra)
        if hasattr(layer, "set_force_sum_reduction_for_comms"):  # torch >= 2.8
            layer.set_force_sum_reduction_for_comms(True)  # gloo has no ReduceOp.AVG
    fully_shard(net, mesh=mesh, **extra)
    return net


def batches(seed, steps):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(ROWS, 10, generator=g), torch.randn(ROWS, 1, generator=g))
            for _ in range(steps)]


def train(net, opt, data, start, stop):
    rank, world = dist.get_rank(), dist.get_world_size()
    for x, y in data[start:stop]:
        opt.zero_grad()
        nn.functional.mse_loss(net(x.chunk(world)[rank]), y.chunk(world)[rank]).backward()
        opt.step()


def full(net):
    """Every param gathered whole (a collective: every rank calls it)."""
    with torch.no_grad():
        return [p.full_tensor().clone() for p in net.parameters()]


def local(tensor):
    with torch.no_grad():
        return tensor.to_local()


def assert_same(actual, expected, what):
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_close_to_scale(a, e, what=f"{what}: param {i}")


def check_layout(net, world):
    """The shards are the uneven ones meant: DTensor params, torch.chunk's rows per rank."""
    rank = dist.get_rank()
    for name, p in net.named_parameters():
        assert type(p).__name__ == "DTensor", (name, type(p))
        rows = p.shape[0]
        full_chunk = -(-rows // world)
        expected = max(0, min(full_chunk, rows - rank * full_chunk))
        assert local(p).shape[0] == expected, (name, rank, tuple(local(p).shape), expected)
    assert local(net.a.weight).shape[0] == (4 if rank == 0 else 3)
    assert local(net.head.weight).numel() == (3 if rank == 0 else 0)


def check_state(saved, torch_saved, net, k):
    """state_dict(): DTensors laid out like each param, equal to torch's AdamW's shard by
    shard, an empty shard's entry (its step, empty moments) too, as torch's."""
    for i, p in enumerate(net.parameters()):
        entry, theirs = saved["state"].get(i), torch_saved["state"].get(i)
        assert entry is not None and theirs is not None, (i, entry, theirs)
        assert float(entry["step"]) == float(theirs["step"]) == k, (i, entry["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            ours = entry[key]
            assert type(ours).__name__ == "DTensor", (i, key, type(ours))
            assert ours.placements == p.placements and ours.device_mesh == p.device_mesh
            assert ours.shape == p.shape and local(ours).shape == local(p).shape
            if local(p).numel() > 0:
                assert_close_to_scale(local(ours), local(theirs[key]), what=f"param {i} {key}")


def _skip_if_torch_fails(args, run):
    """run() with torch's own optimizer; its exception (FSDP2 unusable on this CPU) goes to
    the skip file, and None comes back."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001 -- reported to the test, which skips with it
        if dist.get_rank() == 0:
            with open(args["skip"], "w") as f:
                f.write(f"torch's own fully_shard + AdamW fails on CPU/gloo here: "
                        f"{type(e).__name__}: {str(e)[:300]}")
        return None


def scenario_train(rank, world, port, args):
    """fully_shard + OffloadAdamW against fully_shard + AdamW(foreach=False) from the same init
    and data: full params after k and n steps, the state at k; then resumed at k from the
    state_dict and from tierflow's per-rank file, each against the run that went on."""
    seed, steps, k = args["seed"], args["steps"], args["k"]
    init(rank, world, port, timeout_s=30.0)  # a rank that fails leaves the other waiting
    data = batches(seed, steps)

    def torch_run():
        ref = sharded_model(seed)
        ref_opt = torch.optim.AdamW(ref.parameters(), foreach=False, **HYPER)
        train(ref, ref_opt, data, 0, k)
        # a copy: torch's state_dict() holds the live state tensors, which the steps to n change
        at_k, state = full(ref), copy.deepcopy(ref_opt.state_dict())
        train(ref, ref_opt, data, k, steps)
        return at_k, state, full(ref)

    torch_result = _skip_if_torch_fails(args, torch_run)
    if torch_result is None:
        return
    ref_k, ref_state, ref_n = torch_result
    net = sharded_model(seed)
    check_layout(net, world)
    opt = OffloadAdamW(net.parameters(), **HYPER)
    train(net, opt, data, 0, k)
    assert_same(full(net), ref_k, f"rank {rank}/{world} after {k} steps")
    saved = opt.state_dict()
    check_state(saved, ref_state, net, k)
    path = os.path.join(args["dir"], f"rank{rank}.tierflow")
    opt.save(path)
    shards_k = [local(p).clone() for p in net.parameters()]
    train(net, opt, data, k, steps)
    went_on = full(net)
    assert_same(went_on, ref_n, f"rank {rank}/{world} after {steps} steps")
    assert any(float((a - b).abs().max()) > 0 for a, b in zip(went_on, ref_k)), "nothing moved"
    for how in ("load_state_dict", "load"):
        twin = sharded_model(seed + 1)  # other weights: the shards at k replace them
        with torch.no_grad():
            for p, shard in zip(twin.parameters(), shards_k):
                local(p).copy_(shard)
        twin_opt = OffloadAdamW(twin.parameters(), **HYPER)
        if how == "load":
            twin_opt.load(path)
        else:
            twin_opt.load_state_dict(saved)
        train(twin, twin_opt, data, k, steps)
        assert_same(full(twin), went_on, f"rank {rank}/{world} resumed by {how}")
    dist.destroy_process_group()


def _checkpoint_round_trip(seed, data, k, steps, directory, make_optimizer):
    """torch.distributed.checkpoint: save model and optimizer at k, go on to n; a fresh model
    and optimizer load it at k and go on to n. @returns (full params of the run that went on,
    of the resumed run)"""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)

    net = sharded_model(seed)
    opt = make_optimizer(net.parameters())
    train(net, opt, data, 0, k)
    # no grads, as after step(); zero_grad(): get_optimizer_state_dict then steps an
    # optimizer whose state reads false with zero grads, to create its state
    opt.zero_grad()
    os.makedirs(directory, exist_ok=True)
    dcp.save({"model": get_model_state_dict(net), "optim": get_optimizer_state_dict(net, opt)},
             checkpoint_id=directory)
    train(net, opt, data, k, steps)
    twin = sharded_model(seed + 1)
    twin_opt = make_optimizer(twin.parameters())
    state = {"model": get_model_state_dict(twin),
             "optim": get_optimizer_state_dict(twin, twin_opt)}
    dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(twin, state["model"])
    set_optimizer_state_dict(twin, twin_opt, state["optim"])
    train(twin, twin_opt, data, k, steps)
    return full(net), full(twin)


def scenario_checkpoint(rank, world, port, args):
    """get/set_optimizer_state_dict and torch.distributed.checkpoint's save/load with
    OffloadAdamW resume at k as the run that went on, as they do with torch's AdamW."""
    seed, steps, k = args["seed"], args["steps"], args["k"]
    init(rank, world, port, timeout_s=30.0)  # a rank that fails leaves the other waiting
    data = batches(seed, steps)
    torch_result = _skip_if_torch_fails(args, lambda: _checkpoint_round_trip(
        seed, data, k, steps, os.path.join(args["dir"], "torch"),
        lambda params: torch.optim.AdamW(params, foreach=False, **HYPER)))
    if torch_result is None:
        return
    went_on, resumed = _checkpoint_round_trip(
        seed, data, k, steps, os.path.join(args["dir"], "tierflow"),
        lambda params: OffloadAdamW(params, **HYPER))
    assert_same(went_on, torch_result[0], f"rank {rank}: OffloadAdamW against AdamW")
    assert_same(resumed, went_on, f"rank {rank}: resumed through torch.distributed.checkpoint")
    dist.destroy_process_group()


def scenario_cpu_offload(rank, world, port, args):
    """FSDP2 with CPUOffloadPolicy (the step on the CPU, the configuration whose slow step its
    users report): OffloadAdamW as that step against AdamW(foreach=False), the same shards,
    args["steps"] steps: the full params within 1e-5 of scale."""
    seed, steps = args["seed"], args["steps"]
    init(rank, world, port, timeout_s=30.0)
    data = batches(seed, steps)
    policy = cpu_offload_policy()

    def torch_run():
        ref = sharded_model(seed, cpu_offload_policy())
        ref_opt = torch.optim.AdamW(ref.parameters(), foreach=False, **HYPER)
        train(ref, ref_opt, data, 0, steps)
        return full(ref)

    ref_n = _skip_if_torch_fails(args, torch_run)
    if ref_n is None:
        return
    net = sharded_model(seed, policy)
    opt = OffloadAdamW(net.parameters(), **HYPER)
    train(net, opt, data, 0, steps)
    assert opt.mode == "cpu", opt.mode  # CPU shards: the host step, nothing over a link
    assert_same(full(net), ref_n, f"rank {rank}/{world} after {steps} steps, CPUOffloadPolicy")
    dist.destroy_process_group()
