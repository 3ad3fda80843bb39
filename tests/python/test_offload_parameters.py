"""offload_parameters: weights in a host tier, streamed through HBM staging block by block.

The reference is the same model without offload, trained by the same optimizer on the same
data: streaming changes where the weights are, never what is computed, so losses, grads and
weights must be bit-identical."""
import copy

import pytest
import torch
from torch import nn

from tierflow import _capi
from tierflow._params import weight_of
from tierflow.torch import OffloadAdamW, offload_parameters

WIDTH = 48


class Stack(nn.Module):
    """Blocks in a ModuleList (the default blocks) and a head outside it."""

    def __init__(self, blocks=6, width=WIDTH):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width))
            for _ in range(blocks))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def block_bytes(model):
    return [sum(p.numel() * p.element_size() for p in b.parameters()) for b in model.blocks]


def train(model, opt, data):
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def data(steps, rows=8):
    return [(torch.randn(rows, WIDTH), torch.randn(rows, 4)) for _ in range(steps)]


@pytest.mark.parametrize("window,overlap", [(0, "none"), (1, "none"), (3, "none"),
                                            (2, "backward_publish")])
def test_training_is_bit_identical_and_staging_stays_in_budget(seed, window, overlap):
    plain = Stack()
    streamed = copy.deepcopy(plain)
    budget = (window + 1) * max(block_bytes(plain)) + 256 * 8  # slots are 256-byte aligned
    handle = offload_parameters(streamed, window=window, hbm_budget=budget)
    ref_opt = OffloadAdamW(plain.parameters(), lr=3e-3, mode="cpu")
    # backward_publish: each block's tier copy gets its new weights during the backward pass
    opt = OffloadAdamW(streamed.parameters(), lr=3e-3, overlap=overlap)
    batches = data(6)
    assert torch.equal(torch.stack(train(streamed, opt, batches)),
                       torch.stack(train(plain, ref_opt, batches)))
    m = handle.metrics()
    total = sum(block_bytes(plain))
    assert m["blocks"] == 6 and m["offloaded_bytes"] == total
    assert 0 < m["hbm_staging_peak_bytes"] <= budget
    assert m["hbm_staging_peak_bytes"] < total  # never the whole model
    # every pass moved every block in at least once (forward) and wrote nothing back
    assert m["bytes_in"] >= 6 * total and m["bytes_out"] == 0
    # each pass ends with a restart: nothing of the next pass is fetched ahead, only to be dropped
    sched = _capi.json_call("tf_session_metrics_json", handle._session)["scheduler"]
    assert sched["bytes_discarded"] == 0
    if overlap != "none":
        assert opt.metrics()["adam"]["speculative_steps"] >= 4
    assert opt.mode == "cpu"
    handle.remove()
    for p, q in zip(streamed.parameters(), plain.parameters()):
        assert torch.equal(p, q) and p.is_contiguous()


def test_eval_without_grad_and_a_new_forward_without_backward(seed):
    plain = Stack(blocks=4)
    streamed = copy.deepcopy(plain)
    with offload_parameters(streamed, window=2):
        x = torch.randn(5, WIDTH)
        with torch.no_grad():
            assert torch.equal(streamed(x), plain(x))
        streamed(x)  # a forward whose backward never comes
        y = torch.randn(3, WIDTH, requires_grad=True)
        out = streamed(y).square().sum()
        out.backward()
        y2 = y.detach().clone().requires_grad_()
        plain(y2).square().sum().backward()
        assert torch.equal(y.grad, y2.grad)  # the input grad used every block's weights
        for p, q in zip(streamed.parameters(), plain.parameters()):
            assert torch.equal(p.grad, q.grad)
    for p in streamed.parameters():
        assert weight_of(p) is None


