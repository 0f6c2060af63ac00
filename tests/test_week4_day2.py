"""Week 4, day 2: the workspace — tools behind one policy boundary, bounded outputs kept whole
by their SHA-256, receipts for every effect, and a property test that no sequence of tool
calls reads or writes outside the root."""

import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tiny_llm.agent.actions import check_value
from tiny_llm.agent.boundary import PolicyError
from tiny_llm.agent.core import Action, Receipt, ToolError
from tiny_llm.agent.tools import MAX_MATCHES
from tiny_llm.agent.workspace import Workspace, replace_once
from tiny_llm.constrain import Grammar

SECRET = b"TOP-SECRET-CONTENT-9d2f\n"
A_TXT = b"alpha\nbeta\ngamma\n"
APP = b"x = 1\ny = 2\n"
UTIL = b"def f():\n    return 'x = 1'\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_tree(base: Path) -> tuple[Path, Path]:
    """A workspace `base/ws` and, beside it, `base/outside` with a secret; the workspace holds
    symlinks that lead out (every way) and some that stay inside. Returns (root, secret)."""
    outside, root = base / "outside", base / "ws"
    (outside / "dir").mkdir(parents=True)
    secret = outside / "secret.txt"
    secret.write_bytes(SECRET)
    (outside / "dir" / "x.txt").write_bytes(SECRET)
    (root / "src").mkdir(parents=True)
    (root / "notes").mkdir()
    (root / "a.txt").write_bytes(A_TXT)
    (root / "src" / "app.py").write_bytes(APP)
    (root / "src" / "util.py").write_bytes(UTIL)
    (root / "notes" / "todo.md").write_bytes(b"- ship it\n")
    links = {
        "out_file": str(secret),  # absolute, to a file outside
        "out_dir": str(outside),  # absolute, to a folder outside
        "rel_out": "../outside/secret.txt",  # relative, out
        "up": "..",  # the root's parent
        "chain": "rel_out",  # inside, to a symlink that leads out
        "out_back": "../ws/a.txt",  # leaves and comes back: refused too
        "dev": "/dev/null",  # a device file outside
        "loop": "loop",
        "in_link": "a.txt",  # inside, relative
        "src_link": "src",  # a folder inside
        "abs_in": str(root / "a.txt"),  # inside, absolute
    }
    for name, target in links.items():
        os.symlink(target, root / name)
    os.mkfifo(root / "fifo")
    return root, secret


@pytest.fixture
def tree(tmp_path):
    return make_tree(tmp_path)


@pytest.fixture
def ws(tree, tmp_path):
    return Workspace(tree[0], allowed_commands=["echo", "python"], blob_dir=tmp_path / "blobs")


def act(ws: Workspace, tool: str, **args):
    return ws.perform(Action(tool, args))


# ---- the tools ------------------------------------------------------------------------------

def test_list_shows_folders_files_and_symlinks_without_following_them(ws):
    obs = act(ws, "list")
    assert obs.ok and obs.receipt is None
    assert obs.text == ("a.txt\nabs_in@\nchain@\ndev@\nfifo|\nin_link@\nloop@\nnotes/\nnotes/todo.md\nout_back@\n"
                        "out_dir@\nout_file@\nrel_out@\nsrc/\nsrc/app.py\nsrc/util.py\nsrc_link@\nup@\n")
    assert act(ws, "list", path="src", depth=1).text == "src/app.py\nsrc/util.py\n"
    assert act(ws, "list", path="src_link").text == "src/app.py\nsrc/util.py\n"  # the real path
    assert act(ws, "list", path="./notes/todo.md").text == "notes/todo.md\n"
    (ws.root / "empty").mkdir()
    assert act(ws, "list", path="empty").text == "(empty)\n"
    assert act(ws, "list", path="nope").text == 'list: "nope" does not exist'


def test_read_whole_files_and_line_ranges(ws):
    assert act(ws, "read", path="a.txt").text == "alpha\nbeta\ngamma\n"
    assert act(ws, "read", path="a.txt", start_line=2).text == "beta\ngamma\n"
    assert act(ws, "read", path="a.txt", start_line=2, end_line=2).text == "beta\n"
    assert act(ws, "read", path="a.txt", end_line=99).text == "alpha\nbeta\ngamma\n"
    assert act(ws, "read", path="in_link", start_line=3).text == "gamma\n"
    assert act(ws, "read", path="src_link/app.py").text == "x = 1\ny = 2\n"
    assert act(ws, "read", path="abs_in").text == "alpha\nbeta\ngamma\n"  # absolute, but inside
    failures = {
        ("a.txt", 4, None): 'read: start_line 4 is past the end of "a.txt" (3 lines)',
        ("a.txt", 3, 2): "read: end_line 2 is before start_line 3",
        ("src", 1, None): 'read: "src" is a folder; use list',
        ("missing.txt", 1, None): 'read: "missing.txt" does not exist',
    }
    for (path, start, end), reason in failures.items():
        args = {"path": path, "start_line": start} | ({"end_line": end} if end else {})
        obs = ws.perform(Action("read", args))
        assert (obs.ok, obs.text) == (False, reason)


