"""Engine — running across ranks: the process group, what the ranks must agree on, and
reading only a rank's slices of a checkpoint.

`mlx.launch --backend ring -n 2 -- tiny-llm generate ...` starts one process per rank
with `MLX_RANK` and `MLX_HOSTFILE` set; `group()` joins them (MLX's ring backend over
TCP). Every rank runs the same program on the same input: the model is sharded
(`tensor_parallel.py`), each sub-layer ends in an `all_sum`, so all ranks hold the same
logits and draw the same tokens. What could still differ is made equal here: fresh seeds
come from one stream that rank 0 seeds (`fresh_seed`), and the ranks check that they
loaded the same model (`agree`). Rank 0 alone prints.

Tests: tests/test_distributed.py, tests/test_week3_day5.py
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import secrets
from collections.abc import Mapping
from pathlib import Path

import mlx.core as mx
import numpy as np

_group: mx.distributed.Group | None = None
_seeds: random.Random | None = None  # the ranks' shared stream of fresh seeds, once joined


def launched() -> bool:
    """Whether this process was started as one rank of several (by `mlx.launch`; with one
    rank, `mlx.launch -n 1`, its host file is empty and the process runs alone)."""
    hostfile = os.environ.get("MLX_HOSTFILE")
    if "MLX_RANK" not in os.environ or not hostfile:
        return False
    try:
        return bool(Path(hostfile).read_text().strip())
    except OSError:
        return False


def group() -> mx.distributed.Group | None:
    """The group of ranks this process belongs to, joined on first use; None when the
    process runs alone. Joining also seeds the shared stream of fresh seeds from rank 0."""
    global _group, _seeds
    if _group is None and launched():
        _group = mx.distributed.init(strict=True, backend="ring")
        if _group.size() > 1:
            _seeds = random.Random(broadcast_int(secrets.randbits(31)))
            quiet_launcher()
    return _group if _group is not None and _group.size() > 1 else None


def quiet_launcher(parent: int | None = None) -> bool:
    """Lower to nice 19 every thread of the `mlx.launch` process that started this rank (on
    Linux; elsewhere, or under another parent, nothing is done). Returns whether it did.

    MLX's launcher relays its ranks' output in loops that never block: each rank's thread
    polls a pipe that is always writable, and the main thread polls its standard input,
    which is always readable once at its end. That is a core per rank, taken from the
    ranks themselves on a machine with few cores. At nice 19 the launcher runs only where a
    core would be idle. It is called once the ring is joined, when every rank's process has
    been started (a process started by a thread takes that thread's priority)."""
    parent = os.getppid() if parent is None else parent
    try:
        argv = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
        threads = [int(t) for t in os.listdir(f"/proc/{parent}/task")]
    except (OSError, ValueError):
        return False
    if not any(a.endswith(b"mlx.launch") or a == b"mlx._distributed_utils.launch" for a in argv[:3]):
        return False
    for thread in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, thread, 19)
        except OSError:  # ended meanwhile
            pass
    return True


def rank() -> int:
    g = group()
    return g.rank() if g else 0


def fresh_seed() -> int:
    """A seed for a row that asked for none: fresh entropy alone; across ranks the same
    value on every rank (they draw their seeds in the same order), so that their draws,
    and so their caches, stay the same."""
    if _seeds is not None:
        return _seeds.getrandbits(32)
    return secrets.randbits(32)


def broadcast_int(value: int) -> int:
    """Rank 0's `value` (< 2**31), on every rank."""
    g = mx.distributed.init()
    mine = mx.array([value if g.rank() == 0 else 0], dtype=mx.int32)
    return int(mx.distributed.all_sum(mine, group=g, stream=mx.cpu).item())


