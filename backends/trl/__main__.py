"""``python -m backends.trl`` = ``credit-trl`` (see ``backends.trl.cli``)."""

from backends.trl.cli import main

raise SystemExit(main())
