"""OffloadAdamW(state_dtype="int8" | "bf16") under what trainers combine it with: ZeRO and DDP
(2 ranks, gloo on 127.0.0.1), FSDP2's DTensor shards (torch >= 2.4), offload_parameters.

A compressed step is deterministic (the fp32 update from the decoded moments), so each run is
checked bit for bit against one OffloadAdamW of the same state dtype given the same grads in one
process: over the whole model (ZeRO: each param is owned whole by one rank, so its int8 blocks
are the same; DDP: the ranks' averaged grads), over each rank's local shards alone (FSDP2: the
blocks of 256 and the 4096-element threshold are per local tensor), over the model not
offloaded (offload_parameters). Each comparison also checks that an fp32-state run on the same
grads ends elsewhere, so it could tell the state dtypes apart. The ranks run this module's
scenario_* functions (one spawn per test); they raise AssertionError with the numbers, which
torch.multiprocessing reports to the test with the rank's traceback."""
import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import dist_workers
import fsdp2_workers
from test_offload_parameters import Stack as OffloadedStack
from tierflow.torch import OffloadAdamW, offload_parameters

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

HYPER = {"lr": 1e-2, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.01}
STEPS = 5
ROWS = 12  # the global batch, split over the ranks
INT8_MIN = 4096  # params under this keep fp32 moments under int8


class Wide(nn.Module):
    """Three weights of >= 4096 elements, none a multiple of 256 (a short last int8 block), and
    biases under 4096 (fp32 moments under int8)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(48, 100), nn.Tanh(), nn.Linear(100, 100),
                                    nn.Tanh(), nn.Linear(100, 41))

    def forward(self, x):
        return self.layers(x)


def batches(seed, steps, width=48, out=41):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(ROWS, width, generator=g), torch.randn(ROWS, out, generator=g))
            for _ in range(steps)]


def twins(net, dtypes):
    """{state dtype: (a copy of net, OffloadAdamW of that state dtype over it)}: one process's
    optimizer over the whole model, stepped with the run's grads."""
    out = {}
    for dtype in dtypes:
        twin = copy.deepcopy(net)
        out[dtype] = (twin, OffloadAdamW(twin.parameters(), state_dtype=dtype, threads=1,
                                         **HYPER))
    return out


def train(run, params, opt, data, rank, world, references):
    """Each step: backward on this rank's rows, every reference steps a copy of the grads the
    run holds then (DDP's average; an FSDP2 shard's local grad), then the run steps."""
    for x, y in data:
        opt.zero_grad()
        nn.functional.mse_loss(run(x.chunk(world)[rank]), y.chunk(world)[rank]).backward()
        for twin_params, twin_opt in references:
            twin_opt.zero_grad()
            for p, q in zip(params(), twin_params):
                q.grad = p.grad.detach().clone()
            twin_opt.step()
        opt.step()


def assert_equal_params(actual, expected, what):
    for i, (a, e) in enumerate(zip(actual, expected)):
        a, e = a.detach(), e.detach()
        diff = float((a.float() - e.float()).abs().max()) if a.numel() else 0.0
        assert torch.equal(a, e), f"{what}: param {i} {tuple(a.shape)} max diff {diff:.3g}"


def assert_some_param_differs(actual, other, what):
    assert any(not torch.equal(a.detach(), b.detach()) for a, b in zip(actual, other)), \
        f"{what}: the fp32-state run ended on the same bits; the comparison cannot tell"


def assert_same_state(state, expected, what):
    """Two state_dict()["state"]s, bit for bit (the decoded moments, the step)."""
    assert sorted(state) == sorted(expected), (what, sorted(state), sorted(expected))
    for i in expected:
        assert float(state[i]["step"]) == float(expected[i]["step"]), (what, i)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(state[i][key], expected[i][key]), f"{what}: param {i} {key}"


def assert_same_across_ranks(params, world, what):
    mine = [p.detach().clone() for p in params]
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    for r, theirs in enumerate(everyone):
        assert_equal_params(theirs, mine, f"{what}: rank {r} against rank {dist.get_rank()}")


