"""The static-shape step (``static_shapes``) and the compiled backbone (``compile``) give the
eager, longest-row step's loss and gradients for every named recipe."""

from __future__ import annotations

import pytest
import torch

from methods.encoder import Encoder
from methods.recipe import Recipe
from platform.run.loop import compile_backbone
from platform.data.pipeline import StepInputs
from tests.recipe_reference import CASES, COLUMNS, NEGATIVES, summarise

# Without random draws in the encoder (dropout 0, SAN's p2 0, the discriminator's dropout 0): masks
# drawn over another shape are other masks.
QUIET = {"san": {"p2": 0.0}, "augcse": {"disc_dropout": 0.0}}


def _step(case: str, tiny_model, static: bool, compiled: bool = False, leak: bool = False) -> dict:
    method, params, step = CASES[case]
    params = {**params, **QUIET.get(method, {})}
    if "paraphrase_cache" in params:
        params["positives"] = "paraphrase"
    recipe = Recipe.named(method, **params)
    encoder = Encoder.from_pretrained(str(tiny_model), dropout=0.0)
    torch.manual_seed(1)
    model = recipe.build(encoder)
    if compiled:  # Dynamo's graph and AOTAutograd's backward, without inductor's C++ build (~40 s here)
        compile_backbone(model, "default", backend="aot_eager")
    inputs = StepInputs(recipe, str(tiny_model), 32, static=static)
    batch = inputs.nest(inputs.collate(inputs.arrays({**COLUMNS, "una_negative": NEGATIVES, "san_negative": NEGATIVES})))
    if leak:  # the padding unmasked
        batch = {k: {**v, "attention_mask": torch.ones_like(v["attention_mask"])} if isinstance(v, dict) else v
                 for k, v in batch.items()}
    model.train()
    torch.manual_seed(2)
    loss, metrics = recipe.loss(model, batch, step)
    loss.backward()
    widths = {k: v["input_ids"].shape[1] for k, v in batch.items() if isinstance(v, dict)}
    return {**summarise(model, loss, metrics), "widths": widths}


def _assert_equal(got: dict, want: dict) -> None:
    """The loss equal to 1e-5, and each gradient summary to 5e-3 of the whole gradient's norm: the
    round-off of this tiny random BERT under a loss at tau 0.05, whose gradients cancel, is that
    large (UNA's move by ~5e-4 of their norm between PyTorch's fused attention and the eager one,
    on the same batch, its projection's by ~2e-3). Padding that leaked into the attention moves the loss itself
    (``test_the_comparison_sees_padding_that_leaks``)."""
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-7)
    norms = [norm for _, norm, _ in want["encoder_grads"].values()] + [summary[1] for _, summary in want["head_grads"]]
    floor = 5e-3 * sum(n**2 for n in norms) ** 0.5
    for name, summary in want["encoder_grads"].items():
        for g, w in zip(got["encoder_grads"][name], summary):
            assert abs(g - w) <= floor, (name, got["encoder_grads"][name], summary)
    for (shape, g), (_, w) in zip(got["head_grads"], want["head_grads"]):
        assert all(abs(a - b) <= floor for a, b in zip(g, w)), (shape, g, w)


@pytest.mark.parametrize("case", sorted(CASES))
def test_padding_to_max_len_changes_no_loss_or_gradient(case, tiny_model):
    from methods.recipe import INGREDIENTS, NAMED

    method, params, _ = CASES[case]
    encoder = INGREDIENTS["encoder"][params.get("encoder", NAMED[method].spec.encoder)]
    width = encoder().token_width(32)  # a prompt's: 32 of the sentence's own tokens, and [CLS] [SEP]
    static, dynamic = _step(case, tiny_model, True), _step(case, tiny_model, False)
    assert set(static["widths"].values()) == {width} and max(dynamic["widths"].values()) < width
    _assert_equal(static, dynamic)


@pytest.mark.parametrize("case", ["simcse", "una_negatives", "san", "augcse", "vascl"])
def test_the_compiled_static_step_equals_the_eager_one(case, tiny_model):
    torch._dynamo.reset()
    _assert_equal(_step(case, tiny_model, True, compiled=True), _step(case, tiny_model, False))


def test_compile_is_validated_in_one_line():
    from platform.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match="compile must be none, default, reduce-overhead or max-autotune"):
        TrainConfig.build("simcse", "local", {"compile": "fast"})


def test_the_comparison_sees_padding_that_leaks(tiny_model):
    with pytest.raises(AssertionError):
        _assert_equal(_step("simcse", tiny_model, True, leak=True), _step("simcse", tiny_model, False))