def test_placeholders_keep_shapes_and_the_handle_refuses_after_remove(seed):
    model = Stack(blocks=3)
    plain = copy.deepcopy(model)
    shapes = [p.shape for p in model.parameters()]
    handle = offload_parameters(model, blocks=list(model.blocks)[:2])
    assert [p.shape for p in model.parameters()] == shapes
    offloaded = [p for b in list(model.blocks)[:2] for p in b.parameters()]
    homes = set(handle._homes)
    assert all(p.data_ptr() in homes for p in offloaded)  # CPU: the tier copies themselves
    assert all(p.is_contiguous() for p in model.blocks[2].parameters())  # not offloaded
    # Read outside the block's forward (a regularizer, logging), an offloaded weight is itself
    # (test_offloaded_reads.py has the rest; CUDA's NaN placeholders there too).
    penalty = sum(p.float().square().sum() for p in model.parameters())
    assert torch.equal(penalty, sum(p.float().square().sum() for p in plain.parameters()))
    handle.remove()
    handle.remove()  # idempotent
    with pytest.raises(RuntimeError, match="removed"):
        handle.metrics()


def test_refusals_name_what_is_wrong(seed):
    model = Stack(blocks=2)
    with pytest.raises(ValueError, match="window must be an int >= 0"):
        offload_parameters(model, window=-1)
    with pytest.raises(ValueError, match="hbm_budget must be a byte count > 0"):
        offload_parameters(model, hbm_budget=0)
    with pytest.raises(ValueError, match="share a param"):
        offload_parameters(model, blocks=[model.blocks[0], model.blocks[0][0]])
    with pytest.raises(TypeError, match="not an nn.Module"):
        offload_parameters(model, blocks=[model.blocks[0], "head"])
    with pytest.raises(ValueError, match="hold no params"):
        offload_parameters(model, blocks=[nn.GELU()])
    with pytest.raises(ValueError):  # the largest block does not fit
        offload_parameters(model, hbm_budget=64)
    assert all(weight_of(p) is None for p in model.parameters())  # nothing moved
    with offload_parameters(model):
        with pytest.raises(ValueError, match="offloaded already"):
            offload_parameters(model)
        with pytest.raises(ValueError, match="mode='streamed'"):
            OffloadAdamW(model.parameters(), mode="streamed").step()


def test_metrics_name_the_tier_and_each_pass(seed):
    model = Stack(blocks=3)
    total = sum(block_bytes(model))
    with offload_parameters(model, window=1) as handle:
        m = handle.metrics()
        assert m["passes"] == 0 and m["last_pass"] is None
        assert sum(m["tiers"].values()) == total  # every weight is in some named tier
        assert all(isinstance(t, str) and t for t in m["tiers"])
        opt = OffloadAdamW(model.parameters(), lr=1e-3)
        train(model, opt, data(2))
        m = handle.metrics()
        assert m["passes"] == 2
        last = m["last_pass"]
        # a pass with grad stages each block forward and again backward (but the last,
        # whose forward staging is still there): between total and 2 x total bytes
        assert total <= last["bytes_in"] <= 2 * total
        assert last["compute_s"] > 0 and last["stall_s"] >= 0
        assert last["elapsed_s"] >= last["compute_s"]
        assert m["bytes_in"] >= 2 * last["bytes_in"] - 1


def test_tied_weights_and_changed_params_are_refused(seed):
    model = Stack(blocks=2)
    model.extra = nn.Linear(WIDTH, WIDTH)
    model.extra.weight = model.blocks[1][0].weight  # tied with a module outside the blocks
    with pytest.raises(ValueError, match=r"extra\.weight .*tied weights"):
        offload_parameters(model)
    assert all(weight_of(p) is None for p in model.parameters())
    # listing the tied module as part of the block is fine
    with offload_parameters(model, blocks=[model.blocks[0]]):
        pass

    model = Stack(blocks=2)
    x = torch.randn(4, WIDTH)
    with offload_parameters(model):
        model.blocks[0][0].weight = nn.Parameter(torch.randn(WIDTH, WIDTH))
        with pytest.raises(RuntimeError, match="block 0 .*replaced"):
            model(x)
    model = Stack(blocks=2)
    with offload_parameters(model):
        model.blocks[1][0].bias.data = torch.zeros(1).expand(WIDTH + 1)
        with pytest.raises(RuntimeError, match=r"block 1 param 1 is now \(49,\)"):
            model(x)