# --- the ranks ------------------------------------------------------------------------------
def scenario_zero(rank, world, port, args):
    """ZeroRedundancyOptimizer(optimizer_class=OffloadAdamW, state_dtype=...) under DDP against
    one OffloadAdamW of that state dtype over the whole model given the same averaged grads:
    params bit for bit on every rank, the consolidated state bit for bit on rank 0."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    seed, dtype = args["seed"], args["state_dtype"]
    dist_workers.init(rank, world, port)
    torch.manual_seed(seed)
    net = Wide()
    references = twins(net, (dtype, "fp32"))
    ddp = DistributedDataParallel(net)
    opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=OffloadAdamW,
                                  state_dtype=dtype, threads=1, **HYPER)
    owned = [p for g in opt.optim.param_groups for p in g["params"]]
    # the partition is a strict part of the model, with an int8-sized param on each rank
    assert 0 < len(owned) < len(list(net.parameters())), len(owned)
    assert any(p.numel() >= INT8_MIN for p in owned), [p.numel() for p in owned]
    train(ddp, net.parameters, opt, batches(seed, args["steps"]), rank, world,
          [(list(t.parameters()), o) for t, o in references.values()])
    twin, twin_opt = references[dtype]
    assert_equal_params(net.parameters(), twin.parameters(),
                        f"ZeRO rank {rank}/{world}, state_dtype {dtype}")
    assert_some_param_differs(twin.parameters(), references["fp32"][0].parameters(),
                              f"ZeRO rank {rank}, state_dtype {dtype}")
    opt.consolidate_state_dict(to=0)
    if rank == 0:
        assert_same_state(opt.state_dict()["state"], twin_opt.state_dict()["state"],
                          f"ZeRO consolidated state, state_dtype {dtype}")
    dist.destroy_process_group()


def scenario_ddp(rank, world, port, args):
    """DDP with OffloadAdamW(state_dtype=...) on each rank: the ranks' params are the same bits,
    those of one OffloadAdamW given the averaged grads; so is each rank's state."""
    from torch.nn.parallel import DistributedDataParallel

    seed, dtype = args["seed"], args["state_dtype"]
    dist_workers.init(rank, world, port)
    torch.manual_seed(seed)
    net = Wide()
    references = twins(net, (dtype, "fp32"))
    ddp = DistributedDataParallel(net)
    opt = OffloadAdamW(ddp.parameters(), state_dtype=dtype, threads=1, **HYPER)
    train(ddp, net.parameters, opt, batches(seed, args["steps"]), rank, world,
          [(list(t.parameters()), o) for t, o in references.values()])
    twin, twin_opt = references[dtype]
    assert_same_across_ranks(net.parameters(), world, f"DDP, state_dtype {dtype}")
    assert_equal_params(net.parameters(), twin.parameters(),
                        f"DDP rank {rank}/{world}, state_dtype {dtype}")
    assert_same_state(opt.state_dict()["state"], twin_opt.state_dict()["state"],
                      f"DDP rank {rank}, state_dtype {dtype}")
    assert_some_param_differs(twin.parameters(), references["fp32"][0].parameters(),
                              f"DDP rank {rank}, state_dtype {dtype}")
    dist.destroy_process_group()


