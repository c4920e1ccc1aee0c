"""``python -m mldist`` runs the CLI."""

from mldist.cli import main

raise SystemExit(main())
