"""Fixed inputs for the named recipes' loss and gradients, and a summary that can be compared.

``tests/fixtures/recipe_reference.json`` was recorded with the code as it was before the methods
became recipes of ingredients (the file's ``recorded_at_commit``, with the methods' own API);
``tests/methods/test_recipes.py`` checks that each named recipe still gives the same loss, metrics and
gradients on the same inputs and seeds. A case whose behaviour is changed on purpose is recorded
again, with the reason: ``python -m tests.recipe_reference record tests/fixtures/recipe_reference.json
vascl,vascl_authors "why"``.

A gradient is summarised per parameter tensor by its sum, its L2 norm and its projection on a
fixed random direction: any change to a loss term's value or its gradient flow moves them.
Encoder parameters are keyed by name; training-head parameters (whose attribute names are free
to change) are compared as a multiset of (shape, summary).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from methods.recipe import Recipe
from platform.data.pipeline import StepInputs

SENTENCES = [
    "a man is playing a guitar .", "the cat sleeps on the mat .", "stocks fell sharply on monday .",
    "she reads a book in the garden .", "two dogs run across the field .", "the meeting was postponed again .",
    "rain is expected tomorrow afternoon .", "he cooked pasta for dinner .",
]
NEGATIVES = [
    "a man is playing a violin .", "the dog sleeps on the mat .", "stocks rose sharply on friday .",
    "", "two cats walk across the road .", "the meeting was held again .",
    "snow is expected tomorrow morning .", "he cooked rice for lunch .",
]
PARAPHRASES = [
    "a guy plays the guitar .", "on the mat the cat is sleeping .", "shares dropped hard on monday .",
    "in the garden she is reading a book .", "a pair of dogs runs over the field .", "they delayed the meeting once more .",
    "tomorrow afternoon it should rain .", "for dinner he made pasta .",
]
AUGMENTED = [
    "a man is playing a guitar .", "the cat doesn't sleep on the mat .", "fell stocks sharply on monday .",
    "she read a book in the garden .", "two dogs run the field .", "the meeting was not postponed again .",
    "rain is expected tomorrow afternoon .", "he cooks pasta for dinner .",
]
AUG_LABELS = [
    "no_augmentation", "auxiliary_negation_removal", "random_swap", "tense_transformation", "random_delete",
    "auxiliary_negation_removal", "no_augmentation", "tense_transformation",
]

# name -> (method, params, step). Steps select UNA's negative batches (steps 0, alpha, 2 alpha, ...).
CASES = {
    "simcse": ("simcse", {}, 0),
    "una_negatives": ("una", {"alpha": 1}, 0),
    "una_plain_step": ("una", {"alpha": 5}, 1),
    "una_authors_negatives": ("una", {"alpha": 1, "fidelity": "authors_code"}, 0),
    "una_authors_plain_step": ("una", {"alpha": 5, "fidelity": "authors_code"}, 1),
    "una_paraphrase_negatives": ("una", {"alpha": 1, "paraphrase_cache": "paraphrases.parquet"}, 0),
    "una_paraphrase_plain_step": ("una", {"alpha": 5, "paraphrase_cache": "paraphrases.parquet"}, 1),
    "san": ("san", {}, 0),
    "san_weighted": ("san", {"tau2": 0.06, "own_negative_weight": 2.0, "p2": 0.3}, 0),
    "augcse": ("augcse", {"augmentations": "12-aug"}, 0),
    "augcse_authors": ("augcse", {"augmentations": "12-aug", "fidelity": "authors_code", "grl_multiplier": -10.0}, 0),
    "vascl": ("vascl", {"k": 4}, 3),
    "vascl_authors": ("vascl", {"k": 4, "fidelity": "authors_code"}, 3),
    "promptbert": ("promptbert", {}, 0),
    "sncse": ("sncse", {}, 0),
    "cotbert": ("cotbert", {}, 0),
    "cotbert_ablations": ("cotbert", {"positive_negatives": False, "denoise": "none"}, 0),
    "una_with_prompt": ("una", {"alpha": 1, "encoder": "prompt"}, 0),
    "esimcse": ("esimcse", {}, 0),
    "esimcse_authors": ("esimcse", {"fidelity": "authors_code"}, 0),
}

COLUMNS = {"sentence": SENTENCES, "negative": NEGATIVES, "paraphrase": PARAPHRASES, "augmented": AUGMENTED,
           "aug_label": AUG_LABELS, "soft_negative": NEGATIVES}


def recipe_build(method: str, params: dict, encoder):
    params = dict(params)
    if "paraphrase_cache" in params:
        params["positives"] = "paraphrase"
    recipe = Recipe.named(method, **params)
    model = recipe.build(encoder)
    columns = {**COLUMNS, "una_negative": NEGATIVES, "san_negative": NEGATIVES, "soft_negative": NEGATIVES}

    def loss_fn(model, _columns, step):
        # The training loop's path: arrays made in the data pipeline, collated per batch.
        inputs = StepInputs(recipe, str(encoder.tokenizer.name_or_path), 32)
        return recipe.loss(model, inputs.nest(inputs.collate(inputs.arrays(columns))), step)

    return model, loss_fn


def close(a: float, b: float, scale: float, floor: float) -> bool:
    """Equal up to float32 round-off, relative to the tensor's gradient norm ``scale`` and, for
    tensors whose true gradient is about zero (e.g. attention key biases), to ``floor``, a
    millionth of the whole gradient's norm: autograd may sum a gradient's contributions in another
    order when the terms are computed in another order."""
    return abs(a - b) <= 1e-5 * (abs(b) + scale) + floor


def summarise(model: torch.nn.Module, loss: torch.Tensor, metrics: dict) -> dict:
    encoder, heads = {}, []
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.detach().double().flatten()
        direction = torch.randn(g.numel(), generator=torch.Generator().manual_seed(g.numel()), dtype=torch.float64)
        summary = [float(g.sum()), float(g.norm()), float(g @ direction)]
        if name.startswith("encoder."):
            encoder[name[len("encoder."):]] = summary
        else:
            heads.append([list(p.shape), summary])
    heads.sort(key=lambda item: (item[0], item[1][1]))
    return {"loss": float(loss.detach()), "metrics": {k: float(v) for k, v in metrics.items()},
            "encoder_grads": encoder, "head_grads": heads}


def run_case(name: str, model_dir: Path, build) -> dict:
    """``build(method, params, encoder) -> (model, loss_fn(model, columns, step))``; seeds fixed."""
    from methods.encoder import Encoder

    method, params, step = CASES[name]
    encoder = Encoder.from_pretrained(str(model_dir), dropout=0.1)
    torch.manual_seed(1)
    model, loss_fn = build(method, params, encoder)
    model.train()
    torch.manual_seed(2)
    loss, metrics = loss_fn(model, COLUMNS, step)
    loss.backward()
    return summarise(model, loss, metrics)


def record(out: Path, cases: list[str], why: str) -> None:
    """Record ``cases`` with the current recipes into ``out``, keeping the other cases as they are:
    for a change of behaviour that is intended (``why``; say so in the commit too)."""
    import subprocess
    import tempfile

    from platform.data.columns import build_tiny_bert

    data = json.loads(out.read_text()) if out.is_file() else {"cases": {}}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_bert(Path(tmp) / "tiny")
        for name in cases:
            data["cases"][name] = {**run_case(name, model_dir, recipe_build), "recorded_again": f"on top of {commit}: {why}"}
    out.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "record":
        raise SystemExit("usage: python -m tests.recipe_reference record OUT.json CASE[,CASE...] WHY")
    record(Path(sys.argv[2]), sys.argv[3].split(","), sys.argv[4])
