"""Test-suite wiring: `gpu` tests skip, with the reason, where no CUDA GPU can run them; a plan
store of each test's own; Ctrl-C in the middle of a run; without hypothesis, its property tests
skip and every other test of their modules still runs; the device's ceilings faked (a run's
env.json measures them: seconds each on a machine whose cache misses), unless a test asks for
the real `ceilings.measure` (`real_ceilings`), and for runs in subprocesses a cache of the
session's own that holds the fake; Winograd's compiled transforms only in the tests that ask
for them (`compiled_winograd`); a pretend GPU with a queue (`gpu_queue`)."""

import sys
import types

import pytest

from convbench.machine import threads

# The thread policy a run has (`convbench.cli` sets it first thing): idle OpenBLAS and OpenMP
# threads sleep after a short spin. Read when those libraries load, so set here, before any
# test module imports NumPy or torch; without it OpenBLAS's idle threads spun beside torch's
# for up to 2^28 cycles after each NumPy product, and a quiet serial test's rows read as
# contended (2/3 of the cores: three threads on two).
threads.sleep_idle_threads()


class _Anything:
    """What hypothesis's strategies are to a module that only builds them at import: any call,
    attribute or decoration gives another."""

    def __call__(self, *args, **kwargs):
        return self

    def __getattr__(self, name):
        return self


def _hypothesis_stand_in() -> None:
    """A `hypothesis` module whose `given` skips the test: a GPU machine without the dev
    extras loses the property tests, not the modules that hold them (`gpu-check --tests`)."""
    import inspect

    def given(*args, **kwargs):
        def wrap(fn):
            # the test's own parameters (parametrize, fixtures), less those hypothesis fills:
            # the keywords given, and as many positional ones from the end
            params = [p for p in inspect.signature(fn).parameters.values()
                      if p.name not in kwargs]
            params = params[:len(params) - len(args)]

            @pytest.mark.skip(reason="hypothesis is not installed (pip install hypothesis)")
            def skipped(*a, **kw):
                pass

            skipped.__name__, skipped.__doc__ = fn.__name__, fn.__doc__
            skipped.__signature__ = inspect.Signature(params)
            skipped.pytestmark = [*getattr(fn, "pytestmark", []), *skipped.pytestmark]
            return skipped

        return wrap

    module = types.ModuleType("hypothesis")
    module.given = given
    module.settings = lambda *args, **kwargs: (lambda fn: fn)
    module.example = lambda *args, **kwargs: (lambda fn: fn)  # the test skips anyway
    module.assume = lambda condition: True
    module.strategies = _Anything()
    sys.modules["hypothesis"] = module
    sys.modules["hypothesis.strategies"] = module.strategies


try:
    import hypothesis  # noqa: F401
except ImportError:
    _hypothesis_stand_in()


def pytest_collection_modifyitems(config, items):
    """`gpu` tests skipped cleanly where CUDA cannot be used; and where `-m` names the
    `gpu_pins` marker (`convbench gpu-first`), the pins first, each file's in its order, so
    that a time limit cuts the suites after them, never a pin."""
    if "gpu_pins" in (config.getoption("markexpr", "") or ""):
        items.sort(key=lambda item: item.get_closest_marker("gpu_pins") is None)
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    from convbench.machine import backends

    reason = backends.available("cuda")
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
    from convbench.measure import runner

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


#: The model name of the fake ceilings every test's run gets (`fake_ceilings`).
FAKE_CEILINGS_MODEL = "test fake (tests/conftest.py: no ceilings measured)"


def fake_ceilings(device: str = "cpu", threads: int | None = None, **_) -> object:
    """A fixed, clearly fake `Ceilings` (1 PFLOP/s, 1 TB/s: above anything a test's tiny
    problems reach, so no real row of a test is guarded away), for `ceilings.measure`."""
    from convbench.measure import ceilings

    device = ceilings._device(device)
    return ceilings.Ceilings(
        device=device, model=FAKE_CEILINGS_MODEL, threads=threads or 1,
        gflops_attainable=1e6, gemm_backend="fake",
        gflops_by_backend={"fake": {"square": 1e6}}, gflops_peak_theoretical=2e6,
        peak_method="fake: not measured", bandwidth_gbs_dram=1e3, bandwidth_gbs_cache=1e4,
        bandwidth_by_kernel={"dram": {"fake copy": 1e3}, "cache": {"fake copy": 1e4}},
        clock_mhz=None, openblas_coretype=None, openblas_faster_coretype=None,
        methods={"attainable": "fake on square", "gflops": "fake; products: square (1x1)@(1x1)",
                 "bandwidth": "fake"},
        measured_at="2026-01-01T00:00:00+00:00", versions={})