def test_search_text_and_regex_with_bounded_results(ws):
    assert act(ws, "search", pattern="x = 1").text == "src/app.py:1:x = 1\nsrc/util.py:2:    return 'x = 1'\n"
    assert act(ws, "search", pattern=r"^[xy] = \d$", regex=True).text == "src/app.py:1:x = 1\nsrc/app.py:2:y = 2\n"
    assert act(ws, "search", pattern="a", path="notes").text == "no matches\n"
    assert act(ws, "search", pattern="eta", path="in_link").text == "a.txt:2:beta\n"
    assert act(ws, "search", pattern="[", regex=True).text.startswith("search: bad regular expression: ")
    # Line numbers are the ones read counts (a form feed does not end a line).
    (ws.root / "ff.txt").write_bytes(b"page\x0cbreak\nTARGET\n")
    assert act(ws, "search", pattern="TARGET").text == "ff.txt:2:TARGET\n"
    assert act(ws, "read", path="ff.txt", start_line=2).text == "TARGET\n"
    # Symlinks are never followed while searching: the secret behind out_file stays unread.
    assert act(ws, "search", pattern="SECRET").text == "no matches\n"
    (ws.root / "big.txt").write_text("hit\n" * (MAX_MATCHES + 50))
    (ws.root / "a.bin").write_bytes(b"hit\0hit\n")  # binary files are skipped
    assert act(ws, "search", pattern="hit").text == \
        "".join(f"big.txt:{i}:hit\n" for i in range(1, MAX_MATCHES + 1)) + \
        f"[search stopped at {MAX_MATCHES} matches]\n"


def test_regex_search_is_one_pass_with_re_search_meaning(ws):
    """`(a+)+$` on 40 a's and a b backtracks for minutes in Python's `re`; the search's
    automaton reads the line once. Patterns keep `re.search`'s meaning (anywhere in a line,
    `^` and `$` per branch), and what the automaton cannot do is a one-line refusal."""
    (ws.root / "long.txt").write_text("a" * 40 + "b\n" + "a" * 40 + "\n")
    assert act(ws, "search", pattern="(a+)+$", regex=True, path="long.txt").text == f"long.txt:2:{'a' * 40}\n"
    (ws.root / "mix.txt").write_text("def f(x):\n    return x + 1  # one\nclass C: pass\nTODO: fix f\n")
    for pattern, lines in [(r"^def \w+\(", [1]), (r"\d", [2]), (r"f|^class", [1, 3, 4]), (r"x \+ 1", [2]),
                           (r"pass$|^TODO", [3, 4]), (r"[A-Z]{4}:", [4]), (r"^\s+return", [2]), (r"^f", []),
                           (r"(on|OD)", [2, 4]), (r"e$", [2]), (r"(on|OD)e", [2])]:
        text = "".join(f"mix.txt:{n}:{(ws.root / 'mix.txt').read_text().splitlines()[n - 1]}\n" for n in lines)
        assert act(ws, "search", pattern=pattern, regex=True, path="mix.txt").text == (text or "no matches\n"), pattern
    for pattern, why in [
        (r"(a)\1", r"bad regular expression: backreferences are not supported (position 3 in '(a)\\1')"),
        (r"x(?=y)", "bad regular expression: lookaround assertions are not supported (position 1 in 'x(?=y)')"),
        (r"\bx", r"bad regular expression: word boundaries (\b, \B) are not supported (position 0 in '\\bx')"),
        ("a.{30}", 'the regular expression "a.{30}" needs too large an automaton (a long counted repetition, '
                   "such as .{30}?); search with a simpler one"),
    ]:
        obs = act(ws, "search", pattern=pattern, regex=True, path="mix.txt")
        assert (obs.ok, obs.text) == (False, f"search: {why}")


def test_edit_replaces_the_exact_old_text_and_leaves_a_receipt(ws):
    obs = act(ws, "edit", path="src/app.py", old="y = 2", new="y = 3")
    assert (obs.ok, obs.text) == (True, "edited src/app.py: 12 -> 12 bytes\n")
    assert (ws.root / "src" / "app.py").read_bytes() == b"x = 1\ny = 3\n"
    assert obs.receipt == Receipt("edit", {"path": "src/app.py", "old": "y = 2", "new": "y = 3"},
                                  {"src/app.py": sha(APP)}, {"src/app.py": sha(b"x = 1\ny = 3\n")}, None)
    # Through a symlink inside: the real file changes, and the receipt names it.
    obs = act(ws, "edit", path="in_link", old="beta\n", new="")
    assert (ws.root / "a.txt").read_bytes() == b"alpha\ngamma\n" and (ws.root / "in_link").is_symlink()
    assert obs.receipt.before == {"a.txt": sha(A_TXT)} and obs.receipt.after == {"a.txt": sha(b"alpha\ngamma\n")}
    assert json.loads(json.dumps(obs.receipt.to_json())) == obs.receipt.to_json()
    (ws.root / "run.sh").write_text("#!/bin/sh\necho 1\n")
    (ws.root / "run.sh").chmod(0o751)
    act(ws, "edit", path="run.sh", old="1", new="2")
    assert (ws.root / "run.sh").stat().st_mode & 0o777 == 0o751  # the file keeps its mode


@pytest.mark.parametrize("text, old, reason", [
    ("x = 1\n", "x = 2", "the old text does not occur in the file; read the file and copy the text exactly"),
    ("x = 1\nx = 1\n", "x = 1", "the old text occurs 2 times in the file; include more of the surrounding "
                                "text so that it occurs once"),
    ("aaa", "aa", "the old text occurs 2 times in the file; include more of the surrounding text so that it "
                  "occurs once"),  # overlapping occurrences count
    ("abc", "", "the old text is empty; give the exact text to replace"),
])
def test_replace_once_refuses_unless_the_old_text_occurs_exactly_once(text, old, reason):
    with pytest.raises(ToolError) as e:
        replace_once(text, old, "new")
    assert str(e.value) == reason
    assert replace_once("a-b-c", "-b", "+B") == "a+B-c"
    assert replace_once("aaa", "aaa", "") == ""


