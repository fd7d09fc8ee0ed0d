"""Test-suite wiring: `gpu` tests skip, with the reason, where no CUDA GPU can run them."""

import pytest


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    from convbench import registry

    reason = registry.available("cuda")
    if reason:
        skip = pytest.mark.skip(reason=f"gpu test: {reason}")
        for item in gpu_items:
            item.add_marker(skip)
