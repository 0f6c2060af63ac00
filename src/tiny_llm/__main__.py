"""Engine — `python -m tiny_llm`: the `tiny-llm` command line.

Tests: tests/test_cli.py
"""

from .cli import main

raise SystemExit(main())
