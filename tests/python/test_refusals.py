"""Every refusal names what it refuses and changes nothing."""
import pytest
import torch

from tierflow.torch import OffloadAdam, OffloadAdamW


def _p(*shape, **kw):
    return torch.randn(*shape, **kw).requires_grad_()


@pytest.mark.parametrize("kwargs, match", [
    ({"lr": -1e-3}, "learning rate"),
    ({"lr": float("nan")}, "learning rate"),
    ({"betas": (0.9, 1.0)}, "betas"),
    ({"betas": (-0.1, 0.99)}, "betas"),
    ({"eps": 0.0}, "eps"),
    ({"weight_decay": -0.1}, "weight_decay"),
    ({"amsgrad": True}, "amsgrad"),
    ({"maximize": True}, "maximize"),
    ({"mode": "gpu"}, "mode"),
    ({"max_grad_norm": -1.0}, "max_grad_norm"),
    ({"threads": 0}, "threads"),
])
def test_bad_arguments(seed, kwargs, match):
    for cls in (OffloadAdamW, OffloadAdam):
        with pytest.raises(ValueError, match=match):
            cls([_p(4)], **kwargs)


@pytest.mark.parametrize("make, error, match", [
    (lambda: _p(3, dtype=torch.complex64), TypeError, "param 1 .*complex"),
    (lambda: _p(3, dtype=torch.float64), TypeError, "param 1 .*float64"),
    (lambda: _p(4, 3).t().detach().requires_grad_(), ValueError, "param 1 .*not contiguous"),
    (lambda: torch.randn(3, device="meta").requires_grad_(), ValueError, "param 1 .*meta"),
])
def test_params_the_step_cannot_run(seed, make, error, match):
    with pytest.raises(error, match=match):
        OffloadAdamW([_p(5), make()])


def test_one_tensor_in_two_groups(seed):
    shared = _p(6)
    with pytest.raises(ValueError, match="param 2 .*already param 0 of group 0"):
        OffloadAdamW([{"params": [shared, _p(2)]}, {"params": [shared]}])
    opt = OffloadAdamW([shared])
    with pytest.raises(ValueError, match="param 1 .*already"):
        opt.add_param_group({"params": [shared]})
    assert len(opt.param_groups) == 1


def test_params_on_a_second_device_named(seed):
    opt = OffloadAdamW([_p(3)])
    with pytest.raises(ValueError, match="param 1 .*must share one device"):
        opt.add_param_group({"params": [torch.randn(2, device="meta").requires_grad_()]})


def test_bad_hyper_in_param_groups_refused_at_step(seed):
    p = _p(8)
    opt = OffloadAdamW([p], mode="cpu")
    p.grad = torch.randn(8)
    opt.step()
    before = p.detach().clone()
    opt.param_groups[0]["lr"] = -1.0
    with pytest.raises(ValueError, match="group 0: invalid learning rate"):
        opt.step()
    opt.param_groups[0]["amsgrad"] = True
    opt.param_groups[0]["lr"] = 1e-3
    with pytest.raises(ValueError, match="amsgrad"):
        opt.step()
    assert torch.equal(p, before)


def test_sparse_grads(seed):
    embedding = torch.nn.Embedding(10, 4, sparse=True)
    opt = OffloadAdamW(embedding.parameters(), mode="cpu")
    before = embedding.weight.detach().clone()
    embedding(torch.tensor([1, 2, 3])).sum().backward()
    with pytest.raises(ValueError, match="param 0 .*sparse"):
        opt.step()
    assert torch.equal(embedding.weight, before)


def test_non_contiguous_grad_changes_nothing(seed):
    a, b = _p(4, 3), _p(5)
    opt = OffloadAdamW([a, b], mode="cpu")
    a.grad, b.grad = torch.randn(4, 3), torch.randn(5)
    opt.step()
    state = opt.state_dict()["state"]
    kept = (a.detach().clone(), b.detach().clone())
    a.grad, b.grad = torch.randn(3, 4).t(), torch.randn(5)
    with pytest.raises(ValueError, match="param 0 .*grad is not contiguous"):
        opt.step()
    assert torch.equal(a, kept[0]) and torch.equal(b, kept[1])
    after = opt.state_dict()["state"]
    assert int(after[1]["step"]) == 1 and torch.equal(after[1]["exp_avg"], state[1]["exp_avg"])


def test_a_placement_spec_the_library_refuses(seed):
    import tierflow

    p = _p(4)
    opt = OffloadAdamW([p], placement="optimizer_state=nowhere", mode="cpu")
    p.grad = torch.randn(4)
    with pytest.raises(tierflow.InputError, match="nowhere"):
        opt.step()
