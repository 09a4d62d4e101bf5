"""Root conftest (the design card's): pytester for the plugin's own tests, and the Hypothesis
profiles the project runs under.

- ``ci``: derandomized (the same examples every run, so a red CI run is reproducible and a green
  one is not luck), no deadline (a first Triton compile or torch.compile takes seconds), the
  failing example's blob printed. Picked when ``CI`` is set (GitHub Actions sets it; ``.ci/run``
  does too).
- ``dev``: Hypothesis' defaults but the deadline, random examples each run.

``HYPOTHESIS_PROFILE=<name>`` or ``--hypothesis-profile=<name>`` picks one explicitly.
"""

from __future__ import annotations

import os

from hypothesis import settings

pytest_plugins = ["pytester"]

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.register_profile("soak", deadline=None, database=None)  # each seed on its own: no replayed failures
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))
