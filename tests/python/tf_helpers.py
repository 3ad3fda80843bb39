"""A small real model, its param groups, and comparisons for the tierflow.torch tests."""
import copy

import torch
from torch import nn


class Net(nn.Module):
    """A transformer encoder layer and a linear head: the parity tests' model."""

    def __init__(self, width=32, heads=4, hidden=64, out=8):
        super().__init__()
        self.encoder = nn.TransformerEncoderLayer(width, heads, hidden, dropout=0.0,
                                                  batch_first=True)
        self.head = nn.Linear(width, out)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))


def batch(rows=16, tokens=6, width=32, out=8):
    return torch.randn(rows, tokens, width), torch.randn(rows, out)


def groups(model):
    """Two groups with different hyper-parameters."""
    return [
        {"params": list(model.encoder.parameters()), "lr": 2e-3, "weight_decay": 0.05},
        {"params": list(model.head.parameters()), "lr": 5e-3, "betas": (0.8, 0.99),
         "eps": 1e-6, "weight_decay": 0.0},
    ]


def schedule(opt):
    """A warm-up then decay, per step."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10) * 0.97 ** s)


def train_step(model, opt, data, reference=None):
    """Forward, backward and step; the grads are copied to `reference` = (model, opt) first,
    so both optimizers see the same grads. Returns the loss."""
    x, y = data
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    if reference is not None:
        ref_model, ref_opt = reference
        ref_opt.zero_grad()
        for p, q in zip(model.parameters(), ref_model.parameters()):
            q.grad = p.grad.clone()
        ref_opt.step()
    opt.step()
    return float(loss)


def teacher_batches(gen, n, rows, inputs=48, outputs=41):
    """Batches of a learnable task: a random teacher's outputs, plus a little noise."""
    teacher = torch.randn(inputs, outputs, generator=gen) / inputs ** 0.5
    out = []
    for _ in range(n):
        x = torch.randn(rows, inputs, generator=gen)
        out.append((x, torch.tanh(x @ teacher) + 0.05 * torch.randn(rows, outputs, generator=gen)))
    return out


def mse_backward(net, batch):
    """Fresh grads of the MSE loss of `net` on `batch`; the loss as a float."""
    x, y = batch
    for p in net.parameters():
        p.grad = None
    loss = nn.functional.mse_loss(net(x), y)
    loss.backward()
    return float(loss.detach())


def assert_close_to_scale(actual, expected, tolerance=1e-5, what=""):
    """Every element within `tolerance` of the expected tensor's scale (its largest |value|)."""
    scale = max(float(expected.abs().max()), 1e-12)
    err = float((actual.float() - expected.float()).abs().max())
    assert err <= tolerance * scale, f"{what}: max error {err:.3g} > {tolerance} * {scale:.3g}"


def clone(model):
    return copy.deepcopy(model)
