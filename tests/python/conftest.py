"""Fixtures for the tierflow.torch tests: a fresh seed per test, printed (pytest shows it with a
failure); TIERFLOW_TEST_SEED=N reruns with N."""
import os

import pytest
import torch


def _fresh_seed():
    value = int(os.environ.get("TIERFLOW_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"seed {value} (rerun with TIERFLOW_TEST_SEED={value})")
    return value


@pytest.fixture
def seed():
    value = _fresh_seed()
    torch.manual_seed(value)
    return value


@pytest.fixture(scope="module")
def dist_seed():
    """One seed for a module's multi-rank runs (the ranks seed themselves from it)."""
    return _fresh_seed()
