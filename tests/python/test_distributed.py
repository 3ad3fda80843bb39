"""tierflow.torch.OffloadAdamW under torch.distributed (gloo on 127.0.0.1): ZeroRedundancyOptimizer
under DistributedDataParallel against torch's AdamW given the same averaged grads, checkpoint and
resume (same and another rank count), rank-local placement, gathered metrics, a rank that dies.
The ranks run in dist_workers.py; one spawn per scenario."""
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import dist_workers
import tierflow.distributed as tfd

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

STEPS, K = 8, 4


@pytest.fixture(scope="module")
def two_rank_checkpoint(dist_seed, tmp_path_factory):
    """The 2-rank ZeRO run (checked against AdamW, resumed from its own checkpoint); its
    checkpoint at step K."""
    path = tmp_path_factory.mktemp("zero2") / "checkpoint.pt"
    args = {"seed": dist_seed, "steps": STEPS, "k": K, "checkpoint": str(path)}
    mp.spawn(dist_workers.scenario_zero, args=(2, dist_workers.free_port(), args), nprocs=2)
    return path


def test_zero_two_ranks_matches_adamw_and_resumes(two_rank_checkpoint):
    saved = torch.load(two_rank_checkpoint)
    state = saved["optim"]["state"]
    total = sum(1 for g in saved["optim"]["param_groups"] for _ in g["params"])
    # the consolidated state holds every param's moments, each rank's shard included
    assert sorted(state) == list(range(total)) and total == 6
    assert all(float(s["step"]) == K and float(s["exp_avg_sq"].abs().max()) > 0
               for s in state.values())


def test_zero_three_ranks_resumes_a_two_rank_checkpoint(dist_seed, two_rank_checkpoint,
                                                        tmp_path):
    args = {"seed": dist_seed, "steps": STEPS, "k": K, "checkpoint": str(tmp_path / "c3.pt"),
            "resume_from": str(two_rank_checkpoint)}
    mp.spawn(dist_workers.scenario_zero, args=(3, dist_workers.free_port(), args), nprocs=3)


def test_a_killed_rank_makes_the_other_fail_within_the_timeout(dist_seed, tmp_path):
    outcome = tmp_path / "outcome.txt"
    args = {"seed": dist_seed, "timeout_s": 5.0, "outcome": str(outcome)}
    port = dist_workers.free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=dist_workers.run_rank,
                         args=("scenario_killed", rank, 2, port, args)) for rank in range(2)]
    started = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=90)
    alive = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not alive, f"ranks still running after {time.monotonic() - started:.0f} s: a hang"
    assert procs[1].exitcode == 3
    elapsed, message = outcome.read_text().split("\n", 1)
    print(f"survivor: {message.strip()} after {elapsed} s")
    assert not message.startswith("no error"), "the survivor trained on alone"
    assert float(elapsed) < 30.0, f"the survivor took {elapsed} s to fail"
    assert message.startswith("RuntimeError"), message
    assert any(w in message.lower() for w in ("connection", "peer", "broken pipe", "timed out", "timeout")), \
        message


def test_local_node_round_robins_over_dram_nodes(tmp_path):
    node = tmp_path / "sys/devices/system/node"
    node.mkdir(parents=True)
    (node / "online").write_text("0-2\n")
    (node / "has_cpu").write_text("0-1\n")
    (node / "has_memory").write_text("0-2\n")  # node 2: CPU-less (CXL), never a rank's pick
    for i, cpus in enumerate(("0-3", "4-7", "")):
        (node / f"node{i}").mkdir()
        (node / f"node{i}/cpulist").write_text(cpus + "\n")
        (node / f"node{i}/meminfo").write_text(f"Node {i} MemTotal: 1048576 kB\n"
                                               f"Node {i} MemFree: 524288 kB\n")
    assert tfd.dram_nodes(tmp_path) == [0, 1]
    picks = [tfd.local_node(r, sysfs_root=tmp_path)[0] for r in range(5)]
    assert picks == [0, 1, 0, 1, 0]
    assert "round-robin" in tfd.local_node(3, sysfs_root=tmp_path)[1]
    assert tfd.local_placement(0, sysfs_root=tmp_path).startswith("optimizer_state=dram0,")
    assert "master_params=remote_dram," in tfd.local_placement(1, sysfs_root=tmp_path)
    with pytest.raises(ValueError, match="local_rank"):
        tfd.local_node(-1)


def test_local_placement_is_accepted_on_this_machine(seed):
    from tierflow.torch import OffloadAdamW
    p = torch.nn.Parameter(torch.randn(300))
    opt = OffloadAdamW([p], placement=tfd.local_placement(0))
    p.grad = torch.randn(300)
    opt.step()
    node, _ = tfd.local_node(0)
    assert str(node) in opt.where()["optimizer_state"]["nodes"]


def _fsdp_import_error():
    try:
        import torch.distributed.fsdp  # noqa: F401
    except Exception as e:  # noqa: BLE001 -- torch 1.13's FSDP fails on Python 3.11
        return f"{type(e).__name__}: {e}"
    return None


def test_fsdp_flat_params_match_adamw(dist_seed, tmp_path):
    error = _fsdp_import_error()
    if error is not None:
        pytest.skip(f"this torch's FSDP does not import ({torch.__version__}): {error[:160]}")
    args = {"seed": dist_seed, "steps": 4, "skip": str(tmp_path / "skip.txt")}
    mp.spawn(dist_workers.scenario_fsdp, args=(2, dist_workers.free_port(), args), nprocs=2)
    if os.path.exists(args["skip"]):
        with open(args["skip"]) as f:
            pytest.skip(f.read())  # torch >= 2.x: FSDP needs an accelerator (GPU machines run it)


def test_dtensor_params_of_other_layouts_are_refused_by_name(dist_seed):
    """FSDP2's Shard(0) shards are stepped (test_fsdp2.py); other DTensor layouts refused."""
    if dist_workers.dtensor_api() is None:
        pytest.skip(f"no DTensor / init_device_mesh in torch {torch.__version__} (torch >= 2.2)")
    mp.spawn(dist_workers.scenario_dtensor_refusals, args=(2, dist_workers.free_port(),
                                                           {"seed": dist_seed}), nprocs=2)


def test_state_a_wrapper_writes_into_optim_state_is_taken_at_the_next_step(seed):
    """What ZeroRedundancyOptimizer.load_state_dict does: optim.state[param] = torch's state."""
    from tierflow.torch import OffloadAdamW
    net, ref = dist_workers.Mlp(), dist_workers.Mlp()
    ref.load_state_dict(net.state_dict())
    torch_opt = torch.optim.AdamW(ref.parameters(), **dist_workers.HYPER)
    data = dist_workers.batches(seed, 6)
    for x, y in data[:3]:
        torch_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        torch_opt.step()
    net.load_state_dict(ref.state_dict())
    opt = OffloadAdamW(net.parameters(), **dist_workers.HYPER)
    for p, q in zip(net.parameters(), ref.parameters()):
        opt.state[p] = {k: v.clone() for k, v in torch_opt.state[q].items()}
    saved = opt.state_dict()["state"]
    assert float(saved[0]["step"]) == 3 and len(opt.state) == 0, "state_dict() takes it too"
    assert opt.state, "a stepped state reads true, as torch's (torch.distributed.checkpoint)"
    for x, y in data[3:]:
        for model, o in ((net, opt), (ref, torch_opt)):
            o.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            o.step()
    dist_workers.assert_params(net, [p.detach() for p in ref.parameters()], "after 3 more")
