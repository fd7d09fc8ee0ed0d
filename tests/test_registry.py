import pytest

from convbench import registry


def test_every_module_registers_and_torch_cpu_is_there():
    impls = registry.implementations("numpy")
    assert "torch-cpu" in [i.algo for i in impls]
    assert all(i.backend == "numpy" for i in impls)
    for impl in registry.implementations():
        assert impl.algo in registry.ALGOS and impl.backend in registry.BACKENDS
        assert set(impl.precisions) <= {"fp64", "fp32", "tf32", "fp16", "bf16"}


def test_expand_algos():
    have = registry.algos_for("numpy")
    assert registry.expand_algos("all", "numpy") == have
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


def test_register_refuses_duplicates_and_unknown_names():
    with pytest.raises(RuntimeError, match="registered twice"):
        registry.register("torch-cpu", "numpy")(type("Dup", (), {}))
    with pytest.raises(ValueError, match="unknown algo"):
        registry.register("mystery", "numpy")


def test_backend_availability():
    assert registry.available("numpy") is None
    cuda = registry.available("cuda")
    assert cuda is None or "GPU" in cuda or "CuPy" in cuda
