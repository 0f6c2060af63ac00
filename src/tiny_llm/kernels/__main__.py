"""Engine — `python -m tiny_llm.kernels build|status`: build the kernels now, or say whether they run.

Tests: tests/test_kernels.py, tests/test_progress.py, tests/test_week2_day6.py
"""

from . import main

raise SystemExit(main())
