"""The kernels' engine side: argument checks before any C++ runs, the MLX-op fallback with the
same results, an installation where the kernels cannot be built (no compiler), and the build
that compiles only the sources that changed."""

import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from tiny_llm import kernels
from tiny_llm.kernels import build as kernel_build


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
    # Without the chat template the prompt is one token: on MLX's CPU ops a prefill of the
    # template's 31 tokens would take seconds, and the test is about the notes, not speed.
    run = subprocess.run([sys.executable, "-m", "tiny_llm", "generate", "--prompt", "Hi", "--max-tokens", "2",
                          "--no-chat-template", "--model", str(default_model_dir), "--verbose"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()
    notes = [line for line in run.stderr.splitlines() if "kernels: not built" in line]
    assert len(notes) == 1 and "run on MLX ops" in notes[0]
    assert "Traceback" not in run.stderr


def test_no_kernels_flag_says_so(default_model_dir):
    run = subprocess.run([sys.executable, "-m", "tiny_llm", "generate", "--prompt", "Hi", "--max-tokens", "2",
                          "--no-chat-template", "--model", str(default_model_dir), "--verbose", "--no-kernels"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "kernels: off (TINY_LLM_KERNELS=0 or --no-kernels)" in run.stderr


# ---- the build: CMake's folder kept per toolchain, only changed sources rewritten ----------------


def test_staging_rewrites_only_the_sources_whose_text_changed(tmp_path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    for name in kernel_build.SOURCES:
        (here / name).write_text(f"// {name}\n")
    monkeypatch.setattr(kernel_build, "HERE", here)
    staged = tmp_path / "src"
    kernel_build._stage(staged)
    for name in kernel_build.SOURCES:
        os.utime(staged / name, (1_000_000, 1_000_000))
    (here / "qmm.cpp").write_text("// edited\n")
    kernel_build._stage(staged)
    changed = [name for name in kernel_build.SOURCES if (staged / name).stat().st_mtime != 1_000_000]
    assert changed == ["qmm.cpp"]
    assert (staged / "qmm.cpp").read_text() == "// edited\n"


FAKE_CMAKE = """#!/bin/sh
# configure: fails where a folder holds `stale`; build: makes the module.
echo "$@" >> {calls}
if [ "$1" = "-S" ]; then
  if [ -e "$4/stale" ]; then echo "error: stale objects"; exit 1; fi
  mkdir -p "$4"; exit 0
fi
{build}
"""


def _fake_cmake(tmp_path, monkeypatch, build="touch \"$2/_ext.fake.so\"") -> None:
    script = tmp_path / "cmake"
    script.write_text(FAKE_CMAKE.format(calls=tmp_path / "calls", build=build))
    script.chmod(0o755)
    monkeypatch.setattr(kernel_build, "_cmake", lambda: str(script))
    monkeypatch.setattr(kernel_build, "HERE", tmp_path / "here")
    (tmp_path / "here").mkdir()
    for name in kernel_build.SOURCES:
        (tmp_path / "here" / name).write_text("")


def test_a_build_that_fails_on_kept_objects_is_tried_once_more_from_nothing(tmp_path, monkeypatch):
    _fake_cmake(tmp_path, monkeypatch)
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "build").mkdir(parents=True)
    (work / "build" / "stale").write_text("")
    out.mkdir()
    kernel_build._run_cmake(out, work)
    assert (out / "_ext.fake.so").exists() and not (work / "build" / "stale").exists()
    assert [line.split()[0] for line in (tmp_path / "calls").read_text().splitlines()] == ["-S", "-S", "--build"]


def test_a_build_that_fails_from_nothing_says_why_once(tmp_path, monkeypatch):
    _fake_cmake(tmp_path, monkeypatch, build='echo "qmm.cpp:3: error: expected \';\'"; exit 2')
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    with pytest.raises(kernel_build.BuildError, match=r"^qmm.cpp:3: error: expected ';' \(full log: "):
        kernel_build._run_cmake(out, work)
    assert [line.split()[0] for line in (tmp_path / "calls").read_text().splitlines()] == ["-S", "--build"]


def test_each_toolchain_has_its_own_cmake_folder(monkeypatch):
    monkeypatch.delenv("TINY_LLM_PORTABLE", raising=False)
    native = kernel_build.work_dir()
    monkeypatch.setenv("TINY_LLM_PORTABLE", "1")
    assert kernel_build.work_dir() != native
    assert kernel_build.work_dir().parent == native.parent
