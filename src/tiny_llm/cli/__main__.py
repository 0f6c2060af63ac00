"""Engine — `python -m tiny_llm.cli`: the `tiny-llm` command line."""

from . import main

raise SystemExit(main())
