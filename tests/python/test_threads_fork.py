"""OffloadAdamW and offload_parameters under threads and os.fork: the first step from several
threads at once builds one C optimizer (each thread's step applied or refused, none lost or
torn), and a child process gets a clear error for the parent's objects and working new ones,
never a hang."""
import os
import threading
import time

import pytest
import torch
from torch import nn

from tierflow import _capi
from tierflow.torch import OffloadAdamW, offload_parameters


def _params(gen, shapes=((300,), (17, 9), (5000,))):
    return [nn.Parameter(torch.randn(*s, generator=gen)) for s in shapes]


def _with_grads(params, gen):
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)


def test_the_first_step_from_several_threads_builds_one_optimizer(seed):
    gen = torch.Generator().manual_seed(seed)
    for round_ in range(5):
        params = _params(gen)
        _with_grads(params, gen)
        initial = [p.detach().clone() for p in params]
        opt = OffloadAdamW(params, lr=1e-2)
        barrier = threading.Barrier(6)
        outcomes = []

        def first_step():
            barrier.wait()
            try:
                opt.step()
                outcomes.append("applied")
            except _capi.BusyError:
                outcomes.append("busy")
            except BaseException as e:  # anything else is the bug under test
                outcomes.append(f"{type(e).__name__}: {e}")

        threads = [threading.Thread(target=first_step) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a step hung"
        assert all(o in ("applied", "busy") for o in outcomes), outcomes
        applied = outcomes.count("applied")
        assert applied >= 1
        # The state is that of `applied` steps, in order: the same as one thread taking them.
        ref_params = [nn.Parameter(t.clone()) for t in initial]
        for rp, p in zip(ref_params, params):
            rp.grad = p.grad.clone()
        ref = OffloadAdamW(ref_params, lr=1e-2)
        for _ in range(applied):
            ref.step()
        for p, q in zip(params, ref_params):
            assert torch.equal(p.detach(), q.detach()), f"round {round_}: {outcomes}"
        assert opt.state_dict()["state"][0]["step"] == applied


def _two_steps(values, grads):
    """Params holding ``values`` after two steps of a new OffloadAdamW with ``grads``."""
    params = [nn.Parameter(t.clone()) for t in values]
    opt = OffloadAdamW(params, lr=1e-2)
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()
    opt.step()
    return params


def _wait(pid, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


@pytest.mark.parametrize("overlap", ["none", "backward"])
def test_a_forked_child_gets_a_clear_error_and_new_objects_work(seed, overlap, tmp_path):
    gen = torch.Generator().manual_seed(seed)
    params = _params(gen)
    opt = OffloadAdamW(params, lr=1e-2, overlap=overlap)
    _with_grads(params, gen)
    opt.step()  # the C optimizer and the device's threads exist now
    fresh = [p.detach().clone() for p in params]
    grads = [p.grad.clone() for p in params]
    # What a new optimizer in the child must produce: the same steps made here.
    expected = _two_steps(fresh, grads)
    model = nn.Sequential(*(nn.Linear(24, 24) for _ in range(3)))
    plain_weights = [p.detach().clone() for p in model.parameters()]
    handle = offload_parameters(model, blocks=list(model), window=1)
    report = tmp_path / "child.txt"
    pid = os.fork()
    if pid == 0:  # the child: report in a file, leave with os._exit (no pytest teardown)
        code = 1
        try:
            lines = []
            try:
                opt.step()
                lines.append("old optimizer stepped")
            except RuntimeError as e:
                lines.append("refused" if "os.fork" in str(e) else f"other: {e}")
            try:
                model(torch.randn(2, 24))
                lines.append("old handle ran")
            except RuntimeError as e:
                lines.append("refused" if "os.fork" in str(e) else f"other: {e}")
            handle.remove()  # puts the weights back from the tier copies, no device call
            same = all(torch.equal(p.detach(), q) for p, q in zip(model.parameters(),
                                                                 plain_weights))
            lines.append("weights back" if same else "weights differ")
            mine = _two_steps(fresh, grads)  # a new optimizer, made here
            same = all(torch.equal(a.detach(), b.detach()) for a, b in zip(mine, expected))
            lines.append("new optimizer exact" if same else "new optimizer differs")
            report.write_text("\n".join(lines))
            code = 0
        finally:
            os._exit(code)
    code = _wait(pid, 60)
    assert code is not None, "the child hung"
    assert code == 0
    assert report.read_text().split("\n") == [
        "refused", "refused", "weights back", "new optimizer exact"]
    # The parent's objects are untouched by the child.
    opt.step()
    handle.remove()
    assert all(torch.equal(p.detach(), q) for p, q in zip(model.parameters(), plain_weights))
