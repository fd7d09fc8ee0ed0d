"""The emulator runs CUDA sources faithfully enough to catch the bugs that matter: a missing
barrier, a divergent barrier, reads of shared memory nobody wrote. Kernels in tests/kernels/."""

from pathlib import Path

import numpy as np
import pytest

from convbench.cuda import emu, kernels
from convbench.machine import backends
from convbench.measure import verify

pytestmark = pytest.mark.skipif(backends.available("emu") is not None,
                                reason=str(backends.available("emu")))

HERE = Path(__file__).parent / "kernels"


def _transpose(a: np.ndarray, skip_barrier: int) -> np.ndarray:
    launch = kernels.load("emu", HERE / "transpose.cu", {"SKIP_BARRIER": skip_barrier})
    rows, cols = a.shape
    out = np.full((cols, rows), np.nan, dtype=np.float32)
    launch.kernel("transpose")((-(-cols // 8), -(-rows // 8)), (8, 8), (a, out, rows, cols))
    return out


def test_tiled_kernel_passes():
    a = np.random.default_rng(0).standard_normal((13, 21)).astype(np.float32)
    np.testing.assert_array_equal(_transpose(a, skip_barrier=0), a.T)


def test_missing_syncthreads_is_caught_by_the_checker():
    a = np.random.default_rng(0).standard_normal((13, 21)).astype(np.float32)
    check = verify.check(_transpose(a, skip_barrier=1), a.T, "direct", "fp32")
    assert not check.ok and check.rel_error == np.inf  # read shared memory before it was written


@pytest.fixture(scope="module")
def features():
    return kernels.load("emu", HERE / "emu_features.cu")


def test_divergent_barrier_is_reported(features):
    with pytest.raises(emu.EmuError, match=r"divergent __syncthreads in block \(0,0,0\): 16 of 32"):
        features.kernel("divergent_barrier")(1, 32, (np.zeros(32, np.float32), 16))
    features.kernel("divergent_barrier")(1, 32, (np.zeros(32, np.float32), 32))  # converged: fine


def test_integer_atomics_count_every_thread(features):
    counter = np.zeros(1, np.int32)
    features.kernel("count_threads")((3, 2, 2), (5, 4, 2), (counter,))
    assert counter[0] == 12 * 40


@pytest.mark.parametrize("threads", [32, 256])
def test_dynamic_shared_memory_and_float_atomics(features, threads):
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    total = np.zeros(1, np.float32)
    blocks = -(-x.size // threads)
    features.kernel("block_sum")(blocks, threads, (x, total, x.size), shared_mem=4 * threads)
    assert total[0] == pytest.approx(float(x.astype(np.float64).sum()), abs=1e-3)


def test_shared_memory_starts_as_nan(features):
    out = np.zeros(2 * 64, np.float32)
    features.kernel("peek_shared")(2, 64, (out,), shared_mem=4 * 64)
    assert np.isnan(out).all()


@pytest.mark.parametrize("block, smem, message", [
    (2048, 0, "invalid launch configuration"),
    (32, 228 * 1024, "dynamic shared memory"),
])
def test_invalid_launches_raise(features, block, smem, message):
    with pytest.raises(emu.EmuError, match=message):
        features.kernel("peek_shared")(1, block, (np.zeros(2048, np.float32),), shared_mem=smem)


def test_libraries_are_cached_by_source_and_defines(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVBENCH_EMU_CACHE", str(tmp_path))
    code = kernels.read_source(HERE / "transpose.cu")
    entries = kernels.entry_points(code)
    first = emu.build.build_library(code, entries, ("-DSKIP_BARRIER=0",))
    stamp = first.stat().st_mtime_ns
    assert first.parent == tmp_path
    assert emu.build.build_library(code, entries, ("-DSKIP_BARRIER=0",)) == first
    assert first.stat().st_mtime_ns == stamp  # found, not rebuilt
    assert emu.build.build_library(code, entries, ("-DSKIP_BARRIER=1",)) != first


def test_translation_points_extern_shared_at_the_dynamic_buffer():
    code = 'template <int N> __device__ void f() { extern __shared__ __align__(16) float4 s[]; }'
    assert ("float4* const s = reinterpret_cast<float4*>(emu_dynamic_shared);"
            in emu.build.translate(code, {}))


def test_a_compile_error_names_the_kernel_file(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void bad(float* x) {\n  x[0] = nope;\n}\n')
    with pytest.raises(emu.EmuBuildError, match=r"bad\.cu:2"):
        kernels.load("emu", bad)
