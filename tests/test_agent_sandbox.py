"""The agent's commands in the operating system's sandbox, tried as a hostile model would:
through the real `tiny-llm agent run`, with a scripted model and with an OpenAI-compatible
endpoint on 127.0.0.1, an allowed `python3` tries to write and read outside the workspace,
reach the network, fork without end, take 4 GiB, write past the file size limit, run forever
and outlive its step. Each attempt is contained, recorded in the log, and the run goes on;
`agent undo` puts back every byte a command deleted; a killed agent leaves no command
running, and its resumed run applies a command's effect exactly once.

Needs bubblewrap (`bwrap`; `make setup` and `.ci/run` install it) and week 4 days 1–3."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from http.server import HTTPServer
from pathlib import Path

import pytest

from test_week4_day1 import FakeEndpoint
from tiny_llm.agent.loop import RunLog
from tiny_llm.agent.sandbox import find_sandbox
from tiny_llm.cli import main

SECRET = "TOPSECRET-7f3a"  # a file outside the workspace holds it; no model may ever see it
MARKER = "tiny-llm-detached-7f3a"  # in the command line of the process that tries to outlive its step


@pytest.fixture(autouse=True)
def real_sandbox():
    sandbox, why = find_sandbox()
    assert sandbox is not None, f"these tests need the real sandbox: {why}"


@pytest.fixture
def place(tmp_path):
    """A workspace with two files, a folder beside it holding a secret, and a script file."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir(), outside.mkdir()
    (ws / "app.py").write_text("print('hello')\n")
    (ws / "data").mkdir()
    (ws / "data" / "table.csv").write_bytes(bytes(range(256)) * 40)
    (outside / "secret.txt").write_text(SECRET + "\n")
    return ws, outside


def python(code: str) -> dict:
    return {"tool": "run", "args": {"command": ["python3", "-c", code]}}


def finish() -> dict:
    return {"tool": "finish", "args": {"summary": "done"}}


def agent(tmp_path, ws, actions, *flags, log="run.jsonl", capsys=None):
    script = tmp_path / f"{log}.script.json"
    script.write_text(json.dumps(actions))
    argv = ["agent", "run", "--workspace", str(ws), "--allow-command", "python3", "--scripted", str(script),
            "--log", str(tmp_path / log), *flags, "attack"]
    status = main(argv)
    return status, RunLog.read(tmp_path / log)


def observations(events) -> list[str]:
    return [e.data["text"] for e in events if e.kind == "observation"]


