"""Clipping, non-finite grads, closures, zero_grad, metrics and where, GradScaler, the loader."""
import math
import os
import subprocess
import sys

import pytest
import torch
from tf_helpers import Net, assert_close_to_scale, batch, groups, train_step

import tierflow
from tierflow.torch import OffloadAdamW


def _params(*sizes):
    return [torch.randn(n, requires_grad=True) for n in sizes]


def test_max_grad_norm_matches_clip_grad_norm(seed):
    params = _params(300, 41, 9)
    reference = [p.detach().clone().requires_grad_() for p in params]
    opt = OffloadAdamW(params, lr=1e-2, max_grad_norm=1.0, mode="cpu")
    ref_opt = torch.optim.AdamW(reference, lr=1e-2, foreach=False)
    clipped = 0
    for step in range(20):
        scale = 3.0 if step % 2 else 0.01  # alternately above and below the max norm
        for p, q in zip(params, reference):
            p.grad = torch.randn_like(p) * scale
            q.grad = p.grad.clone()
        total = float(torch.nn.utils.clip_grad_norm_(reference, 1.0))
        ref_opt.step()
        opt.step()
        clipped += total > 1.0
        assert math.isclose(opt.last_grad_norm, total, rel_tol=1e-5)
    assert clipped == 10
    for i, (p, q) in enumerate(zip(params, reference)):
        assert_close_to_scale(p.detach(), q.detach(), what=f"param {i}")


def test_after_clip_grad_norm_outside(seed):
    params = _params(64, 8)
    reference = [p.detach().clone().requires_grad_() for p in params]
    opt = OffloadAdamW(params, lr=1e-2, mode="cpu")
    ref_opt = torch.optim.AdamW(reference, lr=1e-2, foreach=False)
    for _ in range(10):
        for p, q in zip(params, reference):
            p.grad = torch.randn_like(p) * 5
            q.grad = p.grad.clone()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        torch.nn.utils.clip_grad_norm_(reference, 0.5)
        opt.step()
        ref_opt.step()
        assert math.isclose(opt.last_grad_norm, 0.5, rel_tol=1e-4)
    for p, q in zip(params, reference):
        assert_close_to_scale(p.detach(), q.detach())


def test_non_finite_grads_skip_the_step(seed):
    params = _params(50, 20)
    reference = [p.detach().clone().requires_grad_() for p in params]
    opt = OffloadAdamW(params, lr=1e-2, mode="cpu")
    ref_opt = torch.optim.AdamW(reference, lr=1e-2, foreach=False)
    for step in range(6):
        for p in params:
            p.grad = torch.randn_like(p)
        if step == 3:
            params[1].grad[7] = float("inf") if seed % 2 else float("nan")
            before = [p.detach().clone() for p in params]
            state = opt.state_dict()["state"]
            opt.step()
            assert opt.last_step_applied is False
            assert not math.isfinite(opt.last_grad_norm)
            assert all(torch.equal(p, b) for p, b in zip(params, before))
            after = opt.state_dict()["state"]
            assert all(torch.equal(after[i]["exp_avg"], state[i]["exp_avg"]) for i in state)
            assert int(after[0]["step"]) == 3
            continue
        for p, q in zip(params, reference):
            q.grad = p.grad.clone()
        opt.step()
        ref_opt.step()
        assert opt.last_step_applied is True
    assert opt.metrics()["adam"]["skipped_steps"] == 1
    for p, q in zip(params, reference):
        assert_close_to_scale(p.detach(), q.detach())


def test_step_returns_the_closures_loss_with_grad_enabled(seed):
    model = Net()
    opt = OffloadAdamW(model.parameters(), mode="cpu")
    x, y = batch()

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    first = model.head.bias.detach().clone()
    with torch.no_grad():
        loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and loss.item() > 0
    assert not torch.equal(model.head.bias, first)
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_training_lowers_the_loss(seed):
    model = Net()
    opt = OffloadAdamW(groups(model), mode="cpu")
    data = batch()
    losses = [train_step(model, opt, data) for _ in range(40)]
    assert losses[-1] < 0.8 * losses[0], losses