def test_edit_refusals_leave_the_file_as_it_was(ws):
    for old, reason in [("x = 9", 'edit: the old text does not occur in "src/util.py"; read the file and copy '
                                  "the text exactly"),
                        ("f", 'edit: the old text occurs 2 times in "src/util.py"; include more of the '
                              "surrounding text so that it occurs once")]:
        obs = act(ws, "edit", path="src/util.py", old=old, new="z")
        assert (obs.ok, obs.text, obs.receipt) == (False, reason, None)
    assert act(ws, "edit", path="new.py", old="a", new="b").text == \
        'edit: "new.py" does not exist; use write to create a file'
    assert act(ws, "edit", path="src/util.py", old="", new="b").text == \
        "edit args.old must have 1 to any number of characters, got 0"
    assert ws.digest("src/util.py") == sha(UTIL)


def test_write_creates_new_files_only(ws):
    obs = act(ws, "write", path="pkg/sub/mod.py", content="print('hi')\n")
    assert (obs.ok, obs.text) == (True, "wrote pkg/sub/mod.py: 12 bytes\n")
    assert (ws.root / "pkg" / "sub" / "mod.py").read_bytes() == b"print('hi')\n"
    assert obs.receipt == Receipt("write", {"path": "pkg/sub/mod.py", "content": "print('hi')\n"},
                                  {"pkg/sub/mod.py": None}, {"pkg/sub/mod.py": sha(b"print('hi')\n")}, None)
    for path in ["a.txt", "in_link", "pkg/sub/mod.py"]:
        obs = act(ws, "write", path=path, content="over")
        assert (obs.ok, obs.text, obs.receipt) == (False, f'write: "{path}" exists; write makes new files only '
                                                          "(use edit)", None)
    assert ws.digest("a.txt") == sha(A_TXT)
    obs = act(ws, "write", path="ünï/日本.txt", content="é")
    assert obs.ok and obs.receipt.after == {"ünï/日本.txt": sha("é".encode())}


# ---- the policy boundary --------------------------------------------------------------------

REFUSED = {
    "../outside/secret.txt": '"../outside/secret.txt": \'..\' is refused; paths stay inside the workspace',
    "src/../a.txt": '"src/../a.txt": \'..\' is refused; paths stay inside the workspace',
    "/etc/passwd": '"/etc/passwd": absolute paths are refused; give a path relative to the workspace root',
    "out_file": '"out_file": the symlink "out_file" leads out of the workspace',
    "out_dir/secret.txt": '"out_dir/secret.txt": the symlink "out_dir" leads out of the workspace',
    "out_dir/dir/x.txt": '"out_dir/dir/x.txt": the symlink "out_dir" leads out of the workspace',
    "rel_out": '"rel_out": the symlink "rel_out" leads out of the workspace',
    "up/outside/secret.txt": '"up/outside/secret.txt": the symlink "up" leads out of the workspace',
    "chain": '"chain": the symlink "rel_out" leads out of the workspace',
    "out_back": '"out_back": the symlink "out_back" leads out of the workspace',
    "dev": '"dev": the symlink "dev" leads out of the workspace',
    "loop": '"loop": more than 40 symlinks (a loop?)',
    "fifo": '"fifo" is a FIFO; only regular files and folders are allowed',
    "": "the path is empty; give a path relative to the workspace root",
    "a\0b": '"a\\u0000b": a path cannot hold a NUL byte',
}


@pytest.mark.parametrize("path", list(REFUSED))
def test_every_tool_refuses_paths_that_leave_the_workspace(ws, tree, path):
    reason = REFUSED[path]
    assert "\n" not in reason
    with pytest.raises(PolicyError) as e:
        ws.resolve(path)
    assert str(e.value) == reason
    for tool, args in [("list", {}), ("read", {}), ("search", {"pattern": "S"}), ("edit", {"old": "S", "new": "x"}),
                       ("write", {"content": "x"})]:
        obs = ws.perform(Action(tool, {"path": path, **args}))
        assert (obs.ok, obs.text, obs.receipt) == (False, f"{tool}: {reason}", None)
    assert tree[1].read_bytes() == SECRET and sorted(p.name for p in tree[1].parent.rglob("*")) == [
        "dir", "secret.txt", "x.txt"]


def test_absolute_paths_are_refused_even_inside(ws):
    inside = str(ws.root / "a.txt")
    assert act(ws, "read", path=inside).text == \
        f'read: "{inside}": absolute paths are refused; give a path relative to the workspace root'


def test_sockets_and_hard_links_are_refused(ws, tree, monkeypatch):
    monkeypatch.chdir(ws.root)  # a short relative name: socket paths have a length limit
    with socket.socket(socket.AF_UNIX) as s:
        s.bind("sock")
        assert act(ws, "read", path="sock").text == \
            'read: "sock" is a socket; only regular files and folders are allowed'
    os.link(tree[1], ws.root / "hard")  # the secret's bytes, under a second name inside
    assert act(ws, "read", path="hard").text == \
        'read: "hard" has 2 hard links; it may share its bytes with a file outside the workspace'
    assert act(ws, "edit", path="hard", old="TOP", new="x").text.startswith('edit: "hard" has 2 hard links')
    assert tree[1].read_bytes() == SECRET