def listener():
    """A TCP server on 127.0.0.1 that counts the connections it accepts."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted = []

    def accept():
        while True:
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return server, accepted


def test_writes_and_reads_outside_and_the_network_are_contained(tmp_path, place):
    ws, outside = place
    server, accepted = listener()
    port = server.getsockname()[1]
    attacks = [
        python("open('../outside/relative.txt', 'w').write('x')"),
        python(f"open('{outside}/absolute.txt', 'w').write('x')"),
        python("open('/proc/self/cwd/../outside/proc.txt', 'w').write('x')"),
        python("import os; os.symlink('../outside', 'door'); open('door/link.txt', 'w').write('x')"),
        python(f"import os; os.symlink('{outside}', 'door2'); open('door2/link2.txt', 'w').write('x')"),
        python("print(open('../outside/secret.txt').read())"),
        python(f"print(open('{outside}/secret.txt').read())"),
        python("import os; print(sorted(os.listdir(os.path.expanduser('~'))), sorted(os.listdir('..')))"),
        python(f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('connected')"),
        python("import urllib.request; urllib.request.urlopen('http://pypi.org/', timeout=3); print('connected')"),
        python("print(open('app.py').read())"),  # the workspace itself stays readable
        finish(),
    ]
    try:
        status, events = agent(tmp_path, ws, attacks)
    finally:
        server.close()
    assert status == 0 and events[-1].kind == "finish"  # every attack was a step; the run went on
    seen = observations(events)
    assert len(seen) == len(attacks) - 1
    assert sorted(os.listdir(outside)) == ["secret.txt"]  # nothing written outside
    assert not any(SECRET in text for text in seen)  # nor read
    assert all("No such file or directory" in seen[i] for i in range(7)), seen[:7]
    assert seen[7].startswith("[] ['ws']")  # an empty home; beside the workspace, nothing
    assert "connected" not in seen[8] and "ConnectionRefusedError" in seen[8]
    assert "connected" not in seen[9] and "URLError" in seen[9]
    assert accepted == []
    assert seen[10] == "print('hello')\n\n[exit status 0]\n"


def test_a_secret_outside_never_reaches_a_hostile_endpoint(tmp_path, place):
    """The model behind an endpoint asks to read the secret every way it can; every request
    the agent sends afterwards is searched for it."""
    ws, outside = place
    plan = [python("print(open('../outside/secret.txt').read())"),
            python(f"import glob; print([open(p).read() for p in glob.glob('{outside}/*')])"),
            python("import subprocess; print(subprocess.run(['cat', '../outside/secret.txt'], capture_output=True))"),
            finish()]
    class Endpoint(FakeEndpoint):  # answers each request with the plan's next action
        requests = []

        @property
        def reply(self):
            return json.dumps(plan[min(len(self.requests), len(plan)) - 1])

    server = HTTPServer(("127.0.0.1", 0), Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status = main(["agent", "run", "--workspace", str(ws), "--allow-command", "python3", "--log",
                       str(tmp_path / "run.jsonl"), "--base-url", f"http://127.0.0.1:{server.server_port}/v1",
                       "--model", "hostile", "Read the secret."])
    finally:
        server.shutdown()
        server.server_close()
    assert status == 0 and len(Endpoint.requests) == 4
    assert all(SECRET not in json.dumps(body) for body in Endpoint.requests)
    assert SECRET not in (tmp_path / "run.jsonl").read_text()


def test_resource_attacks_are_cut_off_by_the_limits(tmp_path, place):
    ws, _ = place
    attacks = [
        python("import os\nfor _ in range(40):\n    os.fork()"),  # 2**40 processes, if nothing stopped it
        python("b = bytearray(4 << 30); print('allocated', len(b))"),
        python("f = open('big.bin', 'wb')\nfor _ in range(3):\n    f.write(b'x' * (1 << 20))"),
        python("while True:\n    pass"),
        python("print('still working')"),
        finish(),
    ]
    status, events = agent(tmp_path, ws, attacks, "--command-seconds", "3", "--command-file-mb", "2",
                           "--command-processes", "64")
    assert status == 0 and events[-1].kind == "finish"
    bomb, memory, size, forever, after = observations(events)
    assert "BlockingIOError" in bomb or "Resource temporarily unavailable" in bomb, bomb
    assert "MemoryError" in memory and "allocated" not in memory
    assert "File too large" in size and (ws / "big.bin").stat().st_size == 2 << 20
    assert forever == "[timed out after 3 s: killed, exit status -9]\n"
    assert after == "still working\n[exit status 0]\n"


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_nothing_a_command_starts_outlives_its_step(tmp_path, place):
    ws, _ = place
    # A double fork with a new session: the grandchild is nobody's child and in no group of ours.
    detach = (f"import os, time, sys\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30)', '{MARKER}'])\n"
              f"    os._exit(0)\ntime.sleep(0.5)\nprint('parent done')")
    setsid = python(f"import subprocess, sys; subprocess.Popen(['setsid', sys.executable, '-c', "
                    f"'import time; time.sleep(30)', '{MARKER}']); print('started')")
    status, events = agent(tmp_path, ws, [python(detach), setsid, finish()])
    assert status == 0
    assert [t.splitlines()[0] for t in observations(events)] == ["parent done", "started"]
    assert processes_with(MARKER) == []


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_undo_restores_every_byte_a_command_deleted(tmp_path, place, capsys):
    ws, _ = place
    before = tree(ws)
    wipe = python("import shutil, os\nfor p in os.listdir('.'):\n"
                  "    shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)\nopen('new.txt', 'w').write('x')")
    status, events = agent(tmp_path, ws, [python("open('app.py', 'a').write('# more\\n')"), wipe, finish()])
    assert status == 0 and tree(ws) == {"new.txt": b"x"}
    capsys.readouterr()
    assert main(["agent", "undo", str(tmp_path / "run.jsonl"), "--workspace", str(ws), "--to-step", "1"]) == 0
    assert tree(ws) == {**before, "app.py": before["app.py"] + b"# more\n"}  # before step 1
    assert ": 2 files restored, 1 removed\n" in capsys.readouterr().out
    assert main(["agent", "undo", str(tmp_path / "run.jsonl"), "--workspace", str(ws)]) == 0
    assert tree(ws) == before  # before the run
    assert capsys.readouterr().out.endswith(": 1 file restored, 0 removed\n  restored app.py\n")
    undos = [e for e in RunLog.read(tmp_path / "run.jsonl") if e.kind == "steer"]
    assert [u.data["undo"]["to_step"] for u in undos] == [1, 0]  # each undo is logged
    assert undos[0].data["undo"] == {"to_step": 1, "written": ["app.py", "data/table.csv"], "removed": ["new.txt"]}


def test_undo_refuses_a_step_the_run_does_not_have(tmp_path, place, capsys):
    ws, _ = place
    agent(tmp_path, ws, [python("print(1)"), finish()])
    capsys.readouterr()
    assert main(["agent", "undo", str(tmp_path / "run.jsonl"), "--workspace", str(ws), "--to-step", "9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tiny-llm: error: --to-step: a step of this run, 0 to 2, got 9") and err.count("\n") == 1


# Each case mostly waits for its slow command: in the group of the tests that mostly wait
# (test_serve_soak.py's), they run one after the other on one test worker while the other
# worker has the machine.
@pytest.mark.xdist_group("waits")
@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "unsandboxed"])
def test_a_killed_agent_leaves_no_command_and_resume_applies_it_once(tmp_path, place, sandboxed):
    """kill -9 of the agent while a slow command runs, then an immediate resume: the command
    appends its line exactly once (the sandbox dies with the agent; unsandboxed, the resumed
    run kills the command the dead agent left before it looks at the files)."""
    ws, _ = place
    # Slow enough that the resumed agent (a new Python process) starts while it still runs,
    # and outlives the 5 s the resumed run waits for it to end once killed.
    # Unique to this call: another run of the tests (a course check beside this one) may
    # have a temporary folder of the same name.
    marker = f"tiny-llm-resumed-{uuid.uuid4().hex}"
    slow = python(f"import time; time.sleep(8); open('lines.txt', 'a').write('line\\n')  # {marker}")
    script = tmp_path / "script.json"
    script.write_text(json.dumps([slow, finish()]))
    log = tmp_path / "run.jsonl"
    cli = [sys.executable, "-m", "tiny_llm.cli", "agent", "run", "--workspace", str(ws), "--allow-command", "python3",
           "--scripted", str(script)] + ([] if sandboxed else ["--unsandboxed-commands"])
    env = dict(os.environ)
    if not sandboxed:  # a PATH without bwrap: no sandbox can be made
        bare = tmp_path / "bin"
        bare.mkdir()
        os.symlink(sys.executable, bare / "python3")
        env["PATH"] = str(bare)
    agent_proc = subprocess.Popen(cli + ["--log", str(log), "append a line"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 60
    while '"intent"' not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and agent_proc.poll() is None
        time.sleep(0.05)
    time.sleep(0.5)  # the command is running now
    agent_proc.send_signal(signal.SIGKILL)
    agent_proc.wait()
    resumed = subprocess.run(cli + ["--resume", str(log)], capture_output=True, text=True, timeout=120, env=env)
    assert resumed.returncode == 0, resumed.stderr
    # The resumed run took over 8 s (its own command): a command the dead agent left would
    # have appended its line by now, or be running still.
    assert processes_with(marker) == []
    assert (ws / "lines.txt").read_text() == "line\n"
    events = RunLog.read(log)
    settled = [e for e in events if e.kind == "observation"]
    assert len(settled) == 1 and settled[0].step == 0 and events[-1].kind == "finish"


def test_without_a_sandbox_commands_are_refused_unless_allowed_unsandboxed(tmp_path, place, monkeypatch, capsys):
    ws, _ = place
    bare = tmp_path / "bin"
    bare.mkdir()
    os.symlink(shutil.which("python3", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]),
               bare / "python3")
    monkeypatch.setenv("PATH", str(bare))  # no bwrap on it
    status, events = agent(tmp_path, ws, [python("print('ran')"), finish()], "--verbose")
    err = capsys.readouterr().err
    assert "sandbox: none, commands are refused (no sandbox: bubblewrap (bwrap) is not installed;" in err
    first = observations(events)[0]
    assert first.startswith("run: no sandbox: bubblewrap (bwrap) is not installed; install bubblewrap")
    assert "--unsandboxed-commands" in first and len(first.strip().splitlines()) == 1
    status, events = agent(tmp_path, ws, [python("print('ran')"), finish()], "--unsandboxed-commands",
                           log="open.jsonl")
    assert observations(events)[0] == "ran\n[exit status 0; not sandboxed (--unsandboxed-commands)]\n"


def test_readable_folders_are_the_programs_installations_not_the_users_folders(tmp_path):
    from tiny_llm.agent.sandbox import readable_folders

    prefix = tmp_path / "tools" / "py"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "tool").write_text("")
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "bin").mkdir()
    (tmp_path / "ws" / "bin" / "own").write_text("")
    (tmp_path / "link").symlink_to(prefix / "bin" / "tool")
    found = readable_folders([str(tmp_path / "link"), str(tmp_path / "ws" / "bin" / "own"), "/usr/bin/env"],
                             keep_out=[tmp_path / "ws"])
    # The link's own folder is nobody's installation: the link alone; its target's whole
    # installation; a program inside the workspace: that file only; /usr: bound already.
    assert found == (tmp_path / "link", prefix, tmp_path / "ws" / "bin" / "own")


def test_the_seatbelt_profile_holds_the_same_policy():
    from tiny_llm.agent.sandbox import Policy, seatbelt_profile

    profile = seatbelt_profile(Policy(Path('/Users/a/w"s'), (Path("/opt/py"),), Path("/private/tmp/h")))
    lines = profile.splitlines()
    assert lines[:2] == ["(version 1)", "(deny default)"] and "(deny network*)" in lines
    write = profile[profile.index("(allow file-write*"):]
    write = write[:write.index(")\n(") + 1]
    assert '(subpath "/Users/a/w\\"s")' in write and '(subpath "/private/tmp/h")' in write
    assert "/opt/py" not in write and "/usr" not in write  # readable, not writable
    read = profile[profile.index("(allow file-read*"):profile.index("(allow file-write*")]
    assert '(subpath "/opt/py")' in read and '(subpath "/usr")' in read and "/Users/a\n" not in read
    assert profile.count("(") == profile.count(")")
