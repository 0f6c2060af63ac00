"""The kernels' engine side: argument checks before any C++ runs, the MLX-op fallback with the
same results, and an installation where the kernels cannot be built (no compiler)."""

import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from tiny_llm import kernels


@pytest.fixture
def kernels_off():
    before = kernels.enable(False)
    yield
    kernels.enable(before)


@pytest.mark.parametrize("change, message", [
    (dict(x=mx.zeros((1, 64), dtype=mx.int32)), "x must be a float32, float16 or bfloat16 array, got mlx.core.int32"),
    (dict(group_size=16), r"group_size must be one of \(32, 64, 128\), got 16"),
    (dict(bits=3), r"bits must be one of \(4, 8\), got 3"),
    (dict(x=mx.zeros((1, 96))), "does not hold 4-bit rows of x's 96 features in groups of 32"),
    (dict(scales=mx.zeros((8, 3))), r"scales must have shape \(8, 2\), got \(8, 3\)"),
    (dict(biases=mx.zeros((8, 2), dtype=mx.float16)), "scales and biases must have one dtype"),
    (dict(w=mx.zeros((8, 8), dtype=mx.int32)), "w must be a uint32 array"),
    (dict(bias=mx.zeros((9,))), r"bias must have shape \(8,\), got \(9,\)"),
])
def test_quantized_matmul_refuses_bad_arguments(change, message):
    args = dict(x=mx.zeros((1, 64)), w=mx.zeros((8, 8), dtype=mx.uint32), scales=mx.zeros((8, 2)),
                biases=mx.zeros((8, 2)), group_size=32, bits=4, bias=None)
    args.update(change)
    with pytest.raises(ValueError, match=message):
        kernels.quantized_matmul(**args)


def test_matmul_and_attention_refuse_bad_arguments():
    with pytest.raises(ValueError, match=r"w must have shape \[N, 64\] \(x's last axis\), got \(8, 32\)"):
        kernels.matmul(mx.zeros((1, 64)), mx.zeros((8, 32)))
    with pytest.raises(ValueError, match="w must be a float32, float16 or bfloat16 array, got mlx.core.uint32"):
        kernels.matmul(mx.zeros((1, 64)), mx.zeros((8, 64), dtype=mx.uint32))
    q, pool = mx.zeros((1, 4, 1, 8)), mx.zeros((16, 2, 8))
    pages, starts = mx.zeros((1, 1), dtype=mx.int32), mx.zeros((1,), dtype=mx.int32)
    with pytest.raises(ValueError, match="the 4 query heads must be a multiple of the 3 key/value heads"):
        kernels.paged_attention(q, mx.zeros((16, 3, 8)), mx.zeros((16, 3, 8)), pages, starts, 16, 1.0)
    with pytest.raises(ValueError, match=r"pages must be an int32 array \[1, n\], got mlx.core.float32"):
        kernels.paged_attention(q, pool, pool, pages.astype(mx.float32), starts, 16, 1.0)
    with pytest.raises(ValueError, match=r"starts must be an int32 array \[1\]"):
        kernels.paged_attention(q, pool, pool, pages, mx.zeros((2,), dtype=mx.int32), 16, 1.0)
    with pytest.raises(ValueError, match="page_size must be a positive integer, got 0"):
        kernels.paged_attention(q, pool, pool, pages, starts, 0, 1.0)
    with pytest.raises(ValueError, match="keys must be a pool"):
        kernels.paged_attention(q, mx.zeros((16, 16)), pool, pages, starts, 16, 1.0)
    buffers = mx.zeros((1, 2, 8, 8))
    with pytest.raises(ValueError, match=r"start must be an integer with 0 <= start and start \+ L <= 8, got 8"):
        kernels.dense_attention(q, buffers, buffers, 8, 1.0)
    with pytest.raises(ValueError, match=r"values must be buffers \[1, Hkv, S, D\] like keys"):
        kernels.dense_attention(q, buffers, mx.zeros((1, 2, 9, 8)), 0, 1.0)
    with pytest.raises(ValueError, match="threads must be a positive integer, got 0"):
        with kernels.threads(0):
            pass