class Sharded(nn.Module):
    """For 2 ranks under fully_shard: `a`'s weight (130 x 64) is 65 rows = 4160 elements per
    rank (int8 locally: 16 blocks and a 64-element tail); `b`'s (50 x 130 = 6500, int8-sized
    whole) is 25 rows = 3250 per rank (fp32 moments locally); `head`'s 3 rows are 2 + 1."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(64, 130), nn.Linear(130, 50), nn.Linear(50, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x)))))


def sharded(seed):
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard = fsdp2_workers.fully_shard_function()
    torch.manual_seed(seed)
    net = Sharded()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in (net.a, net.b, net.head):
        fully_shard(layer, mesh=mesh)
        if hasattr(layer, "set_force_sum_reduction_for_comms"):  # torch >= 2.8
            layer.set_force_sum_reduction_for_comms(True)  # gloo has no ReduceOp.AVG
    fully_shard(net, mesh=mesh)
    return net


def scenario_fsdp2(rank, world, port, args):
    """fully_shard + OffloadAdamW(state_dtype="int8"): each rank's local shards after n steps
    are the bits of OffloadAdamW(state_dtype="int8") over plain copies of those shards given the
    same local grads, and so is the state; state_dict()'s DTensors gather whole."""
    seed, steps, dtype = args["seed"], args["steps"], args["state_dtype"]
    dist_workers.init(rank, world, port, timeout_s=30.0)
    data = batches(seed, steps, width=64, out=3)
    try:
        net = sharded(seed)
        torch_opt = torch.optim.AdamW(net.parameters(), foreach=False, **HYPER)
        train(net, net.parameters, torch_opt, data[:1], rank, world, [])
    except Exception as e:  # noqa: BLE001 -- torch's own FSDP2 on this CPU: the test skips
        if rank == 0:
            with open(args["skip"], "w") as f:
                f.write(f"torch's own fully_shard + AdamW fails on CPU/gloo here: "
                        f"{type(e).__name__}: {str(e)[:300]}")
        return
    net = sharded(seed)
    shards = [fsdp2_workers.local(p) for p in net.parameters()]
    numels = [s.numel() for s in shards]
    head_rows = 2 if rank == 0 else 1  # torch.chunk's 3 rows over 2 ranks
    assert numels == [65 * 64, 65, 25 * 130, 25, head_rows * 50, head_rows], numels
    assert numels[0] >= INT8_MIN > numels[2]  # a's shard int8 here, b's fp32 (whole: int8)
    references = {}
    for d in (dtype, "fp32"):
        plain = [nn.Parameter(s.clone()) for s in shards]
        references[d] = (plain, OffloadAdamW(plain, state_dtype=d, threads=1, **HYPER))

    def local_params():
        return [_LocalGrad(p) for p in net.parameters()]

    opt = OffloadAdamW(net.parameters(), state_dtype=dtype, threads=1, **HYPER)
    train(net, local_params, opt, data, rank, world, list(references.values()))
    plain, plain_opt = references[dtype]
    mine = [fsdp2_workers.local(p) for p in net.parameters()]
    assert_equal_params(mine, plain, f"FSDP2 rank {rank}/{world} local shards after {steps}")
    assert_some_param_differs(plain, references["fp32"][0], f"FSDP2 rank {rank}")
    saved, expected = opt.state_dict()["state"], plain_opt.state_dict()["state"]
    local_state = {i: {k: (fsdp2_workers.local(v) if k != "step" else v) for k, v in e.items()}
                   for i, e in saved.items()}
    assert_same_state({i: e for i, e in local_state.items() if i in expected}, expected,
                      f"FSDP2 rank {rank}: the state of the local shards")
    for i, p in enumerate(net.parameters()):
        for key in ("exp_avg", "exp_avg_sq"):
            t = saved[i][key]
            assert type(t).__name__ == "DTensor" and t.shape == p.shape, (i, key, type(t))
            whole = t.full_tensor()  # a collective: every rank gathers every param's state
            rows = whole.shape[0]
            chunk = -(-rows // world)
            mine_rows = whole[rank * chunk:min(rows, (rank + 1) * chunk)]
            assert whole.shape == p.shape, (i, key, tuple(whole.shape))
            if i in expected:
                assert torch.equal(mine_rows, expected[i][key].view_as(mine_rows)), (i, key)
    dist.destroy_process_group()


class _LocalGrad:
    """A DTensor param seen as its local shard and its local grad (what the reference steps)."""

    def __init__(self, param):
        self.grad = fsdp2_workers.local(param.grad)


def _spawn(scenario, args, tmp_path):
    args = {**args, "skip": str(tmp_path / "skip.txt")}
    mp.spawn(scenario, args=(2, dist_workers.free_port(), args), nprocs=2)
    if os.path.exists(args["skip"]):
        with open(args["skip"]) as f:
            pytest.skip(f.read())


# --- the tests ------------------------------------------------------------------------------
@pytest.mark.parametrize("state_dtype", ["int8", "bf16"])
def test_zero_params_are_the_bits_of_one_optimizer(dist_seed, tmp_path, state_dtype):
    _spawn(scenario_zero, {"seed": dist_seed, "steps": STEPS, "state_dtype": state_dtype},
           tmp_path)


def test_ddp_ranks_hold_the_bits_of_one_optimizer_on_the_averaged_grads(dist_seed, tmp_path):
    _spawn(scenario_ddp, {"seed": dist_seed, "steps": STEPS, "state_dtype": "int8"}, tmp_path)


@pytest.mark.skipif(fsdp2_workers.why_not() is not None,
                    reason=str(fsdp2_workers.why_not()))
def test_fsdp2_local_shards_are_the_bits_of_one_optimizer_over_them(dist_seed, tmp_path):
    _spawn(scenario_fsdp2, {"seed": dist_seed, "steps": STEPS, "state_dtype": "int8"}, tmp_path)


def stack():
    """test_offload_parameters' model: 3 blocks of 72 x 72 weights (5184 elements each, int8:
    20 blocks of 256 and a 64-element tail), a head outside them."""
    return OffloadedStack(blocks=3, width=72)


def _train_alone(model, opt, data):
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def test_offload_parameters_with_int8_state_is_the_run_not_offloaded(seed):
    plain = stack()
    streamed, fp32 = copy.deepcopy(plain), copy.deepcopy(plain)
    data = [(torch.randn(8, 72), torch.randn(8, 4)) for _ in range(STEPS)]
    plain_opt = OffloadAdamW(plain.parameters(), state_dtype="int8", **HYPER)
    fp32_opt = OffloadAdamW(fp32.parameters(), state_dtype="fp32", **HYPER)
    with offload_parameters(streamed, window=1):
        opt = OffloadAdamW(streamed.parameters(), state_dtype="int8", **HYPER)
        losses = _train_alone(streamed, opt, data)
        weights = streamed.state_dict()  # the real weights (copies of the tier copies)
        state = opt.state_dict()["state"]
    assert torch.equal(losses, _train_alone(plain, plain_opt, data))
    for name, value in plain.state_dict().items():
        assert torch.equal(weights[name], value), name
    assert_equal_params(streamed.parameters(), plain.parameters(), "after remove()")
    assert_same_state(state, plain_opt.state_dict()["state"], "offloaded against not")
    _train_alone(fp32, fp32_opt, data)
    assert_some_param_differs(plain.parameters(), fp32.parameters(), "offload_parameters")


def test_offload_parameters_with_a_remainder_master_keeps_the_fp32_masters_bits(seed):
    # bf16 weights under offload_parameters: their tier copies hold the master's high half.
    # The same grads go to both runs (a forward would see the weights' rounding, which differs
    # at exact ties), so the masters must agree bit for bit.
    nets = [stack().to(torch.bfloat16) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    handles = [offload_parameters(net, window=0) for net in nets]
    try:
        opts = [OffloadAdamW(net.parameters(), state_dtype="int8", master=master, **HYPER)
                for net, master in zip(nets, ("fp32", "remainder"))]
        for _ in range(STEPS):
            grads = [torch.randn(p.shape).to(p.dtype) for p in nets[0].parameters()]
            for net, opt in zip(nets, opts):
                for p, g in zip(net.parameters(), grads):
                    p.grad = g.clone()
                opt.step()
        states = [opt.state_dict()["state"] for opt in opts]
        weights = [net.state_dict() for net in nets]
        held = [opt.metrics()["adam"]["state_bytes"] for opt in opts]
    finally:
        for handle in handles:
            handle.remove()
    # The split is there: 2 B of master per element instead of 4 (the weights alone could not
    # tell, both roundings agree off exact ties).
    assert held[0] - held[1] == 2 * sum(p.numel() for p in nets[0].parameters()), held
    assert_same_state(states[1], states[0], "remainder against fp32 master")
    for i in states[0]:
        assert torch.equal(states[1][i]["master"], states[0][i]["master"]), f"param {i} master"
    names = [name for name, _ in nets[0].named_parameters()]
    for i, name in enumerate(names):
        master = states[0][i]["master"]
        assert not torch.equal(master, master.to(torch.bfloat16).float()), name  # it moved
        # The fp32 master's weight rounds to even; the remainder's is the high half, ties away.
        assert torch.equal(weights[0][name], master.to(torch.bfloat16).view_as(weights[0][name]))
        bits = master.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        high = ((bits + 0x8000) >> 16) & 0xFFFF
        away = torch.where(high >= 0x8000, high - 0x10000, high).to(torch.int16)
        assert torch.equal(weights[1][name].view(torch.int16).flatten(), away.flatten()), name
