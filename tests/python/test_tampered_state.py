"""A tampered or odd state dict is refused whole, naming the param and what is wrong, and the
optimizer's state stays as it was: step counts past what the 64-bit counter goes on from, a
step that is no count, complex or integer moments (never cast silently), a None entry."""
import pytest
import torch
from torch import nn

from tierflow.torch import OffloadAdamW


def _trained(seed):
    gen = torch.Generator().manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))
    opt = OffloadAdamW(net.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        net(torch.randn(4, 6, generator=gen)).square().mean().backward()
        opt.step()
    return net, opt


def _tampered(good, index, key, value):
    bad = {"param_groups": good["param_groups"],
           "state": {i: dict(s) for i, s in good["state"].items()}}
    if key is None:
        bad["state"][index] = value
    else:
        bad["state"][index][key] = value
    return bad


CASES = [
    ("step", torch.tensor(2.0**64), ValueError, "above"),
    ("step", 2**64, ValueError, "above"),
    ("step", float("inf"), ValueError, "not a count"),
    ("step", float("nan"), ValueError, "not a count"),
    ("step", 2.5, ValueError, "not a count"),
    ("step", torch.tensor([1.0, 2.0]), TypeError, "one real number"),
    ("step", "3", TypeError, "not a number"),
    ("step", None, TypeError, "not a number"),
    ("exp_avg", "complex", TypeError, "complex64"),
    ("exp_avg_sq", "int64", TypeError, "int64"),
    ("exp_avg", None, TypeError, "NoneType"),
    (None, None, TypeError, "not a dict"),
]


@pytest.mark.parametrize("key,value,error,words", CASES,
                         ids=[f"{k}={v if not isinstance(v, torch.Tensor) else 'tensor'}"
                              for k, v, _, _ in CASES])
def test_a_tampered_state_dict_is_refused_and_changes_nothing(seed, key, value, error, words):
    net, opt = _trained(seed)
    good = opt.state_dict()
    before = {i: {k: v.clone() for k, v in s.items()} for i, s in good["state"].items()}
    index = 2  # the second Linear's weight
    if value == "complex":
        value = torch.complex(good["state"][index][key], good["state"][index][key])
    elif value == "int64":
        value = good["state"][index][key].to(torch.int64)
    with pytest.raises(error, match=words) as info:
        opt.load_state_dict(_tampered(good, index, key, value))
    assert "param 2" in str(info.value)
    after = opt.state_dict()["state"]
    for i, s in before.items():
        for k, v in s.items():
            assert torch.equal(after[i][k], v), f"state {i} {k} changed"


def test_the_largest_step_the_counter_goes_on_from_is_taken(seed):
    net, opt = _trained(seed)
    good = opt.state_dict()
    opt.load_state_dict(_tampered(good, 0, "step", 2**63 - 1))
    assert opt.state_dict()["state"][0]["step"] == float(2**63 - 1)
