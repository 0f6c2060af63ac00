"""What the benchmark scripts share: the machine they ran on, and writing their numbers."""

import argparse
import datetime
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

import mlx.core as mx


def machine_info(**extra) -> dict:
    """The platform, processor, core count, MLX device and versions, the date (UTC), the
    command that ran and the load average (1, 5, 15 minutes: other processes on the machine)
    when this is called, plus `extra` (scripts/plot_benchmarks.py captions figures with them)."""
    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").is_file():
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    return dict(platform=platform.platform(), machine=platform.machine(), processor=cpu,
                cpu_count=os.cpu_count(), device=str(mx.default_device()), mlx=mx.__version__,
                mlx_lm=metadata.version("mlx-lm"), python=platform.python_version(),
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
                command=" ".join(["python", *sys.argv]), load_average=os.getloadavg(), **extra)


def write_json(path: str | None, **data) -> None:
    """Write `data` to `path` as JSON (nothing when `path` is None)."""
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
        print(f"wrote {path}")


def add_run_arguments(parser: argparse.ArgumentParser, *, repeats: int, quick: str) -> None:
    """The options every benchmark has: `--repeats`, `--quick` (a smoke run, described by
    `quick`) and `--json`."""
    parser.add_argument("--repeats", type=int, default=repeats, help=f"timed runs per cell (default {repeats})")
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--json", default=None, help="write the numbers and machine info to this file")