@pytest.mark.parametrize("overlap", ["none", "backward_publish"])
def test_an_exception_inside_backward_leaves_the_handle_working(seed, overlap):
    """A grad hook that raises halfway through the backward pass (as Ctrl-C or a failed check
    would): the pass is left open with a block staged; the next iteration starts over and the
    training stays bit-identical to the same loop without offload."""
    plain = Stack(blocks=5)
    streamed = copy.deepcopy(plain)
    ref_opt = OffloadAdamW(plain.parameters(), lr=3e-3, mode="cpu")
    with offload_parameters(streamed, window=1) as handle:
        opt = OffloadAdamW(streamed.parameters(), lr=3e-3, overlap=overlap)
        batches = data(5)
        for step, (x, y) in enumerate(batches):
            losses = []
            for model, o in ((streamed, opt), (plain, ref_opt)):
                o.zero_grad()
                out = model.blocks[1](model.blocks[0](x))  # reaches blocks 0 and 1 only

                def boom(grad):
                    raise KeyboardInterrupt("interrupted in backward")

                if step == 2:
                    out.register_hook(boom)
                    with pytest.raises(KeyboardInterrupt):
                        model(x).add(out.sum() * 0).sum().backward()
                    o.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                o.step()
                losses.append(loss.detach())
            assert torch.equal(losses[0], losses[1]), f"step {step}"
        assert handle.metrics()["passes"] >= len(batches)
    for p, q in zip(streamed.parameters(), plain.parameters()):
        assert torch.equal(p, q)


def test_state_dict_and_load_state_dict_see_the_weights(seed, tmp_path):
    """model.state_dict() of an offloaded model holds the weights (their tier copies), a
    torch.save of it restores a plain model, and model.load_state_dict() writes the tier
    copies: training goes on as the plain model that loaded the same dict, bit for bit (the
    optimizer re-reads its master weights from the written copies)."""
    plain = Stack(blocks=4)
    streamed = copy.deepcopy(plain)
    ref_opt = OffloadAdamW(plain.parameters(), lr=3e-3, mode="cpu")
    with offload_parameters(streamed, window=1):
        opt = OffloadAdamW(streamed.parameters(), lr=3e-3)
        batches = data(6)
        train(streamed, opt, batches[:2])
        train(plain, ref_opt, batches[:2])
        mine, theirs = streamed.state_dict(), plain.state_dict()
        assert list(mine) == list(theirs)
        for key in theirs:
            assert torch.equal(mine[key], theirs[key]), key
        torch.save(mine, tmp_path / "model.pt")
        restored = Stack(blocks=4)
        restored.load_state_dict(torch.load(tmp_path / "model.pt"))
        assert all(torch.equal(a, b) for a, b in zip(restored.parameters(), plain.parameters()))
        # Load other weights into both (a checkpoint of another run), then train on.
        other = Stack(blocks=4).state_dict()
        streamed.load_state_dict(other)
        plain.load_state_dict(other)
        for key, value in streamed.state_dict().items():
            assert torch.equal(value, other[key]), key
        with pytest.raises(RuntimeError, match="size mismatch"):  # refused, nothing written
            streamed.load_state_dict({**other, "blocks.0.0.weight": torch.zeros(3, 3)})
        assert torch.equal(streamed.state_dict()["blocks.0.0.weight"], other["blocks.0.0.weight"])
        assert torch.equal(torch.stack(train(streamed, opt, batches[2:])),
                           torch.stack(train(plain, ref_opt, batches[2:])))
    for p, q in zip(streamed.parameters(), plain.parameters()):
        assert torch.equal(p, q)
