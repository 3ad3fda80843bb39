"""offload_parameters: a weight read or written outside its block's forward (issue 34, class 1).

On the emulated device (CPU) a param's placeholder outside its block's forward is the weight's
tier copy itself: a read (parameters(), named_parameters(), a tied head, a regularizer in the
loss, logging) is the weight, and an in-place write (or a new ``.data``) between passes is what
the next forward uses and what OffloadAdamW steps from. The reference is the same model without
offload, trained by the same optimizer on the same data with the same reads and writes: every
loss, weight and state bit-identical (torch.equal). A write while a pass is open is refused."""
import copy
import gc

import pytest
import torch
from torch import nn

from tierflow import _params
from tierflow.torch import OffloadAdamW, offload_parameters

from test_offload_parameters import WIDTH, Stack, data

OVERLAPS = ["none", "backward", "backward_publish"]


def loss_of(model, x, y):
    """The block stack's loss, plus what reads the weights outside the blocks' forward: a head
    tied to block 0's first weight and an L2 regularizer over model.parameters()."""
    tied = nn.functional.linear(x, model.blocks[0][0].weight).square().mean()
    penalty = sum(p.square().sum() for p in model.parameters())
    return nn.functional.mse_loss(model(x), y) + 1e-2 * tied + 1e-4 * penalty


def step(model, opt, x, y):
    opt.zero_grad()
    loss = loss_of(model, x, y)
    loss.backward()
    opt.step()
    return loss.detach()


def assert_same_reads(streamed, plain):
    """Every read of the weights outside a forward is the un-offloaded model's, bit for bit."""
    mine, theirs = list(streamed.named_parameters()), list(plain.named_parameters())
    assert [name for name, _ in mine] == [name for name, _ in theirs]
    for (name, p), (_, q) in zip(mine, theirs):
        assert torch.equal(p, q), name
        assert torch.equal(p.norm(), q.norm()), name  # logging
    assert torch.equal(sum(p.square().sum() for p in streamed.parameters()),
                       sum(q.square().sum() for q in plain.parameters()))


def assert_same_state(opt, ref_opt):
    mine, theirs = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    assert mine.keys() == theirs.keys()
    for key in theirs:
        for name, value in theirs[key].items():
            assert torch.equal(mine[key][name], value), (key, name)


def pair(overlap, blocks=4):
    plain = Stack(blocks=blocks)
    streamed = copy.deepcopy(plain)
    handle = offload_parameters(streamed, window=1)
    ref_opt = OffloadAdamW(plain.parameters(), lr=3e-3, mode="cpu", overlap=overlap)
    opt = OffloadAdamW(streamed.parameters(), lr=3e-3, mode="cpu", overlap=overlap)
    return plain, streamed, handle, ref_opt, opt


@pytest.mark.parametrize("overlap", OVERLAPS)
def test_reads_outside_forward_are_the_weights(seed, overlap):
    plain, streamed, handle, ref_opt, opt = pair(overlap)
    with handle:
        assert_same_reads(streamed, plain)
        for x, y in data(5):
            assert torch.equal(step(streamed, opt, x, y), step(plain, ref_opt, x, y))
            assert_same_reads(streamed, plain)
        assert_same_state(opt, ref_opt)
        if overlap != "none":
            assert opt.metrics()["adam"]["speculative_steps"] >= 3


def _scale(model):
    with torch.no_grad():
        model.blocks[1][0].weight.mul_(0.5)


def _init(model):
    torch.manual_seed(7)
    nn.init.normal_(model.blocks[2][0].weight, std=0.05)
    nn.init.zeros_(model.blocks[0][2].bias)


def _copy(model):
    with torch.no_grad():
        model.blocks[3][0].bias.copy_(torch.arange(WIDTH, dtype=torch.float32) / WIDTH)


def _new_data(model):
    p = model.blocks[1][2].weight
    p.data = p.detach() * 2 - 0.25


def _data_in_place(model):
    # through .data: no version records it; the step finds it by comparing with the master
    model.blocks[2][0].weight.data.mul_(0.5)
    model.blocks[0][2].bias.data[::3] = 0.125


def _vector(model):
    params = list(model.blocks[2].parameters())
    vector = nn.utils.parameters_to_vector(params)
    nn.utils.vector_to_parameters(vector.flip(0), params)


WRITES = {"no_grad mul_": _scale, "nn.init": _init, "copy_": _copy, "p.data = t": _new_data,
          "vector_to_parameters": _vector, "p.data.mul_()": _data_in_place}


