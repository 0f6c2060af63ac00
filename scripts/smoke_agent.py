"""A smoke run of the coding agent with a real model: `tiny-llm agent run` with the default
model (or `--model`) on a copy of an example task's workspace, within small limits. It
checks what a real run must hold whatever the model decides: the run ends within its limits,
every proposal in the log parsed as an action (the schema is enforced while decoding), and
nothing outside the workspace copy changed. What the model achieved is printed, not judged.

    python scripts/smoke_agent.py [--task examples/agent-tasks/fix-off-by-one] [--steps 3] [--model M]
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default=str(ROOT / "examples" / "agent-tasks" / "fix-off-by-one"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    task = json.loads((Path(args.task) / "task.json").read_text())
    with tempfile.TemporaryDirectory(prefix="tiny-llm-agent-smoke-") as tmp:
        workspace, log = Path(tmp) / "workspace", Path(tmp) / "run.jsonl"
        shutil.copytree(Path(args.task) / "workspace", workspace)
        argv = [sys.executable, "-m", "tiny_llm", "agent", "run", "--workspace", str(workspace),
                "--max-steps", str(args.steps), "--seconds", "300", "--seed", "0", "--log", str(log)]
        for command in task.get("allowed_commands", []):
            argv += ["--allow-command", command]
        for pattern in task.get("editable_paths", []):
            argv += ["--editable", pattern]
        if args.model:
            argv += ["--model", args.model]
        start = time.perf_counter()
        done = subprocess.run(argv + [task["prompt"]], capture_output=True, text=True, timeout=900)
        seconds = time.perf_counter() - start
        if done.returncode not in (0, 1):  # 0: finished, 1: a limit or a model error
            print(done.stderr, file=sys.stderr)
            print(f"smoke_agent: the run ended with exit status {done.returncode}", file=sys.stderr)
            return 1
        events = [json.loads(line) for line in log.read_text().splitlines()]
        proposals = [e for e in events if e["kind"] == "proposal"]
        invalid = [e for e in events if e["kind"] == "observation" and str(e.get("text", "")).startswith("invalid action")]
        kinds = [e["kind"] for e in events]
        print(f"agent smoke: {len(proposals)} proposals in {seconds:.0f} s, {len(invalid)} invalid, "
              f"ended with {kinds[-1]!r}; cached prompt tokens at each step: "
              f"{[e.get('cached_tokens', 0) for e in proposals]}")
        problems = []
        if len(proposals) > args.steps:
            problems.append(f"{len(proposals)} proposals under a limit of {args.steps} steps")
        if invalid:
            problems.append(f"{len(invalid)} proposals did not parse: {invalid[0].get('text')!r}")
        if kinds[-1] not in ("finish", "limit"):
            problems.append(f"the log ends with {kinds[-1]!r}, not a finish or a limit")
        for problem in problems:
            print(f"smoke_agent: {problem}", file=sys.stderr)
        return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
