"""Engine — `python -m tiny_llm`: the `tiny-llm` command line."""

from .cli import main

raise SystemExit(main())
