"""``python -m backends.openrlhf``: same as the ``credit-openrlhf`` command."""

from backends.openrlhf.launcher import main

raise SystemExit(main())
