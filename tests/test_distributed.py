"""Running under `mlx.launch`, apart from any course day: what a rank does to its launcher.
(The ranks' model, logits and tokens are week 3 day 5's: tests/test_week3_day5.py.)"""

import os
import re
import sys
import textwrap

from test_week3_day5 import launch


def test_joined_ranks_lower_their_launchers_priority_and_keep_their_own(tmp_path):
    """Once the ring is joined, every thread of `mlx.launch` runs at nice 19 (its relay loops
    never block: see `distributed.quiet_launcher`), while the ranks keep this process's."""
    script = tmp_path / "nice.py"
    script.write_text(textwrap.dedent('''
        import os
        from pathlib import Path
        from tiny_llm import distributed
        assert distributed.group() is not None
        parent = os.getppid()
        launcher = sorted({int(Path(f"/proc/{parent}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[16])
                           for t in os.listdir(f"/proc/{parent}/task")})
        print(f"rank {distributed.rank()}: {os.getpriority(os.PRIO_PROCESS, 0)} launcher {launcher}")
    '''))
    run = launch(2, [sys.executable, str(script)])
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert sorted(re.findall(r"rank \d: -?\d+ launcher \[[-\d, ]*\]", run.stdout)) == [
        f"rank {r}: {mine} launcher [19]" for r in (0, 1)], run.stdout + run.stderr[-2000:]


def test_a_process_not_started_by_the_launcher_leaves_its_parent_alone():
    from tiny_llm.distributed import quiet_launcher

    assert quiet_launcher() is False and quiet_launcher(parent=os.getpid()) is False
    assert os.getpriority(os.PRIO_PROCESS, os.getppid()) == os.getpriority(os.PRIO_PROCESS, 0)
