"""Matryoshka prefixes (Kusupati et al., 2022, Sec. 3, Eq. 1): the recipe's contrastive loss summed,
with its weights, over the first m coordinates of every vector it sees, against a direct
computation; a recipe's step with them; what is refused in one line."""

from __future__ import annotations

import pytest
import torch

from methods.encoder import Encoder
from methods.ingredients import InvalidParams
from methods.losses import HiNCE, InfoNCE, Negative, Views
from methods.matryoshka import Matryoshka
from methods.recipe import Recipe, SharedParams
from platform.data.pipeline import StepInputs
from tests.recipe_reference import SENTENCES
from tests.reference import slow_hince, slow_info_nce


def _views(seed: int = 0, n: int = 6, d: int = 12) -> Views:
    g = torch.Generator().manual_seed(seed)
    a, p, z = (torch.randn(n, d, generator=g) for _ in range(3))
    valid = torch.tensor([True, False, True, True, True, False])[:n]
    return Views(a, p, [Negative(z, valid)], torch.randn(4, d, generator=g))


def test_the_loss_is_the_weighted_sum_of_the_loss_on_each_prefix_renormalised():
    """Eq. 1 with L = InfoNCE: each prefix cut by hand, its cosines explicit (the cut vectors
    renormalised), the queue's columns and the valid negatives cut with them."""
    v = _views()
    m = Matryoshka.parse("12,8,3", "1,0.5,2")
    got = float(m.loss(InfoNCE(None, SharedParams()), v))
    want = 0.0
    for dims, c in ((12, 1.0), (8, 0.5), (3, 2.0)):
        columns = torch.cat([v.negatives[0].z[v.negatives[0].valid][:, :dims], v.columns[:, :dims]]).double()
        want += c * slow_info_nce(v.anchor[:, :dims].double(), v.positive[:, :dims].double(), 0.05, columns)
    assert got == pytest.approx(want, rel=1e-5)


def test_any_loss_is_cut_the_same_way():
    v = _views(1)
    shared = SharedParams()
    hince = HiNCE(None, shared)
    got = float(Matryoshka.parse("5,2", "").loss(hince, v))
    n = v.negatives[0]
    want = sum(slow_hince(v.anchor[:, :d].double(), v.positive[:, :d].double(), n.z[:, :d].double(), 0.05,
                          hince.params.tau2, valid=n.valid.tolist()) for d in (5, 2))
    assert got == pytest.approx(want, rel=1e-5)


def test_a_recipes_step_sums_its_loss_over_the_prefixes(tiny_model):
    """SimCSE with mean pooling (no projection: what the loss sees is what is evaluated): the step's
    loss is InfoNCE on the whole 32-d vectors plus on their first 16 and 8, each renormalised."""
    recipe = Recipe.named("simcse", pooler="avg", matryoshka_dims="32,16,8")
    encoder = Encoder.from_pretrained(str(tiny_model), dropout=0.1)
    torch.manual_seed(0)
    model = recipe.build(encoder)
    inputs = StepInputs(recipe, str(tiny_model), 32)
    batch = inputs.nest(inputs.collate(inputs.arrays({"sentence": SENTENCES, "row": list(range(len(SENTENCES)))})))
    seen = []
    model.register_forward_hook(lambda module, args, out: seen.append(out.detach()))
    torch.manual_seed(1)
    loss, metrics = recipe.loss(model, batch, 0)
    (z,) = seen
    n = len(SENTENCES)
    want = sum(slow_info_nce(z[:n, :d].double(), z[n:, :d].double(), 0.05) for d in (32, 16, 8))
    assert loss.item() == pytest.approx(want, rel=1e-4) and float(metrics["contrastive_loss"]) == pytest.approx(want, rel=1e-4)
    loss.backward()  # the prefixes' gradients reach the encoder


@pytest.mark.parametrize("values,needle", [
    ({"matryoshka_dims": "16,8"}, "pooler=cls with mlp_only_train=true"),  # SimCSE's default pooling
    ({"matryoshka_dims": "16,16", "pooler": "avg"}, "distinct"),
    ({"matryoshka_dims": "16,x", "pooler": "avg"}, "whole numbers"),
    ({"matryoshka_dims": "0", "pooler": "avg"}, ">= 1"),
    ({"matryoshka_dims": "16,8", "matryoshka_weights": "1", "pooler": "avg"}, "one weight > 0 for each of the 2"),
    ({"matryoshka_dims": "16", "matryoshka_weights": "-1", "pooler": "avg"}, "one weight > 0"),
    ({"matryoshka_weights": "1,1", "pooler": "avg"}, "without matryoshka_dims"),
])
def test_what_cannot_be_trained_is_refused_in_one_line(values, needle):
    with pytest.raises(InvalidParams) as exc:
        Recipe.named("simcse", **values)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_a_training_only_head_is_refused_and_an_exported_mlp_is_not(tiny_model):
    with pytest.raises(InvalidParams, match="aux=vascl's projection head"):
        Recipe.named("vascl", matryoshka_dims="16,8")
    with pytest.raises(InvalidParams, match="mlp_only_train=true"):
        Recipe.named("promptbert", matryoshka_dims="16,8")
    kept = Recipe.named("simcse", mlp_only_train=False, matryoshka_dims="32,8")  # the MLP folded into the export
    assert kept.eval_pooler() == "cls" and kept.matryoshka.dims == (32, 8)
    with pytest.raises(InvalidParams, match="beyond the 32 dimensions"):
        Recipe.named("simcse", pooler="avg", matryoshka_dims="64,8").build(Encoder.from_pretrained(str(tiny_model)))
