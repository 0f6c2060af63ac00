"""Engine — `python -m tiny_llm.cli`: the `tiny-llm` command line.

Tests: tests/test_cli.py, tests/test_progress.py, tests/test_request.py
"""

from . import main

raise SystemExit(main())
