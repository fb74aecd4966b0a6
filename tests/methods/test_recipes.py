"""The augmentation papers' named recipes (SimCSE, UNA, SAN, AugCSE, VaSCL: the prompt-based ones came
after) reproduce the losses, metrics and gradients their methods gave before they were rebuilt from ingredients (``tests/fixtures/recipe_reference.json``; see
``tests/recipe_reference.py``), and recipes are validated before anything runs."""

from __future__ import annotations

import json

import pytest

from methods.ingredients import InvalidParams
from methods.recipe import RecipeSpec
from tests.helpers import ROOT
from tests.recipe_reference import CASES, close, recipe_build, run_case

REFERENCE = json.loads((ROOT / "tests" / "fixtures" / "recipe_reference.json").read_text())["cases"]
# Metrics that were renamed when the methods became recipes.
RENAMED = {"vascl_instance": "contrastive_loss"}


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


@pytest.mark.parametrize("case", ["simcse", "una_negatives", "san", "augcse_authors", "vascl"])
def test_a_few_steps_under_bf16_autocast_stay_close_to_fp32(case, tiny_model):
    """The GPU path's bf16 autocast (here CPU's, which casts matmuls the same way): three AdamW
    steps of each named recipe from one initialisation and one batch follow the fp32 run."""
    import contextlib

    import torch

    from methods.encoder import Encoder
    from tests.recipe_reference import COLUMNS

    method, params, _ = CASES[case]
    losses = {}
    for bf16 in (False, True):
        encoder = Encoder.from_pretrained(str(tiny_model), dropout=0.1)
        torch.manual_seed(1)
        model, loss_fn = recipe_build(method, params, encoder)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        losses[bf16] = []
        for step in range(3):
            torch.manual_seed(10 + step)
            with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
                loss, _ = loss_fn(model, COLUMNS, step if method != "una" else 0)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses[bf16].append(float(loss.detach()))
    assert losses[True] == pytest.approx(losses[False], rel=2e-2), losses


def test_una_negatives_under_hince_train_on_the_steps_between_them(tiny_model):
    """``negatives=una`` with ``loss=hince``: UNA's negatives come every alpha-th step; on the
    others HiNCE is its positive part, InfoNCE at tau1 over the batch (a step without them once
    crashed on an empty concatenation)."""
    import torch

    from methods.encoder import Encoder
    from methods.losses import info_nce
    from tests.recipe_reference import COLUMNS

    encoder = Encoder.from_pretrained(str(tiny_model), dropout=0.0)
    model, loss_fn = recipe_build("una", {"loss": "hince", "alpha": 2}, encoder)
    model.eval()
    loss, metrics = loss_fn(model, COLUMNS, 1)
    loss.backward()
    assert metrics["una_negatives"] == 0.0
    with torch.no_grad():
        e = model(encoder.tokenize(COLUMNS["sentence"], max_len=32))
        z = model.project({"x": e}, ["x"])["x"]
    assert loss.item() == pytest.approx(float(info_nce(z, z, 0.05)), rel=1e-5)
    with_negatives, metrics = loss_fn(model, COLUMNS, 2)
    assert metrics["una_negatives"] == 1.0 and with_negatives.item() != loss.item()
