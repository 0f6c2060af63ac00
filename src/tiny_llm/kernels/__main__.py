"""Engine — `python -m tiny_llm.kernels build|status`: build the kernels now, or say whether they run."""

from . import main

raise SystemExit(main())