@pytest.mark.parametrize("overlap", OVERLAPS)
@pytest.mark.parametrize("write", list(WRITES))
def test_a_write_outside_a_pass_is_what_training_goes_on_from(seed, overlap, write):
    """Before the first step and between steps: the next forward uses the written weight and
    the optimizer steps from it (it re-reads its master), as for the plain model."""
    plain, streamed, handle, ref_opt, opt = pair(overlap)
    with handle:
        for k, (x, y) in enumerate(data(6)):
            if k in (0, 3):
                WRITES[write](streamed)
                WRITES[write](plain)
                assert_same_reads(streamed, plain)
            assert torch.equal(step(streamed, opt, x, y), step(plain, ref_opt, x, y))
            assert_same_reads(streamed, plain)
        assert_same_state(opt, ref_opt)


@pytest.mark.parametrize("overlap", ["none", "backward_publish"])
@pytest.mark.parametrize("write", ["no_grad mul_", "p.data = t"])
def test_a_write_while_a_pass_is_open_is_refused(seed, overlap, write):
    """Between a forward and its backward the session may have staged the weight already: the
    backward refuses it before staging the block; the write is kept (as the plain model keeps
    it; torch's backward refuses a write to a weight it saved too) and training goes on."""
    plain, streamed, handle, ref_opt, opt = pair(overlap)
    batches = data(5)
    with handle:
        for x, y in batches[:2]:
            step(streamed, opt, x, y)
            step(plain, ref_opt, x, y)
        x, y = batches[2]
        opt.zero_grad()
        loss = loss_of(streamed, x, y)
        WRITES[write](streamed)
        with pytest.raises(RuntimeError, match=r"block 1 .* written while a pass was open"):
            loss.backward()
        WRITES[write](plain)
        assert_same_reads(streamed, plain)
        for x, y in batches[3:]:
            assert torch.equal(step(streamed, opt, x, y), step(plain, ref_opt, x, y))
            assert_same_reads(streamed, plain)
        assert_same_state(opt, ref_opt)


def test_a_write_after_a_forward_without_backward_is_exact(seed):
    """A forward whose backward never comes leaves its pass open; the next forward goes back
    and starts a new one, so a write in between is between passes."""
    plain, streamed, handle, ref_opt, opt = pair("none")
    with handle:
        x, y = data(1)[0]
        assert torch.equal(loss_of(streamed, x, y), loss_of(plain, x, y))  # no backward
        _scale(streamed)
        _scale(plain)
        for x, y in data(3):
            assert torch.equal(step(streamed, opt, x, y), step(plain, ref_opt, x, y))
        assert_same_reads(streamed, plain)


def test_a_placeholder_kept_after_remove_reads_the_weight(seed):
    """A tensor over a tier copy keeps the session's memory alive after remove()."""
    plain = Stack(blocks=3)
    streamed = copy.deepcopy(plain)
    handle = offload_parameters(streamed)
    kept = [p.detach() for p in streamed.blocks.parameters()]
    handle.remove()
    gc.collect()
    for w, q in zip(kept, plain.blocks.parameters()):
        assert torch.equal(w, q)
    del kept
    gc.collect()


def test_cuda_placeholders_read_nan_never_a_finite_wrong_number(seed, monkeypatch):
    """CUDA's placeholders (the tier copy is host memory its kernels cannot read), forced on the
    emulated device: a read outside the forward is NaN; state_dict() and training are exact."""
    monkeypatch.setattr(_params, "_NAN_PLACEHOLDERS", True)
    plain, streamed, handle, ref_opt, opt = pair("none")
    with handle:
        assert not torch.isfinite(sum(p.square().sum() for p in streamed.parameters()))
        for x, y in data(3):
            opt.zero_grad()
            ref_opt.zero_grad()
            loss = nn.functional.mse_loss(streamed(x), y)
            loss.backward()
            opt.step()
            ref_loss = nn.functional.mse_loss(plain(x), y)
            ref_loss.backward()
            ref_opt.step()
            assert torch.equal(loss, ref_loss)
        mine, theirs = streamed.state_dict(), plain.state_dict()
        assert all(torch.equal(mine[key], theirs[key]) for key in theirs)


@pytest.mark.parametrize("overlap", ["backward", "backward_publish"])
def test_the_reference_with_an_overlap_steps_from_a_write_as_without(seed, overlap):
    """The plain model's optimizer (the reference above): a param written in place between
    steps is not announced during the next backward (its update would start from the old
    master, and backward_publish would write it over the written values): step() re-reads the
    master first. Bit-identical to overlap="none"."""
    base = Stack(blocks=4)
    models = [copy.deepcopy(base) for _ in range(2)]
    opts = [OffloadAdamW(m.parameters(), lr=3e-3, mode="cpu", overlap=o)
            for m, o in zip(models, ["none", overlap])]
    for k, (x, y) in enumerate(data(6)):
        if k in (2, 4):
            for m in models:
                _scale(m)
                _copy(m)
        assert torch.equal(step(models[0], opts[0], x, y), step(models[1], opts[1], x, y))
    assert_same_reads(models[1], models[0])
    assert_same_state(opts[1], opts[0])