def test_writes_outside_the_editable_paths_are_refused(tree, tmp_path):
    ws = Workspace(tree[0], editable_paths=["src/**", "*.md", "docs/**/*.txt"], blob_dir=tmp_path / "blobs")
    allowed = ["src/new.py", "src/deep/er/x.py", "README.md", "docs/a.txt", "docs/x/y/b.txt"]
    for path in allowed:
        obs = act(ws, "write", path=path, content="ok\n")
        assert obs.ok, obs.text
        assert ws.touched(Action("write", {"path": path, "content": ""})) == [path]
    assert act(ws, "edit", path="src_link/app.py", old="x = 1", new="x = 2").receipt.after == \
        {"src/app.py": sha(b"x = 2\ny = 2\n")}  # the real path is what must be editable
    for path, tool in [("a.txt", "edit"), ("notes/todo.md", "edit"), ("in_link", "edit"), ("srcx/a.py", "write"),
                       ("docs/a.md", "write"), ("top.py", "write")]:
        obs = ws.perform(Action(tool, {"path": path, "old": "a", "new": "b"} if tool == "edit"
                                else {"path": path, "content": "x"}))
        assert obs.text == f'{tool}: "{path}" is outside the editable paths (src/**, *.md, docs/**/*.txt)'
    assert act(ws, "read", path="a.txt").ok  # reading is not editing
    assert ws.digest("a.txt") == sha(A_TXT) and not (ws.root / "top.py").exists()
    with pytest.raises(PolicyError, match="is the workspace root, not a file"):
        ws.resolve(".", write=True)


# ---- run ------------------------------------------------------------------------------------

def test_run_starts_allowed_commands_in_the_root_with_a_receipt(ws):
    obs = act(ws, "run", command=["echo", "hello", "world"])
    assert (obs.ok, obs.text) == (True, "hello world\n[exit status 0]\n")
    files = ["a.txt", "notes/todo.md", "src/app.py", "src/util.py"]
    digests = {"a.txt": sha(A_TXT), "notes/todo.md": sha(b"- ship it\n"), "src/app.py": sha(APP),
               "src/util.py": sha(UTIL)}
    assert ws.touched(Action("run", {"command": ["echo"]})) == files
    assert obs.receipt == Receipt("run", {"command": ["echo", "hello", "world"]}, digests, digests, 0, False, 0)
    code = "import os, pathlib; print(os.getcwd()); pathlib.Path('made.txt').write_text('m'); raise SystemExit(3)"
    obs = act(ws, "run", command=["python", "-c", code])
    assert (obs.ok, obs.text) == (False, f"{ws.root}\n[exit status 3]\n")
    assert obs.receipt.exit_status == 3
    assert obs.receipt.before == {**digests, "made.txt": None}
    assert obs.receipt.after == {**digests, "made.txt": sha(b"m")}


def test_run_refuses_commands_that_are_not_allowed(ws):
    """The tool's schema names the allowed commands (the grammar's enum), so its argument check
    refuses any other; the boundary refuses them too, for a caller that skips the check."""
    for argv in (["cat", "a.txt"], ["/bin/echo", "x"], ["sh", "-c", "echo x"], ["echo ", "x"]):
        obs = act(ws, "run", command=argv)
        assert (obs.ok, obs.text, obs.receipt) == (
            False, f'run args.command[0] must be one of ["echo", "python"], got {json.dumps(argv[0])}', None)
        assert ws.touched(Action("run", {"command": argv})) == []
        with pytest.raises(PolicyError, match=r"is not an allowed command \(allowed: echo, python\)"):
            ws.run_command(argv)
    none = Workspace(ws.root, blob_dir=ws.blob_dir)
    assert act(none, "run", command=["echo"]).text == 'run: "echo" is not an allowed command (allowed: none)'
    assert act(ws, "run", command=[]).text == "run args.command must have 1 to any number of items, got 0"
    missing = Workspace(ws.root, allowed_commands=["no-such-command-tiny-llm"], blob_dir=ws.blob_dir)
    obs = act(missing, "run", command=["no-such-command-tiny-llm"])
    assert (obs.text, obs.receipt) == ('run: "no-such-command-tiny-llm" is allowed but not found on PATH', None)


def test_run_stops_at_its_time_limit(tree, tmp_path):
    ws = Workspace(tree[0], allowed_commands=["python"], command_seconds=0.5, blob_dir=tmp_path / "blobs")
    obs = act(ws, "run", command=["python", "-c", "import time; print('started', flush=True); time.sleep(60)"])
    assert not obs.ok
    assert obs.text == "started\n[timed out after 0.5 s: killed, exit status -9]\n"
    assert (obs.receipt.exit_status, obs.receipt.timed_out, obs.receipt.dropped_bytes) == (-9, True, 0)


def test_a_commands_receipt_says_how_it_ended_and_its_text_is_made_from_that(tree, tmp_path, monkeypatch):
    """Exit status, time limit and the output dropped beyond what is kept are typed fields of
    the receipt, and the observation's closing lines are written from them."""
    from tiny_llm.agent import runner

    monkeypatch.setattr(runner, "KEEP_BYTES", 1000)
    ws = Workspace(tree[0], allowed_commands=["python"], output_bytes=2000, blob_dir=tmp_path / "blobs")
    obs = act(ws, "run", command=["python", "-c", "import sys; sys.stdout.write('x' * 1500); raise SystemExit(2)"])
    assert (obs.ok, obs.text) == (False, "x" * 1000 + "\n[500 more bytes of output were dropped]\n[exit status 2]\n")
    assert (obs.receipt.exit_status, obs.receipt.timed_out, obs.receipt.dropped_bytes) == (2, False, 500)
    assert obs.receipt.to_json()["timed_out"] is False and obs.receipt.to_json()["dropped_bytes"] == 500
    result = ws.run_command(["python", "-c", "print('out')"])
    assert (result.output, result.exit_status, result.timed_out, result.dropped_bytes) == (b"out\n", 0, False, 0)


