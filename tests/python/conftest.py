"""pytest setup: tests marked `gpu` (registered in pyproject.toml) are skipped unless torch sees a CUDA device
and the library was built with GPU kernels."""

import pytest
import torch

import cuteattn


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() and cuteattn.cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device and a cuteattn build with GPU kernels")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
