"""GradCache (``mini_batch_size``): every named recipe's loss and gradients in encoder chunks equal
the whole batch's (Gao, Zhang, Han and Callan, 2021, Sec. 3.2-3.3; ``Recipe.cached_step``)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from methods.encoder import Encoder
from methods.recipe import unwrap
from platform.data.pipeline import StepInputs
from tests.recipe_reference import CASES, COLUMNS, NEGATIVES, close, recipe_build, summarise


class Chunked(torch.nn.Module):
    """The slow reference: the model's forward on the whole batch, one chunk of rows after another,
    with its graph. Its loss and gradients are the whole batch's, with the dropout masks drawn in
    the order the cached step draws them (``module``: what DDP calls it, so ``unwrap`` finds it)."""

    def __init__(self, module: torch.nn.Module, rows: int):
        super().__init__()
        self.module, self.rows = module, rows

    def forward(self, inputs):
        n = inputs["input_ids"].shape[0]
        return torch.cat([self.module({k: v[i : i + self.rows] for k, v in inputs.items()}) for i in range(0, n, self.rows)])


def _step(case: str, tiny_model, dropout: float, mini: int | None, extra: dict | None = None):
    """One step of ``case``: ``mini`` None is the plain one-pass step, 0 the chunked reference with
    its graph (chunks of 3 rows), else ``cached_step`` with chunks of ``mini`` rows."""
    method, params, step = CASES[case]
    encoder = Encoder.from_pretrained(str(tiny_model), dropout=dropout)
    torch.manual_seed(1)
    model, _ = recipe_build(method, {**params, **(extra or {})}, encoder)
    recipe = _recipe_of(method, {**params, **(extra or {})})
    inputs = StepInputs(recipe, str(encoder.tokenizer.name_or_path), 32)
    columns = {**COLUMNS, "una_negative": NEGATIVES, "san_negative": NEGATIVES, "soft_negative": NEGATIVES}
    batch = inputs.nest(inputs.collate(inputs.arrays(columns)))
    model.train()
    torch.manual_seed(2)
    if mini is None or mini == 0:
        loss, metrics = recipe.loss(model if mini is None else Chunked(model, 3), batch, step)
        loss.backward()
    else:
        loss, metrics = recipe.cached_step(model, batch, step, mini, lambda t: t.backward())
    return summarise(unwrap(model), loss, metrics)


def _recipe_of(method, params):
    from methods.recipe import Recipe

    params = dict(params)
    if "paraphrase_cache" in params:
        params["positives"] = "paraphrase"
    return Recipe.named(method, **params)


def _assert_equal(got: dict, want: dict, rel: float = 1e-6) -> None:
    """Equal up to float32 round-off (``tests.methods.test_recipes.close``); ``rel``: a millionth of the
    whole gradient's norm where the two sum in the same order, more where they do not."""
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-7)
    for name, value in want["metrics"].items():
        assert got["metrics"][name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    assert set(got["encoder_grads"]) == set(want["encoder_grads"])
    floor = rel * sum(norm**2 for _, norm, _ in want["encoder_grads"].values()) ** 0.5
    for name, (s, norm, proj) in want["encoder_grads"].items():
        assert all(close(g, w, norm, floor) for g, w in zip(got["encoder_grads"][name], (s, norm, proj))), name
    assert [shape for shape, _ in got["head_grads"]] == [shape for shape, _ in want["head_grads"]]
    for (shape, g), (_, w) in zip(got["head_grads"], want["head_grads"]):
        assert all(close(a, b, w[1], floor) for a, b in zip(g, w)), shape


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cached_step_equals_the_whole_batch_with_dropout_on(case, tiny_model):
    """Dropout on (the encoder's 0.1, SAN's p2 pass, AugCSE's discriminator): the cached step's
    re-encoding replays each chunk's recorded RNG state, so its loss and every gradient equal the
    whole batch's with the same masks (the reference keeps the graph of every chunk)."""
    _assert_equal(_step(case, tiny_model, 0.1, 3), _step(case, tiny_model, 0.1, 0))


@pytest.mark.parametrize("case", ["simcse", "una_negatives", "san", "augcse", "vascl"])
def test_the_cached_step_equals_the_plain_step_without_dropout(case, tiny_model):
    """Without random draws in the encoder, chunks of 4 rows give the plain one-pass step's loss and
    gradients. Matrix products over 4 rows sum in another order than over the whole pass: the
    tolerance is 1e-4 of the gradient's norm (AugCSE's batch-normalised projector amplifies the
    round-off, as between DDP and one process in ``tests/methods/test_losses.py``); a chunk's gradient
    lost or counted twice moves a tensor's gradient by a share of its norm."""
    extra = {"san": {"p2": 0.0}, "augcse": {"disc_dropout": 0.0}}.get(case, {})
    _assert_equal(_step(case, tiny_model, 0.0, 4, extra), _step(case, tiny_model, 0.0, None, extra), rel=1e-4)


def test_the_comparison_can_fail(tiny_model):
    """Re-encoding without the recorded RNG state draws other masks: the gradients move."""
    import methods.recipe as recipe_module

    real = recipe_module._set_rng_state
    try:
        recipe_module._set_rng_state = lambda state: None
        got = _step("simcse", tiny_model, 0.1, 3)
    finally:
        recipe_module._set_rng_state = real
    with pytest.raises(AssertionError):
        _assert_equal(got, _step("simcse", tiny_model, 0.1, 0))


def test_the_training_loop_takes_mini_batch_size(tiny_model, tmp_path):
    """``forward_backward`` (the loop's step) with ``mini_batch_size`` gives the plain step's
    gradients under the loop's scaling, and a run's config refuses a negative value in one line."""
    from platform.config import ConfigError, TrainConfig
    from platform.run.loop import forward_backward

    grads = {}
    for mini in (0, 4):
        method, params, step = CASES["simcse"]
        encoder = Encoder.from_pretrained(str(tiny_model), dropout=0.0)
        torch.manual_seed(1)
        model, _ = recipe_build(method, params, encoder)
        recipe = _recipe_of(method, params)
        inputs = StepInputs(recipe, str(tiny_model), 32)
        batch = inputs.nest(inputs.collate(inputs.arrays(COLUMNS)))
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        loss, _ = forward_backward(recipe, model, batch, step, mini, contextlib.nullcontext(), scaler, 1)
        grads[mini] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    torch.testing.assert_close(grads[4], grads[0], rtol=1e-4, atol=1e-7)
    with pytest.raises(ConfigError, match="mini_batch_size must be >= 0"):
        TrainConfig.build("simcse", "local", {"mini_batch_size": -1})
