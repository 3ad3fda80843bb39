"""On a GPU: the CUDA backend on the params' device, ordered with torch's current stream."""
import pytest
import torch
from tf_helpers import Net, assert_close_to_scale, batch, clone, groups, schedule, train_step

from tierflow.torch import OffloadAdamW

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device (torch.cuda.is_available() is False)")


def _cuda_batch():
    x, y = batch()
    return x.cuda(), y.cuda()


def test_matches_torch_on_cuda(seed):
    model = Net().cuda()
    reference = clone(model)
    opt = OffloadAdamW(groups(model))
    ref_opt = torch.optim.AdamW(groups(reference), foreach=False)
    sched, ref_sched = schedule(opt), schedule(ref_opt)
    for _ in range(50):
        train_step(model, opt, _cuda_batch(), (reference, ref_opt))
        sched.step()
        ref_sched.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert_close_to_scale(p.detach(), q.detach(), what=name)
    assert opt.where()["master_params"]["total_pages"] > 0


def test_step_is_ordered_with_a_side_stream(seed):
    p = torch.randn(1 << 20, device="cuda", requires_grad=True)
    q = p.detach().clone().requires_grad_()
    opt = OffloadAdamW([p], lr=1e-2)
    ref_opt = torch.optim.AdamW([q], lr=1e-2, foreach=False)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(5):
            g = torch.randn_like(p) * 3  # made on the side stream, no synchronize
            p.grad = g
            opt.step()
            snapshot = p.detach() * 1  # reads the params on the side stream
            q.grad = g.clone()
            ref_opt.step()
            assert_close_to_scale(snapshot, q.detach())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_params_on_cuda_keep_masters(seed, dtype):
    p = torch.randn(4096, device="cuda").to(dtype).requires_grad_()
    ref = p.detach().float().requires_grad_()
    opt = OffloadAdamW([p], lr=1e-3)
    ref_opt = torch.optim.AdamW([ref], lr=1e-3, foreach=False)
    for _ in range(20):
        p.grad = torch.randn(4096, device="cuda").to(dtype)
        ref.grad = p.grad.float()
        opt.step()
        ref_opt.step()
    master = opt.state_dict()["state"][0]["master"]
    assert_close_to_scale(master.cuda(), ref.detach())
    assert torch.equal(p.detach(), master.cuda().to(dtype))


def test_grad_scaler_with_autocast(seed):
    model = Net().cuda()
    opt = OffloadAdamW(model.parameters(), lr=1e-3)
    scaler = torch.cuda.amp.GradScaler()
    x, y = _cuda_batch()
    losses = []
    for _ in range(20):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss))
    assert losses[-1] < losses[0]


def test_state_dict_interchange_on_cuda(seed):
    model = Net().cuda()
    torch_opt = torch.optim.AdamW(groups(model))
    train_step(model, torch_opt, _cuda_batch())
    opt = OffloadAdamW(groups(model))
    opt.load_state_dict(torch_opt.state_dict())
    train_step(model, opt, _cuda_batch())
    back = torch.optim.AdamW(groups(model))
    back.load_state_dict(opt.state_dict())
    assert int(back.state_dict()["state"][0]["step"]) == 2
    assert back.state[model.head.weight]["exp_avg"].is_cuda


def test_params_on_cpu_and_cuda_refused(seed):
    with pytest.raises(ValueError, match="param 1 .*must share one device"):
        OffloadAdamW([torch.randn(3, requires_grad=True),
                      torch.randn(3, device="cuda", requires_grad=True)])


def test_offloaded_weights_grads_leave_hbm_after_their_copy(seed):
    """offload_parameters on CUDA with overlap: each offloaded weight's grad is freed once the
    optimizer has its host copy (release_grads default), so HBM never holds them all; the
    weights still train as release_grads=False trains them (bit for bit: the same kernels)."""
    from torch import nn

    from tierflow.torch import offload_parameters

    width, blocks = 1024, 8
    def make():
        torch.manual_seed(1234)
        return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU())
                               for _ in range(blocks)]).cuda()

    x = torch.randn(64, width, device="cuda")
    after_backward, weights = {}, {}
    for release in (False, True):
        model = make()
        with offload_parameters(model, blocks=list(model), window=2):
            opt = OffloadAdamW(model.parameters(), lr=1e-3, overlap="backward",
                               release_grads=None if release else False)
            for _ in range(3):
                opt.zero_grad()
                model(x).square().mean().backward()
                torch.cuda.synchronize()
                after_backward[release] = torch.cuda.memory_allocated()
                grads = [p.grad is None for p in model.parameters()]
                assert all(grads) if release else not any(grads)
                opt.step()
        weights[release] = [p.detach().clone() for p in model.parameters()]
    grad_bytes = blocks * (width * width + width) * 4
    # the released grads went back to torch's allocator: at least 3/4 of them
    assert after_backward[False] - after_backward[True] >= 0.75 * grad_bytes, after_backward
    for a, b in zip(weights[False], weights[True]):
        assert torch.equal(a, b)
