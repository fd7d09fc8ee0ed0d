"""Test-suite wiring: `gpu` tests skip, with the reason, where no CUDA GPU can run them; a plan
store of each test's own; Ctrl-C in the middle of a run."""

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


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A plan store of the test's own (`$CONVBENCH_PLAN_DIR`)."""
    monkeypatch.setenv("CONVBENCH_PLAN_DIR", str(tmp_path / "plans"))
    return tmp_path / "plans"


@pytest.fixture
def interrupt(monkeypatch):
    """`interrupt(n)`: Ctrl-C when the runner starts preparing its case n + 1; returns the list
    of the cases it prepared before (a group of competing cases cut short is not written)."""
    from convbench import runner

    real = runner.prepare

    def after(n: int) -> list:
        seen = []

        def prepare(case, *args, **kw):
            if len(seen) == n:
                raise KeyboardInterrupt
            seen.append(case)
            return real(case, *args, **kw)

        monkeypatch.setattr(runner, "prepare", prepare)
        return seen

    return after
