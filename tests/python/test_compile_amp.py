"""torch 2.x features a trainer turns on: torch.compile and CPU autocast with GradScaler
(issue 36). Both skip on a torch without them (Debian's 1.13), saying why."""
import pytest
import torch
from torch import nn

from tierflow.torch import OffloadAdamW, offload_parameters

from tf_helpers import assert_close_to_scale

needs_compile = pytest.mark.skipif(not hasattr(torch, "compile"),
                                   reason=f"torch {torch.__version__} has no torch.compile")


class Stack(nn.Module):
    def __init__(self, width=24, blocks=3):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        for b in self.blocks:
            x = torch.tanh(b(x))
        return self.head(x)


def _train(model, opt, data):
    for x, y in data:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return loss


def _data(gen, steps=4, width=24):
    return [(torch.randn(8, width, generator=gen), torch.randn(8, 4, generator=gen))
            for _ in range(steps)]


@needs_compile
def test_a_compiled_model_trains_with_offload_adamw_as_with_adamw(seed):
    gen = torch.Generator().manual_seed(seed)
    ours, theirs = Stack(), Stack()
    theirs.load_state_dict(ours.state_dict())
    data = _data(gen)
    # aot_eager: dynamo's graph capture and AOTAutograd without inductor's C++ build (fast)
    _train(torch.compile(ours, backend="aot_eager"), OffloadAdamW(ours.parameters(), lr=1e-2),
           data)
    _train(torch.compile(theirs, backend="aot_eager"),
           torch.optim.AdamW(theirs.parameters(), lr=1e-2, foreach=False), data)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        assert_close_to_scale(p.detach(), q.detach())


@needs_compile
def test_a_compiled_model_with_offloaded_weights_trains_as_without(seed):
    gen = torch.Generator().manual_seed(seed)
    offloaded, resident = Stack(), Stack()
    resident.load_state_dict(offloaded.state_dict())
    handle = offload_parameters(offloaded)  # before compiling: the hooks break the graph
    data = _data(gen)
    _train(torch.compile(offloaded, backend="aot_eager"),
           OffloadAdamW(offloaded.parameters(), lr=1e-2), data)
    _train(torch.compile(resident, backend="aot_eager"),
           OffloadAdamW(resident.parameters(), lr=1e-2), data)
    mine, ref = offloaded.state_dict(), resident.state_dict()
    for k in ref:
        assert torch.equal(mine[k], ref[k]), k
    handle.remove()


def _cpu_grad_scaler(init_scale):
    if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
        return None
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    return scaler if scaler.is_enabled() else None


@pytest.mark.skipif(_cpu_grad_scaler(2.0) is None,
                    reason=f"torch {torch.__version__} has no CPU GradScaler")
@pytest.mark.parametrize("overlap", ["none", "backward"])
def test_autocast_and_grad_scaler_on_cpu_skip_the_inf_step_as_adamw(seed, overlap):
    ours, theirs = Stack(), Stack()
    theirs.load_state_dict(ours.state_dict())
    opt = OffloadAdamW(ours.parameters(), lr=1e-2, mode="cpu", overlap=overlap)
    ref = torch.optim.AdamW(theirs.parameters(), lr=1e-2, foreach=False)
    runs = []
    for model, o in ((ours, opt), (theirs, ref)):
        scaler = _cpu_grad_scaler(2.0 ** 10)
        scales = []
        for i, (x, y) in enumerate(_data(torch.Generator().manual_seed(seed), steps=5)):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.mse_loss(model(x).float(), y)
            if i == 2:
                loss = loss * float("inf")  # an overflow: the scaler must skip this step
            scaler.scale(loss).backward()
            scaler.step(o)
            scaler.update()
            o.zero_grad()
            scales.append(scaler.get_scale())
        runs.append(scales)
    assert runs[0] == runs[1]  # the same steps skipped, the same scale after each
    assert runs[0][2] < runs[0][1]  # the inf step was found and skipped (the scale backed off)
    for p, q in zip(ours.parameters(), theirs.parameters()):
        assert_close_to_scale(p.detach(), q.detach())
