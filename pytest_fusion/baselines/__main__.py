"""``python -m pytest_fusion.baselines FILE...``: upgrade baseline files to the current schema."""

from pytest_fusion.baselines.store import main

raise SystemExit(main())
