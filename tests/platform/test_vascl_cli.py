"""VaSCL through the platform: its bad input (its sweep runs in the combined recipe sweep,
``tests/platform/test_recipe_cli.py``, which searches VaSCL's space with UNA's and SAN's)."""

from __future__ import annotations

import pytest

from tests.helpers import assert_user_error


@pytest.mark.parametrize(
    "sets,needle",
    [(["k=32", "batch_size=32"], "smaller than the batch size"), (["k=0"], "k must be >= 1"), (["delta=0"], "delta must be > 0")],
)
def test_vascl_bad_input(sets, needle, cli):
    args = [a for s in sets for a in ("--set", s)]
    assert_user_error(cli("train", "vascl", *args), needle)
