"""Started by tests/day_hits.py for the processes a test starts (on their PYTHONPATH): they
record the days' code they run under the test (or fixture) that started them."""

import os
import sys

if os.environ.get("TINY_LLM_DAY_HITS") and os.environ.get("TINY_LLM_DAY_HITS_OWNER"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import day_hits

    day_hits.install_child()