def test_run_environment_holds_no_secrets_of_the_parent(ws, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-parent-secret")
    monkeypatch.setenv("HF_TOKEN", "hf_parent_secret")
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    obs = act(ws, "run", command=["python", "-c", code])
    assert obs.ok and "secret" not in obs.text
    env = json.loads(obs.text.splitlines()[0])
    # Python itself may add LC_CTYPE (locale coercion) and the sandbox PWD (the workspace,
    # where it starts the command); nothing else may appear.
    assert set(env) - {"LC_CTYPE", "PWD"} == {"PATH", "LANG", "HOME"}
    assert env.get("PWD", str(ws.root)) == str(ws.root)
    assert env["HOME"] != os.environ.get("HOME") and not env["HOME"].startswith(str(ws.root))
    assert not Path(env["HOME"]).exists()  # a fresh HOME per run, removed afterwards
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)


def test_run_never_finds_a_program_the_agent_planted(ws, monkeypatch):
    for folder in ("bin", "tools"):  # an `echo` of the agent's own, in two places of PATH
        planted = ws.root / folder / "echo"
        planted.parent.mkdir()
        planted.write_text("#!/bin/sh\necho PLANTED\n")
        planted.chmod(0o755)
    monkeypatch.setenv("PATH", os.pathsep.join(["bin", str(ws.root / "tools"), os.environ["PATH"]]))
    assert act(ws, "run", command=["echo", "real"]).text == "real\n[exit status 0]\n"
    env = json.loads(act(ws, "run", command=["python", "-c", "import json, os; print(json.dumps(dict(os.environ)))"])
                     .text.splitlines()[0])
    assert all(os.path.isabs(f) and not f.startswith(str(ws.root)) for f in env["PATH"].split(os.pathsep))


def test_large_outputs_are_cut_and_kept_whole_for_range_reads(tree, tmp_path):
    ws = Workspace(tree[0], allowed_commands=["python"], output_bytes=100, blob_dir=tmp_path / "blobs")
    lines = b"".join(b"line %03d\n" % i for i in range(120))  # 9 bytes a line, 1080 in all
    (ws.root / "long.txt").write_bytes(lines)
    blob = sha(lines)
    obs = act(ws, "read", path="long.txt")
    # The head ends after the last newline in its 50 bytes, the tail starts after the first
    # newline in its last 50; the note names the blob and the next range to read.
    assert obs.text == ("line 000\nline 001\nline 002\nline 003\nline 004\n"
                        f"[... 990 of 1080 bytes not shown; all of them are kept as blob {blob}: "
                        f'read {{"blob": "{blob}", "start": 45, "end": 145}} for the next ones]\n'
                        "line 115\nline 116\nline 117\nline 118\nline 119\n")
    assert (tmp_path / "blobs" / blob).read_bytes() == lines
    assert hashlib.sha256((tmp_path / "blobs" / blob).read_bytes()).hexdigest() == blob
    assert act(ws, "read", blob=blob, start=45, end=145).text == lines[45:145].decode()
    assert ws.read_blob(blob, 1000, 1100) == lines[1000:]  # past the end: to the end
    assert act(ws, "read", blob=blob, start=0, end=101).text == "read: a blob range is at most 100 bytes (asked 101)"
    assert act(ws, "read", blob=blob, start=2000, end=2001).text == \
        "read: start 2000 is past the end of the blob (1080 bytes)"
    assert act(ws, "read", blob=sha(SECRET), start=0, end=10).text == \
        f"read: no kept output has the digest {sha(SECRET)}"
    assert act(ws, "read", blob="../" + "0" * 61, start=0, end=1).text == \
        f"read args.blob must match '^[0-9a-f]{{64}}$', got '../{'0' * 61}'"
    # A command's output is cut the same way, and a range of a line range too.
    out = act(ws, "run", command=["python", "-c", "import sys; sys.stdout.write('é' * 100)"])
    text = ("é" * 100).encode()
    head, rest = out.text.split("\n[... ")
    assert head == "é" * 25  # 50 bytes, no newline: cut between characters
    assert rest.endswith("]\n" + "é" * 25 + "\n[exit status 0]\n")
    assert (tmp_path / "blobs" / sha(text)).read_bytes() == text
    assert act(ws, "read", blob=sha(text), start=50, end=60).text == "é" * 5
    assert act(ws, "read", blob=sha(text), start=51, end=55).text == "\\xa9é\\xc3"  # not whole characters
    assert act(ws, "read", path="long.txt", start_line=3, end_line=4).text == "line 002\nline 003\n"
    assert not any(p.name == blob for p in ws.root.rglob("*"))  # kept outside the workspace


# ---- the rest of the contract ---------------------------------------------------------------

