"""Fixtures for the tierflow.torch tests: a fresh seed per test, printed (pytest shows it with a
failure); TIERFLOW_TEST_SEED=N reruns with N."""
import os

import pytest
import torch


@pytest.fixture
def seed():
    value = int(os.environ.get("TIERFLOW_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"seed {value} (rerun with TIERFLOW_TEST_SEED={value})")
    torch.manual_seed(value)
    return value
