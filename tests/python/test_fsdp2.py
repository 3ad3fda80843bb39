"""tierflow.torch.OffloadAdamW over FSDP2 (fully_shard, torch >= 2.4): each rank steps the
shards it holds, against torch.optim.AdamW under the same fully_shard; 2 ranks, gloo on CPU
(127.0.0.1), a model whose rows 2 ranks share unevenly and a 1-row param one rank holds none
of. The ranks run in fsdp2_workers.py; one spawn per scenario. Written against torch's source:
torch 1.13 (this project's CPU machine) has no fully_shard, so the file skips there; the GPU
machine's torch runs it (bench/gpu_check.sh, step torch_cuda)."""
import os

import pytest
import torch
import torch.multiprocessing as mp

import dist_workers
import fsdp2_workers


pytestmark = pytest.mark.skipif(fsdp2_workers.why_not() is not None,
                                reason=str(fsdp2_workers.why_not()))

STEPS, K = 6, 3


def _spawn(scenario, seed, tmp_path):
    args = {"seed": seed, "steps": STEPS, "k": K, "dir": str(tmp_path),
            "skip": str(tmp_path / "skip.txt")}
    mp.spawn(scenario, args=(2, dist_workers.free_port(), args), nprocs=2)
    if os.path.exists(args["skip"]):
        with open(args["skip"]) as f:
            pytest.skip(f.read())


def test_fully_shard_shards_match_adamw_and_resume(dist_seed, tmp_path):
    _spawn(fsdp2_workers.scenario_train, dist_seed, tmp_path)


def test_torch_distributed_checkpoint_resumes_offload_adamw(dist_seed, tmp_path):
    _spawn(fsdp2_workers.scenario_checkpoint, dist_seed, tmp_path)


@pytest.mark.skipif(fsdp2_workers.cpu_offload_policy() is None,
                    reason=f"torch {torch.__version__} has no FSDP2 CPUOffloadPolicy")
def test_cpu_offload_policy_steps_as_adamw(dist_seed, tmp_path):
    args = {"seed": dist_seed, "steps": 20, "dir": str(tmp_path),
            "skip": str(tmp_path / "skip.txt")}
    mp.spawn(fsdp2_workers.scenario_cpu_offload, args=(2, dist_workers.free_port(), args),
             nprocs=2)
    if os.path.exists(args["skip"]):
        with open(args["skip"]) as f:
            pytest.skip(f.read())