def test_bad_arguments_are_observations_and_change_nothing(ws):
    before = {p: ws.digest(p) for p in ws.tree()}
    cases = [
        (Action("delete", {"path": "a.txt"}), 'unknown tool "delete" (tools: list, read, search, edit, write, run)'),
        # read's schema is an anyOf (a file's lines, or a blob's bytes): the reason is the
        # branch's that shares the most keys with the arguments.
        (Action("read", {}), "read args is missing 'path'"),
        (Action("read", {"path": 3}), "read args.path must be string, got 3"),
        (Action("read", {"path": "a.txt", "start_line": 0}), "read args.start_line must respect minimum 1, got 0"),
        (Action("read", {"path": "a.txt", "start_line": True}), "read args.start_line must be integer, got true"),
        (Action("read", {"blob": "0" * 64, "start": 0}), "read args is missing 'end'"),
        (Action("list", {"depth": 99}), "list args.depth must respect maximum 20, got 99"),
        (Action("search", {"pattern": "x", "regex": "yes"}), 'search args.regex must be boolean, got "yes"'),
        (Action("edit", {"path": "a.txt", "old": "alpha"}), "edit args is missing 'new'"),
        (Action("write", {"path": "b.txt", "content": "x", "mode": 7}),
         "write args has an unknown key 'mode' (allowed: path, content)"),
        (Action("run", {"command": "echo hi"}), 'run args.command must be array, got "echo hi"'),
        (Action("run", {"command": ["echo", 1]}), "run args.command[1] must be string, got 1"),
        (Action("run", ["echo"]), 'run args must be object, got ["echo"]'),
    ]
    tools = {t.name: t for t in ws.tools}
    for action, reason in cases:
        obs = ws.perform(action)
        assert (obs.ok, obs.text, obs.receipt) == (False, reason, None)
        if action.tool in tools:  # the one validator, which the loop's check of a proposal calls too
            with pytest.raises(ValueError) as e:
                check_value(action.args, tools[action.tool].parameters, f"{action.tool} args")
            assert str(e.value) == reason
    assert {p: ws.digest(p) for p in ws.tree()} == before


def test_touched_and_digest(ws):
    assert ws.touched(Action("edit", {"path": "./src//app.py", "old": "x", "new": "y"})) == ["src/app.py"]
    assert ws.touched(Action("edit", {"path": "in_link", "old": "x", "new": "y"})) == ["a.txt"]
    assert ws.touched(Action("write", {"path": "new/file.txt", "content": ""})) == ["new/file.txt"]
    for action in [Action("read", {"path": "a.txt"}), Action("edit", {"path": "../x", "old": "a", "new": "b"}),
                   Action("write", {"path": "out_dir/x", "content": ""}), Action("write", {"path": "src"}),
                   Action("run", {"command": ["rm", "-rf", "."]}), Action("edit", "junk")]:
        assert ws.touched(action) == []
    assert ws.digest("a.txt") == sha(A_TXT) and ws.digest("in_link") == sha(A_TXT)
    assert ws.digest("nothing/here.txt") is None
    with pytest.raises(PolicyError, match="leads out"):
        ws.digest("out_file")
    with pytest.raises(ToolError, match="is a folder"):
        ws.digest("src")


def test_copy_keeps_files_symlinks_and_settings(ws, tmp_path):
    act(ws, "write", path="extra.txt", content="e\n")
    other = ws.copy(tmp_path / "copy")
    assert other.root == Path(os.path.realpath(tmp_path / "copy"))
    assert (other.editable_paths, other.allowed_commands, other.command_seconds, other.output_bytes,
            other.blob_dir) == (ws.editable_paths, ws.allowed_commands, ws.command_seconds, ws.output_bytes,
                                ws.blob_dir)
    assert {p: other.digest(p) for p in other.tree()} == {p: ws.digest(p) for p in ws.tree()}
    assert os.readlink(other.root / "out_dir") == os.readlink(ws.root / "out_dir")  # still refused there
    assert act(other, "read", path="out_dir/secret.txt").text == \
        'read: "out_dir/secret.txt": the symlink "out_dir" leads out of the workspace'
    assert not (other.root / "fifo").exists()  # a FIFO is not a file to copy
    act(other, "edit", path="a.txt", old="alpha", new="omega")
    assert ws.digest("a.txt") == sha(A_TXT) and other.digest("a.txt") == sha(b"omega\nbeta\ngamma\n")
    with pytest.raises(ValueError, match="exists"):
        ws.copy(tmp_path / "copy")
    with pytest.raises(ValueError, match="inside the workspace"):
        ws.copy(ws.root / "sub")


def test_tools_schemas_compile_and_say_what_the_policy_allows(tree, tmp_path):
    ws = Workspace(tree[0], editable_paths=["src/**"], allowed_commands=["python"], blob_dir=tmp_path / "b")
    assert [t.name for t in ws.tools] == ["list", "read", "search", "edit", "write", "run"]
    tools = {t.name: t for t in ws.tools}
    assert "Editable: src/**." in tools["edit"].description and "Commands: python." in tools["run"].description
    run = Grammar.from_json_schema(tools["run"].parameters)
    assert run.accepts('{"command": ["python", "-m", "pytest"]}') and not run.accepts('{"command": ["cat", "x"]}')
    read = Grammar.from_json_schema(tools["read"].parameters)
    assert read.accepts('{"path": "a.txt", "start_line": 2}')
    assert read.accepts('{"blob": "%s", "start": 0, "end": 10}' % ("a" * 64))
    assert not read.accepts('{"blob": "x", "start": 0, "end": 1}')
    for name in ("list", "search", "edit", "write"):
        Grammar.from_json_schema(tools[name].parameters)
    # What the descriptions say is what perform does.
    assert act(ws, "edit", path="a.txt", old="alpha", new="x").text == \
        'edit: "a.txt" is outside the editable paths (src/**)'


def test_bad_settings_are_refused(tree, tmp_path):
    root = tree[0]
    for kwargs, message in [
        ({"editable_paths": "src/**"}, "editable_paths: a sequence of non-empty strings"),
        ({"editable_paths": ["../x/**"]}, "must be relative to the root"),
        ({"allowed_commands": ["/bin/sh"]}, "must be a command name, not a path"),
        ({"command_seconds": 0}, "command_seconds: a number of seconds > 0"),
        ({"output_bytes": 10}, "output_bytes: an integer >= 64"),
        ({"blob_dir": root / "blobs"}, "is inside the workspace"),
    ]:
        with pytest.raises(ValueError, match=message):
            Workspace(root, **kwargs)
    with pytest.raises(ValueError, match="is not a folder"):
        Workspace(tmp_path / "missing")
    ws = Workspace(root, blob_dir=tmp_path / "b")
    assert ws.blob_dir == Path(os.path.realpath(tmp_path / "b")) and ws.resolve("a.txt") == ws.root / "a.txt"


