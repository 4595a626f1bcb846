"""``python -m backends.verl`` = ``credit-verl`` (see ``backends.verl.cli``)."""

from backends.verl.cli import main

raise SystemExit(main())