@pytest.fixture(scope="session", autouse=True)
def _fake_ceilings_cache(tmp_path_factory):
    """A ceilings cache of the session's own (`$CONVBENCH_CACHE_DIR`) holding `fake_ceilings`
    for this CPU at every thread count, so a `convbench` run in a subprocess (the CLI,
    torchrun's ranks), which the monkeypatch does not reach, reads it instead of measuring."""
    import os

    from convbench.measure import ceilings

    folder = tmp_path_factory.mktemp("ceilings-cache")
    before = os.environ.get("CONVBENCH_CACHE_DIR")
    os.environ["CONVBENCH_CACHE_DIR"] = str(folder)
    try:
        base = ceilings.cache_key("cpu", 1)
        for n in range(1, max(os.cpu_count() or 1, ceilings.available_cores()) + 1):
            key = {**base, "threads": n}
            ceilings._store(ceilings.cache_path(key), key, fake_ceilings("cpu", n))
        yield folder
    finally:
        if before is None:
            os.environ.pop("CONVBENCH_CACHE_DIR", None)
        else:
            os.environ["CONVBENCH_CACHE_DIR"] = before


@pytest.fixture
def real_ceilings():
    """The real `ceilings.measure` for this test (every other test gets `fake_ceilings`)."""
    from convbench.measure import ceilings

    return ceilings.measure


@pytest.fixture(autouse=True)
def _fake_ceilings(request, monkeypatch):
    """`ceilings.measure` faked (`fake_ceilings`) unless the test uses `real_ceilings`."""
    if "real_ceilings" in request.fixturenames:
        return
    from convbench.measure import ceilings

    monkeypatch.setattr(ceilings, "measure", fake_ceilings)


@pytest.fixture
def compiled_winograd():
    """Winograd's compiled transforms (`winograd_jit`) where they apply in a real run, for this
    test (every other test runs the GEMM transforms: each new shape's compile costs seconds,
    and on a clean machine they took CI past its 10 minutes; the kernels' own tests set
    `MIN_BYTES` themselves)."""
    from convbench.algos import winograd_jit

    return winograd_jit.MIN_BYTES


@pytest.fixture(autouse=True)
def _gemm_winograd(request, monkeypatch):
    """The GEMM transforms unless the test uses `compiled_winograd`."""
    if "compiled_winograd" in request.fixturenames:
        return
    from convbench.algos import winograd_jit

    monkeypatch.setattr(winograd_jit, "MIN_BYTES", 1 << 62)


class GpuQueue:
    """CuPy on a pretend GPU with a queue, as a real one has: the host issues work and goes on;
    each piece starts at the later of the host's time when it was issued and the time the
    device is free; an event reads the device's time when the queue reaches it; a synchronize
    waits for the queue. Both clocks in ms; `clock()` is the host's in seconds (a timer's)."""

    #: The device's time zeroing the L2 flush buffer.
    FLUSH_MS = 0.02

    def __init__(self):
        self.host = self.free = 0.0
        queue = self

        class Event:
            def record(self):
                self.t = queue.free = max(queue.host, queue.free)

            def synchronize(self):
                queue.host = max(queue.host, self.t)

        class Buffer:
            nbytes = 1 << 26

            def fill(self, value):
                queue.launch(0.0, queue.FLUSH_MS)

        device = types.SimpleNamespace(attributes={"L2CacheSize": 1 << 20},
                                       synchronize=self.synchronize)
        self.module = types.SimpleNamespace(
            uint8="uint8", empty=lambda n, dtype: Buffer(),
            cuda=types.SimpleNamespace(Event=Event, get_elapsed_time=lambda a, b: b.t - a.t,
                                       Device=lambda: device))

    def clock(self) -> float:
        return self.host / 1e3

    def launch(self, host_ms: float, device_ms: float) -> None:
        """The host takes `host_ms` to issue work that runs `device_ms` on the device."""
        self.host += host_ms
        self.free = max(self.host, self.free) + device_ms

    def synchronize(self) -> None:
        self.host = max(self.host, self.free)

    def spin(self, ms: float) -> None:
        """A head start: `ms` of device work, issued at once."""
        self.launch(0.0, ms)

    def step(self, launches: int, host_ms: float, device_ms: float):
        """A call of `launches` launches taking the host `host_ms` and the device `device_ms`
        in all, in equal parts."""
        def call(*args) -> None:
            for _ in range(launches):
                self.launch(host_ms / launches, device_ms / launches)
        return call


@pytest.fixture
def gpu_queue(monkeypatch):
    """A `GpuQueue` standing in for CuPy (`sys.modules["cupy"]`)."""
    queue = GpuQueue()
    monkeypatch.setitem(sys.modules, "cupy", queue.module)
    return queue


@pytest.fixture
def quiet(monkeypatch):
    """The machine read as quiet (no contention readings) by the whole-step confirmation:
    tests that plant their differences as sleeps, or read the confirmation's lines, would
    otherwise see it stop as busy on a shared test machine; the busy machine has tests of its
    own (tests/test_confirm.py)."""
    from convbench.measure import timing

    real = timing.time_steps
    monkeypatch.setattr(timing, "time_steps",
                        lambda *args, **options: real(*args, probe=None, **options))