# ---- the property: nothing outside is read or written ---------------------------------------

SEGMENTS = ["..", ".", "", "a.txt", "src", "app.py", "out_file", "out_dir", "rel_out", "up", "chain", "out_back",
            "dev", "loop", "fifo", "in_link", "src_link", "abs_in", "hard", "outside", "secret.txt", "dir",
            "x.txt", "ws", "new.txt", "ünïcødé", "日本語", "~", " ", "a\nb", "*", "\udcff"]
PREFIXES = ["", "", "", "", "/", "./", "../", "{OUT}/", "{ROOT}/", "{BASE}/", "/dev/"]
# Whole paths worth trying: the tree's own names (inside and out), through every symlink.
PATHS = [".", "a.txt", "src", "src/app.py", "notes/todo.md", "in_link", "src_link/util.py", "abs_in", "new.txt",
         "src/new.py", "ünïcødé/日本語.txt", "out_file", "out_dir/secret.txt", "out_dir/dir/x.txt", "rel_out",
         "up/outside/secret.txt", "up/ws/a.txt", "chain", "out_back", "dev", "loop", "fifo", "hard", "hard/x",
         "src_link/../a.txt", "{OUT}/secret.txt", "{ROOT}/a.txt", "{ROOT}/../outside/secret.txt", "/etc/passwd",
         "/dev/zero", "out_dir/new.txt", "up/new.txt", "src_link/new.txt"]
segment = st.one_of(st.sampled_from(SEGMENTS), st.text(max_size=5))
path = st.one_of(
    st.sampled_from(PATHS),
    st.sampled_from(PATHS),
    st.sampled_from(PATHS),
    st.builds(lambda prefix, parts: prefix + "/".join(parts), st.sampled_from(PREFIXES),
              st.lists(segment, min_size=1, max_size=4)),
)
small = st.integers(min_value=-1, max_value=4)
actions = st.one_of(
    st.builds(lambda p, d: Action("list", {"path": p, "depth": d}), path, st.integers(1, 4)),
    st.builds(lambda p: Action("read", {"path": p}), path),
    st.builds(lambda p, a, b: Action("read", {"path": p, "start_line": a, "end_line": b}), path, small, small),
    st.builds(lambda b, a, e: Action("read", {"blob": b, "start": a, "end": e}),
              st.sampled_from(["0" * 64, sha(SECRET), "../outside/secret.txt", "", "{OUT}/secret.txt"]), small,
              st.integers(0, 200)),
    st.builds(lambda pat, rx, p: Action("search", {"pattern": pat, "regex": rx, "path": p}),
              st.sampled_from(["TOP", "SECRET", "a", "(", ".*", ""]), st.booleans(), path),
    st.builds(lambda p, old: Action("edit", {"path": p, "old": old, "new": "PWNED"}), path,
              st.sampled_from(["alpha", "x = 1", "TOP", SECRET.decode(), "a", ""])),
    st.builds(lambda p: Action("write", {"path": p, "content": "PWNED"}), path),
    st.builds(lambda cmd, p: Action("run", {"command": [cmd, p]}), st.sampled_from(["echo", "cat", "sh", "ls"]), path),
)


def outside_state(base: Path, skip: set[Path]) -> dict[str, object]:
    """Everything under `base` but the workspace and the blob folder: bytes, link targets, kinds."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if Path(dirpath, d) not in skip]
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st_ = os.lstat(p)
            state[str(p)] = (os.readlink(p) if os.path.islink(p) else p.read_bytes() if p.is_file()
                             else "dir", st_.st_mtime_ns, st_.st_mode)
    return state


def check_stays_inside(sequence: list[Action]) -> None:
    """Run `sequence` on a fresh tree (with a hard link to the secret inside too): no
    observation shows the secret, every refusal is one line, and nothing outside the root and
    the blob folder changed; no kept output holds the secret."""
    base = Path(tempfile.mkdtemp(prefix="tiny-llm-ws-"))
    try:
        root, secret = make_tree(base)
        os.link(secret, root / "hard")
        blobs = base / "blobs"
        ws = Workspace(root, allowed_commands=["echo"], blob_dir=blobs, output_bytes=200)
        known = outside_state(base, {root, blobs})
        marks = {"{OUT}": str(base / "outside"), "{ROOT}": str(root), "{BASE}": str(base)}

        def place(value):
            if isinstance(value, list):
                return [place(v) for v in value]
            if isinstance(value, str):
                for mark, real in marks.items():
                    value = value.replace(mark, real)
            return value

        for action in sequence:
            obs = ws.perform(Action(action.tool, {k: place(v) for k, v in action.args.items()}))
            assert SECRET.strip().decode() not in obs.text
            if not obs.ok and action.tool != "run":
                assert "\n" not in obs.text, obs.text  # the reason, on one line
            if obs.receipt is not None:
                assert all(not Path(p).is_absolute() and ".." not in p.split("/") for p in obs.receipt.after)
        assert outside_state(base, {root, blobs}) == known
        assert secret.read_bytes() == SECRET
        for blob in blobs.iterdir():
            assert SECRET.strip() not in blob.read_bytes()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_every_tool_on_every_path_stays_inside():
    sequence = []
    for p in PATHS:
        sequence += [Action("list", {"path": p, "depth": 3}), Action("read", {"path": p}),
                     Action("read", {"path": p, "start_line": 1, "end_line": 2}),
                     Action("search", {"pattern": "TOP", "path": p}), Action("search", {"pattern": "a", "path": p}),
                     Action("edit", {"path": p, "old": "TOP", "new": "PWNED"}),
                     Action("edit", {"path": p, "old": "alpha", "new": "PWNED alpha"}),
                     Action("write", {"path": p, "content": "PWNED"}), Action("run", {"command": ["echo", p]}),
                     Action("run", {"command": ["cat", p]})]
    check_stays_inside(sequence)


@settings(derandomize=True, database=None, deadline=None, max_examples=150, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(actions, min_size=1, max_size=6))
def test_no_sequence_of_tool_calls_reaches_outside_the_workspace(sequence):
    check_stays_inside(sequence)


# ---- the sandbox: bubblewrap's arguments from the policy -----------------------------------

FAKE_BWRAP = """#!{python}
# A stand-in for bubblewrap: records its arguments, then runs the command after "--" as is.
import json, os, sys
if sys.argv[1:] == ["--version"]:
    print("bubblewrap 0.0-fake")
    raise SystemExit(0)
