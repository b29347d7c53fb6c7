"""`python -m scratchops`: the same command line as the `scratchops` console script."""

from .tools.cli import main

raise SystemExit(main())