def test_turned_off_the_ops_are_mlx_own(kernels_off):
    """With the kernels off, each op is MLX's: bit for bit what MLX computes."""
    w = mx.random.normal((40, 64), key=mx.random.key(1))
    packed, scales, biases = mx.quantize(w, group_size=32, bits=4)
    x = mx.random.normal((3, 64), key=mx.random.key(2))
    ours = kernels.quantized_matmul(x, packed, scales, biases, 32, 4)
    ref = mx.quantized_matmul(x, packed, scales, biases, transpose=True, group_size=32, bits=4)
    assert (np.array(ours) == np.array(ref)).all()
    assert (np.array(kernels.matmul(x, w)) == np.array(x @ w.T)).all()
    assert kernels.status().startswith("kernels: off")
    with pytest.raises(RuntimeError, match="the kernels are turned off"):
        kernels.require()


def test_fallback_dense_attention_by_hand(kernels_off):
    """Off, the dense attention is MLX's fused attention on the buffers' first positions:
    one query head over two positions with equal scores averages their values; positions
    past start + i are never seen (their values are 100)."""
    keys = mx.zeros((1, 1, 6, 2))
    values = mx.array([[[[0.0, 0.0], [2.0, 4.0], [100.0, 100.0], [100.0, 100.0], [100.0, 100.0], [100.0, 100.0]]]])
    out = kernels.dense_attention(mx.zeros((1, 1, 2, 2)), keys, values, 0, 1.0)
    assert out.tolist() == [[[[0.0, 0.0], [1.0, 2.0]]]]


def test_fallback_attention_over_pages_by_hand(kernels_off):
    """Two positions in two pages of one position, values 0 and 2: a query that sees both
    with equal scores averages them (1); the first query sees only the first (0)."""
    keys = mx.zeros((4, 1, 2))
    values = mx.array([[[0.0, 0.0]], [[9.0, 9.0]], [[2.0, 2.0]], [[9.0, 9.0]]])  # slots 1 and 3 unused
    pages = mx.array([[0, 2]], dtype=mx.int32)
    out = kernels.paged_attention(mx.zeros((1, 1, 2, 2)), keys, values, pages, mx.array([0], dtype=mx.int32), 1, 1.0)
    assert out.tolist() == [[[[0.0, 0.0], [1.0, 1.0]]]]


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k != "TINY_LLM_KERNELS"}
    # A fresh kernel cache, and a compiler that does not exist: the build must fail.
    env.update(TINY_LLM_CACHE=str(tmp_path), CXX=str(tmp_path / "no-such-compiler"), **extra)
    return env


def test_without_a_compiler_everything_runs_on_mlx_ops(tmp_path, default_model_dir):
    """The build fails with one line that says why and exit status 1 (`make setup` goes on);
    the command line then runs on MLX ops and says so in one line with --verbose."""
    env = _env(tmp_path)
    build = subprocess.run([sys.executable, "-m", "tiny_llm.kernels", "build"], env=env, capture_output=True,
                           text=True, timeout=300)
    assert build.returncode == 1
    lines = [line for line in build.stderr.splitlines() if "kernels not built" in line]
    assert len(lines) == 1 and "everything runs on MLX ops" in lines[0], build.stderr
    run = subprocess.run([sys.executable, "-m", "tiny_llm", "generate", "--prompt", "Hi", "--max-tokens", "2",
                          "--model", str(default_model_dir), "--verbose"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()
    notes = [line for line in run.stderr.splitlines() if "kernels: not built" in line]
    assert len(notes) == 1 and "run on MLX ops" in notes[0]
    assert "Traceback" not in run.stderr


def test_no_kernels_flag_says_so(default_model_dir):
    run = subprocess.run([sys.executable, "-m", "tiny_llm", "generate", "--prompt", "Hi", "--max-tokens", "2",
                          "--model", str(default_model_dir), "--verbose", "--no-kernels"], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "kernels: off (TINY_LLM_KERNELS=0 or --no-kernels)" in run.stderr