with open({record!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
rest = sys.argv[sys.argv.index("--") + 1:]
os.execvp(rest[0], rest)
"""


def test_bwrap_args_give_the_command_the_workspace_and_nothing_of_the_user(tmp_path):
    from tiny_llm.agent.sandbox import Policy, bwrap_args

    root, home, venv = tmp_path / "ws", tmp_path / "home-x", Path("/opt/venvs/py")
    policy = Policy(root, (venv,), home)
    args = bwrap_args("/usr/bin/bwrap", policy, ["python3", "-c", "print(1)"], "/opt/venvs/py/bin/python3")
    assert args[0] == "/usr/bin/bwrap"
    assert args[-4:] == ["--", "/opt/venvs/py/bin/python3", "-c", "print(1)"]  # the program by its full path
    options = args[1:-4]
    # New namespaces: no network, its own processes; no capabilities; it dies with the agent.
    assert "--unshare-all" in options or {"--unshare-net", "--unshare-pid"} <= set(options)
    for flag in ("--die-with-parent", "--new-session"):
        assert flag in options
    assert options[options.index("--cap-drop") + 1] == "ALL"

    def mounts(kind):
        return [tuple(options[i + 1:i + 3]) for i, a in enumerate(options) if a == kind]

    assert mounts("--bind") == [(str(root), str(root))]  # the only writable folder
    assert options[options.index("--chdir") + 1] == str(root)
    ro = mounts("--ro-bind")
    assert ("/usr", "/usr") in ro and (str(venv), str(venv)) in ro
    bound = {src for src, _ in ro}
    assert not {"/", "/home", "/root", "/etc", "/tmp", os.path.expanduser("~"), str(tmp_path)} & bound
    assert "/etc/shadow" not in bound and not any(b.startswith("/etc/ssh") for b in bound)
    # A private /tmp, mounted before anything that may live inside it; the home, empty, in it.
    tmpfs = options.index("--tmpfs")
    assert options[tmpfs + 1] == "/tmp" and tmpfs < options.index("--bind")
    assert tmpfs < min(i for i, a in enumerate(options) if a == "--ro-bind")
    assert options[options.index("--dir") + 1] == str(home)
    assert options.index("--proc") and options.index("--dev")


def test_run_passes_its_policy_to_bwrap(tree, tmp_path, monkeypatch):
    """With a fake bwrap on PATH, every command goes through it with the policy's arguments."""
    from tiny_llm.agent.sandbox import Policy, bwrap_args, readable_folders

    bin_dir, record = tmp_path / "bin", tmp_path / "bwrap-calls.jsonl"
    bin_dir.mkdir()
    fake = bin_dir / "bwrap"
    fake.write_text(FAKE_BWRAP.format(python=sys.executable, record=str(record)))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    ws = Workspace(tree[0], allowed_commands=["python"], blob_dir=tmp_path / "blobs")
    assert ws.describe_sandbox().startswith(f"sandbox: bubblewrap 0.0-fake ({fake})")
    obs = act(ws, "run", command=["python", "-c", "import os; print(os.environ['HOME'])"])
    assert obs.ok, obs.text
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(calls) == 2 and calls[0][-2:] == ["--", "true"]  # the probe, then the command
    executable, _ = ws.boundary.prepare_command(["python"], Path("/unused"))
    home = obs.text.splitlines()[0]  # the command's HOME: the policy's home folder
    readable = readable_folders([executable], keep_out=[ws.root, Path.home()])
    assert [str(fake)] + calls[1] == bwrap_args(str(fake), Policy(ws.root, readable, Path(home)),
                                                ["python", "-c", "import os; print(os.environ['HOME'])"], executable)


def test_the_real_bwrap_keeps_the_command_inside(tree, tmp_path):
    """The real bubblewrap (make setup installs it): the secret beside the workspace is not
    there for the command, and a write out of the root lands nowhere."""
    root, secret = tree
    ws = Workspace(root, allowed_commands=["python"], blob_dir=tmp_path / "blobs")
    assert ws.boundary.sandbox()[0] is not None, ws.boundary.sandbox()[1]
    code = (f"import os; print(os.path.exists({str(secret)!r}), os.path.exists('a.txt')); "
            "open('../x', 'w').write('x')")  # the folder above is the sandbox's own, in its private /tmp
    obs = act(ws, "run", command=["python", "-c", code])
    assert obs.text == "False True\n[exit status 0]\n"
    assert not (root.parent / "x").exists()
