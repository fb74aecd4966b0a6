"""The five named recipes reproduce the losses, metrics and gradients their methods gave before
they were rebuilt from ingredients (``tests/fixtures/recipe_reference.json``; see
``tests/recipe_reference.py``), and recipes are validated before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from methods.ingredients import InvalidParams
from methods.recipe import RecipeSpec
from tests.recipe_reference import CASES, recipe_build, run_case

REFERENCE = json.loads((Path(__file__).parent / "fixtures" / "recipe_reference.json").read_text())["cases"]
# Metrics that were renamed when the methods became recipes.
RENAMED = {"vascl_instance": "contrastive_loss"}


def close(a: float, b: float, scale: float, floor: float) -> bool:
    """Equal up to float32 round-off, relative to the tensor's gradient norm ``scale`` and, for
    tensors whose true gradient is about zero (e.g. attention key biases), to ``floor``, a
    millionth of the whole gradient's norm: autograd may sum a gradient's contributions in another
    order when the terms are computed in another order."""
    return abs(a - b) <= 1e-5 * (abs(b) + scale) + floor


@pytest.mark.parametrize("case", sorted(CASES))
def test_named_recipe_reproduces_the_recorded_loss_and_gradients(case, tiny_model):
    want = REFERENCE[case]
    got = run_case(case, tiny_model, recipe_build)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-6, abs=1e-7)
    for name, value in want["metrics"].items():
        assert got["metrics"][RENAMED.get(name, name)] == pytest.approx(value, rel=1e-5, abs=1e-7), name
    assert set(got["encoder_grads"]) == set(want["encoder_grads"])
    floor = 1e-6 * sum(norm**2 for _, norm, _ in want["encoder_grads"].values()) ** 0.5
    for name, (s, norm, proj) in want["encoder_grads"].items():
        gs, gnorm, gproj = got["encoder_grads"][name]
        assert all(close(g, w, norm, floor) for g, w in ((gnorm, norm), (gs, s), (gproj, proj))), (name, (gs, gnorm, gproj), (s, norm, proj))
    assert [shape for shape, _ in got["head_grads"]] == [shape for shape, _ in want["head_grads"]]
    for (shape, got_summary), (_, want_summary) in zip(got["head_grads"], want["head_grads"]):
        norm = want_summary[1]
        assert all(close(g, w, norm, floor) for g, w in zip(got_summary, want_summary)), (shape, got_summary, want_summary)


def test_the_reference_can_fail(tiny_model):
    """A change of one parameter moves the summary: the comparison above is not vacuous."""
    changed = run_case("simcse", tiny_model, lambda m, p, e: recipe_build(m, {"temperature": 0.06}, e))
    assert changed["loss"] != pytest.approx(REFERENCE["simcse"]["loss"], rel=1e-4)


@pytest.mark.parametrize(
    "kinds,needle",
    [
        ({"loss": "hince"}, "loss=hince needs negatives"),
        ({"loss": "infonce,hince"}, "loss takes exactly one of"),
        ({"positives": "dropout,paraphrase"}, "positives takes exactly one of"),
        ({"aux": "vascl,augcse"}, "each bring their own projection head"),
        ({"negatives": "una,una"}, "names an ingredient twice"),
        ({"negatives": "tfidf"}, "unknown negatives 'tfidf'; choose from una, san"),
    ],
)
def test_invalid_recipes_are_refused(kinds, needle):
    with pytest.raises(InvalidParams, match=needle):
        RecipeSpec.parse(kinds).validate()
