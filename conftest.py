"""Root conftest: make ``platform`` resolve to this repository's package under pytest.

The ``pytest`` console script imports the standard ``platform`` module before it reads this
file; dropping that cached module lets the repository's package (which re-exports the standard
one) take its place.
"""

import os
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
_std = sys.modules.get("platform")
if _std is not None and not hasattr(_std, "__path__"):
    del sys.modules["platform"]
import platform  # noqa: E402,F401  (re-imported from this repository)

assert hasattr(platform, "__path__") and hasattr(platform, "system")
