"""`python -m reproduction.recap.value`: the value stage's command line (see cli.py)."""

from reproduction.recap.value.cli import main

raise SystemExit(main())