def agree(fingerprint: bytes, what: str) -> None:
    """Raise `ValueError` unless every rank passes the same `fingerprint` (8 bytes or more;
    the first 8 are compared), naming the first rank that differs from rank 0."""
    g = group()
    if g is None:
        return
    mine = mx.array(np.frombuffer(fingerprint[:8], dtype=np.int32).copy())[None]  # 1, 2
    every = mx.distributed.all_gather(mine, group=g, stream=mx.cpu).tolist()  # world, 2
    for r, theirs in enumerate(every):
        if theirs != every[0]:
            raise ValueError(f"the ranks disagree on {what}: rank {r} has another one than rank 0")


def model_fingerprint(directory: Path) -> bytes:
    """What identifies a model directory: its config and the names and sizes of its weight files."""
    h = hashlib.sha256((directory / "config.json").read_bytes())
    for f in sorted(directory.glob("*.safetensors")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.digest()


def lost_peer(error: BaseException) -> bool:
    """Whether `error` is MLX's ring backend reporting that another rank went away."""
    return isinstance(error, RuntimeError) and str(error).startswith("[ring]")


# ---- reading slices of a safetensors file ----------------------------------------------------

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U32": np.uint32, "I32": np.int32,
           "I64": np.int64, "U8": np.uint8, "I8": np.int8, "BOOL": np.bool_, "U16": np.uint16}


class SafetensorsFile:
    """A safetensors file opened for reading parts of its tensors: a JSON header, then each
    tensor's bytes in row-major order. `read(name, axis, start, stop)` maps the file and
    copies only the rows (or the columns of every row) asked for, so a rank reads its share
    of the checkpoint and not the rest."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            self.header = {k: v for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}
        self.base = 8 + n

    def names(self) -> list[str]:
        return list(self.header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def read(self, name: str, axis: int | None = None, start: int = 0, stop: int = 0) -> mx.array:
        info = self.header[name]
        kind = info["dtype"]
        if kind not in _DTYPES:
            raise ValueError(f"{self.path}: tensor {name!r} has dtype {kind}, which tiny-llm does not read")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if begin == end:
            data = np.zeros(shape, dtype=_DTYPES[kind])
        else:
            data = np.memmap(self.path, dtype=_DTYPES[kind], mode="r", offset=self.base + begin, shape=shape)
        if axis is not None:
            index = [slice(None)] * len(shape)
            index[axis] = slice(start, stop)
            data = data[tuple(index)]
        out = mx.array(np.ascontiguousarray(data))
        return out.view(mx.bfloat16) if kind == "BF16" else out


def read_shard(files: list[Path], slices: Mapping, quantization: Mapping | None, rank: int) -> dict[str, mx.array]:
    """The tensors of a checkpoint as rank `rank` keeps them: each `Slice` of `slices`
    (keyed by the weight's name in the stacked layout, in logical columns) read from the
    files, packed quantized tensors and per-expert tensors included."""
    from .tensor_parallel import COLUMNS

    out: dict[str, mx.array] = {}
    for path in files:
        f = SafetensorsFile(path)
        for name in f.names():
            module, _, kind = name.rpartition(".")
            key = stacked = module + (".bias" if kind == "bias" else ".weight")
            if ".mlp.experts." in key:  # one expert of a Hugging Face checkpoint
                head, tail = key.split(".mlp.experts.", 1)
                stacked = f"{head}.mlp.switch_mlp.{tail.split('.', 1)[1]}"
            s = slices.get(stacked)
            if s is None:
                out[name] = f.read(name)
                continue
            if s.first_rank_only:
                tensor = f.read(name)
                out[name] = tensor if rank == 0 else mx.zeros_like(tensor)
                continue
            start, stop = s.start, s.stop
            if s.axis == COLUMNS and kind in ("weight", "scales", "biases") and quantization and (
                    module + ".scales") in f.header:
                stacked_module = stacked.rpartition(".")[0]  # overrides name experts by their stack
                params = quantization.get(module) or quantization.get(stacked_module)
                params = params if isinstance(params, Mapping) else quantization
                group_size, bits = int(params.get("group_size", 64)), int(params.get("bits", 4))
                per = group_size if kind != "weight" else 32 // bits
                start, stop = start // per, stop // per
            out[name] = f.read(name, s.axis, start, stop)
    return out