def test_metrics_where_and_mode(seed):
    model = Net()
    opt = OffloadAdamW(model.parameters())  # mode "auto"
    train_step(model, opt, batch())
    m = opt.metrics()
    assert m["schema_version"] == 1
    adam = m["adam"]
    for key in ("mode", "mode_reason", "steps", "skipped_steps", "params", "state_bytes",
                "bytes_d2h", "bytes_h2d", "last_step_seconds"):
        assert key in adam, key
    assert adam["steps"] == 1
    assert adam["params"] == sum(p.numel() for p in model.parameters())
    # fp32 CPU params in cpu mode are their own masters (as torch's AdamW steps them): m and v
    assert opt.mode == "cpu" == adam["mode"]
    assert adam["state_bytes"] == 8 * adam["params"]
    assert adam["bytes_d2h"] == 0 and adam["bytes_h2d"] == 0  # nothing crosses the link
    assert isinstance(opt.mode_reason, str) and opt.mode_reason
    w = opt.where()
    assert w["page_bytes"] > 0
    for cls in ("master_params", "optimizer_state"):
        assert w[cls]["total_pages"] > 0
        assert sum(w[cls]["nodes"].values()) + w[cls]["untouched_pages"] <= w[cls]["total_pages"]
        assert set(w[cls]["nodes"]) <= set(w["node_tiers"])
    assert all(isinstance(t, str) and t for t in w["node_tiers"].values())


def _cpu_grad_scaler():
    if not hasattr(torch.amp, "GradScaler"):
        return None
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    return scaler if scaler.is_enabled() else None


@pytest.mark.skipif(_cpu_grad_scaler() is None,
                    reason=f"torch {torch.__version__} has no CPU GradScaler (CUDA test instead)")
def test_grad_scaler_on_cpu(seed):
    params = _params(30)
    reference = [p.detach().clone().requires_grad_() for p in params]
    opt = OffloadAdamW(params, lr=1e-2, mode="cpu")
    ref_opt = torch.optim.AdamW(reference, lr=1e-2, foreach=False)
    scaler = _cpu_grad_scaler()
    for _ in range(5):
        g = torch.randn(30)
        opt.zero_grad()
        scaler.scale((params[0] * g).sum()).backward()
        scaler.step(opt)
        scaler.update()
        reference[0].grad = g.clone()
        ref_opt.step()
    assert_close_to_scale(params[0].detach(), reference[0].detach())


def _import_with(library):
    env = dict(os.environ, TIERFLOW_LIBRARY=library)
    return subprocess.run([sys.executable, "-c", "import tierflow"], env=env,
                          capture_output=True, text=True, check=False)


def test_the_loader_says_what_it_tried(tmp_path):
    missing = str(tmp_path / "nowhere" / "libtierflow.so")
    result = _import_with(missing)
    assert result.returncode != 0 and "ImportError" in result.stderr and missing in result.stderr
    junk = tmp_path / "libjunk.so"
    junk.write_text("not a library")
    result = _import_with(str(junk))
    assert result.returncode != 0 and "cannot load" in result.stderr
    result = _import_with(tierflow.library_path())
    assert result.returncode == 0, result.stderr
    assert tierflow.library_version().split(".")[0] == "0"


def test_options_reach_the_library(seed):
    params = _params(5000, 300)
    reference = [p.detach().clone().requires_grad_() for p in params]
    opt = OffloadAdamW(params, mode="cpu", chunk_elements=1024, threads=1)
    ref_opt = torch.optim.AdamW(reference, foreach=False)
    for _ in range(3):
        for p, q in zip(params, reference):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        opt.step()
        ref_opt.step()
    adam = opt.metrics()["adam"]
    assert adam["threads"] == 1 and adam["chunks"] >= 5300 // 1024
    for p, q in zip(params, reference):
        assert_close_to_scale(p.detach(), q.detach())
