import pytest

from convbench.algos import registry
from convbench.core.problem import ConvProblem
from convbench.machine import backends


def test_every_module_registers_and_torch_cpu_is_there():
    impls = registry.implementations("numpy")
    assert "torch-cpu" in [i.algo for i in impls]
    assert all(i.backend == "numpy" for i in impls)
    for impl in registry.implementations():
        assert isinstance(impl, registry.Implementation)
        assert impl.algo in registry.names() and impl.backend in backends.BACKENDS
        assert set(impl.precisions) <= {"fp64", "fp32", "tf32", "fp16", "bf16"}


def test_expand_algos():
    have = registry.algos_for("numpy")
    assert registry.expand_algos("all", "numpy") == [a for a in have
                                                     if a not in registry.OPT_IN]
    assert registry.expand_algos("torch-cpu, torch-cpu", "numpy") == ["torch-cpu"]
    if {"winograd-2x2", "winograd-4x4"} <= set(have):
        assert registry.expand_algos("winograd", "numpy") == ["winograd-2x2", "winograd-4x4"]


@pytest.mark.parametrize("text, msg", [
    ("bogus", "unknown algo 'bogus'"),
    ("cudnn", "not available on numpy"),
    (",", "no algo given"),
])
def test_expand_algos_errors(text, msg):
    with pytest.raises(ValueError, match=msg):
        registry.expand_algos(text, "numpy")


def test_get_errors_name_what_exists():
    with pytest.raises(ValueError, match="has no numpy implementation; numpy has: .*torch-cpu"):
        registry.get("cudnn", "numpy")


def test_register_refuses_duplicates_and_bare_names():
    with pytest.raises(RuntimeError, match="registered twice"):
        registry.register(registry.algorithm("torch-cpu"), "numpy")(type("Dup", (), {}))
    with pytest.raises(TypeError, match="an algorithm registers with its traits"):
        registry.register("mystery", "numpy")
    with pytest.raises(ValueError, match="unknown backend"):
        registry.register(registry.algorithm("torch-cpu"), "tpu")


def test_every_shipped_algorithm_is_registered_with_its_traits():
    """`ALGOS` is only the order of the shipped algorithms: each registers (no stale name), and
    every registered name has its traits."""
    assert registry.names()[:len(registry.ALGOS)] == list(registry.ALGOS)
    for algo in registry.names():
        assert registry.algorithm(algo).name == algo
    with pytest.raises(ValueError, match="unknown algo 'mystery'; valid: direct, gemm"):
        registry.algorithm("mystery")


def test_backend_availability():
    assert backends.available("numpy") is None
    cuda = backends.available("cuda")
    assert cuda is None or "GPU" in cuda or "CuPy" in cuda


# --- the contract -------------------------------------------------------------------------------
@pytest.fixture
def scratch_registry():
    """The registry as loaded, in a copy: what a test registers does not outlive it."""
    with registry.scratch():
        yield


class _NoPrecisions(registry.Implementation):
    def supports(self, problem, pass_, layout, precision):
        return None

    def prepare(self, problem, pass_, layout, precision):
        return lambda a, b, out: None


class _Minimal(_NoPrecisions):
    precisions = ("fp32",)


def test_register_refuses_a_class_that_is_not_an_implementation(scratch_registry):
    class Duck:  # every method of the contract, but not the type
        precisions = ("fp32",)
        supports, prepare = _Minimal.supports, _Minimal.prepare

    with pytest.raises(TypeError, match="Duck cannot register as cudnn on emu: it does not "
                                        "subclass registry.Implementation"):
        registry.register(registry.algorithm("cudnn"), "emu")(Duck)
    assert ("cudnn", "emu") not in registry._IMPLS


@pytest.mark.parametrize("precisions", [None, (), ["fp32"], ("fp32", "fp8")])
def test_register_refuses_a_class_without_valid_precisions(scratch_registry, precisions):
    cls = type("Vague", (_NoPrecisions,), {} if precisions is None else
               {"precisions": precisions})
    with pytest.raises(TypeError, match="Vague cannot register as cudnn on emu: its precisions "
                                        "must be a non-empty tuple of fp64, fp32"):
        registry.register(registry.algorithm("cudnn"), "emu")(cls)
    assert ("cudnn", "emu") not in registry._IMPLS


def test_register_refuses_a_subclass_missing_prepare(scratch_registry):
    class NoPrepare(registry.Implementation):
        precisions = ("fp32",)

        def supports(self, problem, pass_, layout, precision):
            return None

    with pytest.raises(TypeError, match="NoPrepare cannot register as cudnn on emu: it does not "
                                        "define prepare$"):
        registry.register(registry.algorithm("cudnn"), "emu")(NoPrepare)
    assert ("cudnn", "emu") not in registry._IMPLS


def test_optional_hooks_default_to_nothing_to_add(scratch_registry):
    """Callers use every hook without asking whether it is there: the defaults mean "no needs
    beyond the backend", "no note", "not declared" (opcount falls back to theory), "one phase"."""
    registry.register(registry.algorithm("cudnn"), "emu")(_Minimal)
    impl = registry.get("cudnn", "emu")
    assert (impl.algo, impl.backend) == ("cudnn", "emu")
    case = (ConvProblem(n=1, c=1, h=4, w=4, k=1, r=3, s=3), "fwd", "nchw", "fp32")
    assert impl.available() is None
    assert impl.describe(*case) == ""
    assert impl.workspace_bytes(*case) is None
    assert impl.phases(*case) is None
    assert registry.impl_available(impl) == backends.available("emu")


def test_device_caches_are_registered_and_cleared(monkeypatch):
    from convbench.algos import fft_kernels

    assert fft_kernels._cufft_plan.cache_clear in registry._DEVICE_CACHES
    cleared = []
    monkeypatch.setattr(registry, "_DEVICE_CACHES", [])
    clear = registry.register_device_cache(lambda: cleared.append(1))
    assert registry._DEVICE_CACHES == [clear]
    registry.clear_device_caches()
    assert cleared == [1]


def test_a_wrapped_fft_gives_its_transform_grid_as_python_3_12_looks_it_up():
    """Python 3.12's isinstance against a runtime-checkable protocol looks attributes up
    statically (`inspect.getattr_static`), past `__getattr__`: an explicit-pad wrapper that only
    read `transform_grid` through lost it there, and every FFT row's operation count failed on
    an H200's Python 3.12 while CI's 3.11 passed."""
    import inspect

    registry.load()
    for backend in ("numpy", "emu", "cuda"):
        impl = registry.get("fft", backend)
        # on the CPU behind the dilation split too, which gives it the same way
        pad = impl.inner if isinstance(impl, registry.DilationSplit) else impl
        assert isinstance(pad, registry.ExplicitPad)
        for wrapper in (impl, pad):
            inspect.getattr_static(wrapper, "transform_grid")  # AttributeError before
            assert isinstance(wrapper, registry.TransformGrid)
