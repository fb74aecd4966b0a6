"""AugCSE: gradient reversal, discriminator loss (Eq. 3) vs a slow reference, labels, the loss
in one and two (gloo) processes."""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from methods.augcse import (
    AugCSE,
    AugCSEParams,
    AugmentationDiscriminator,
    discriminator_loss,
    grad_reverse,
)
from methods.augmentations import NO_AUGMENTATION
from methods.ingredients import Draws, InvalidParams
from methods.encoder import Encoder, pad_cat
from methods.recipe import Recipe, SharedParams
from methods.losses import global_mean, info_nce
from tests.helpers import leave_process_group


@pytest.mark.parametrize("multiplier", [-1.0, 0.0, 2.5, -100.0])
def test_grl_is_identity_forward_and_scales_the_gradient(multiplier):
    x = torch.randn(4, 3, requires_grad=True)
    upstream = torch.randn(4, 3)
    y = grad_reverse(x, multiplier)
    assert torch.equal(y, x)
    y.backward(upstream)
    torch.testing.assert_close(x.grad, multiplier * upstream)


def test_discriminator_loss_matches_slow_reference():
    torch.manual_seed(0)
    logits, labels = torch.randn(5, 4), torch.tensor([0, 3, 1, 1, 2])
    total = 0.0
    for i in range(5):
        for k in range(4):
            p = 1 / (1 + math.exp(-float(logits[i, k])))
            y = 1.0 if labels[i] == k else 0.0
            total += -(y * math.log(p) + (1 - y) * math.log(1 - p))
    assert float(discriminator_loss(logits, labels)) == pytest.approx(total / 20, rel=1e-6)


def test_discriminator_architecture_ends_with_tanh():
    """App. A.5's listing (and the authors' code) ends the discriminator with nn.Tanh()."""
    torch.manual_seed(0)
    d = AugmentationDiscriminator(6, 5, layers=2, dropout=0.2).eval()
    assert [tuple(layer.weight.shape) for layer in d.layers] == [(12, 6), (5, 12)]
    x = torch.randn(3, 6)
    hidden = torch.tanh(d.layers[0](x))
    torch.testing.assert_close(d(x), torch.tanh(d.layers[1](hidden)))
    model = Recipe.named("augcse").aux[0].heads(6 // 2)
    assert model.tanh_logits and model.dropout.p == 0.2


def _batch(n=3000):
    sentences = np.asarray([f"s{i}" for i in range(n)], dtype=object)
    return {
        "sentence": sentences,
        "aug_random_swap": np.asarray([f"swap{i}" for i in range(n)], dtype=object),
        "aug_yoda_perturbation": sentences.copy(),  # never changes anything
        "aug_tense_transformation": np.asarray([f"tense{i}" if i % 2 else f"s{i}" for i in range(n)], dtype=object),
    }


def test_augment_samples_uniformly_and_labels_unchanged_text_as_no_augmentation():
    method = AugCSE(AugCSEParams(augmentations="random_swap,yoda_perturbation,tense_transformation"))
    out = method.augment(_batch(), None, Draws(0))
    assert set(out) == {"sentence", "augmented", "aug_label"}
    labels, aug, sent = out["aug_label"], out["augmented"], out["sentence"]
    assert all((lab == NO_AUGMENTATION) == (a == s) for lab, a, s in zip(labels, aug, sent))
    swap = np.char.startswith(aug.astype(str), "swap")
    tense = np.char.startswith(aug.astype(str), "tense")
    assert (labels[swap] == "random_swap").all() and (labels[tense] == "tense_transformation").all()
    # Uniform over three augmentations; yoda and the unchanged half of tense are "no augmentation".
    assert swap.mean() == pytest.approx(1 / 3, abs=0.03)
    assert tense.mean() == pytest.approx(1 / 6, abs=0.03)
    assert (labels == NO_AUGMENTATION).mean() == pytest.approx(1 / 2, abs=0.03)
    ids = method.tensor_columns(out, "cpu")["aug_label"]
    assert method.labels == [NO_AUGMENTATION, "random_swap", "yoda_perturbation", "tense_transformation"]
    assert [method.labels[i] for i in ids.tolist()] == list(labels)
    with pytest.raises(InvalidParams, match="not one of this run's augmentations"):
        method.tensor_columns({"aug_label": ["back_translation"]}, "cpu")


def test_sampling_is_fixed_across_epochs_and_seeded():
    """Footnote 6: a sentence gets the same augmentation every pass (every epoch's draws), in any
    batch; the run's seed decides which."""
    names = "random_swap,yoda_perturbation,tense_transformation"
    batch = _batch(600)
    first = AugCSE(AugCSEParams(augmentations=names)).augment(batch, None, Draws(0))["augmented"]
    again = AugCSE(AugCSEParams(augmentations=names)).augment(batch, None, Draws(0, epoch=3))["augmented"]
    half = {k: v[300:] for k, v in batch.items()}
    alone = AugCSE(AugCSEParams(augmentations=names)).augment(half, None, Draws(0))["augmented"]
    other = AugCSE(AugCSEParams(augmentations=names)).augment(batch, None, Draws(1))["augmented"]
    assert (first == again).all() and (first[300:] == alone).all()
    assert (first != other).mean() > 0.3


@pytest.mark.parametrize(
    "kwargs,needle",
    [({"lambda_disc": -1e-3}, "lambda_disc must be >= 0"), ({"augmentations": ""}, "augmentations is empty"),
     ({"augmentations": "nope"}, "unknown augmentation 'nope'"), ({"disc_dropout": 1.0}, "disc_dropout must be in")],
)
def test_params_validation(kwargs, needle):
    with pytest.raises(InvalidParams, match=needle):
        AugCSEParams(**kwargs).validate()
    with pytest.raises(InvalidParams, match="fidelity must be"):
        SharedParams(fidelity="x").validate()


def test_pad_cat_pads_to_the_longest():
    a = {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.ones(2, 3, dtype=torch.long)}
    b = {"input_ids": torch.ones(1, 5, dtype=torch.long), "attention_mask": torch.ones(1, 5, dtype=torch.long)}
    out = pad_cat([a, b])
    assert out["input_ids"].shape == (3, 5) and out["attention_mask"][:2, 3:].sum() == 0


SENTENCES = ["a man plays a guitar .", "the cat sleeps .", "stocks fell on monday .", "she reads a book ."]
AUGMENTED = ["a guitar plays a man .", "the cat sleeps .", "stocks fall on monday .", "she does read a book ."]
LABELS = ["subject_object_switch", NO_AUGMENTATION, "tense_transformation", "random_swap"]


def _setup(model_dir, **params):
    torch.manual_seed(0)
    method = Recipe.named("augcse", augmentations="subject_object_switch,tense_transformation,random_swap", **params)
    encoder = Encoder.from_pretrained(str(model_dir), dropout=0.0)
    model = method.build(encoder)
    batch = {
        "sentence": encoder.tokenize(SENTENCES, max_len=32), "augmented": encoder.tokenize(AUGMENTED, max_len=32),
        **method.tensor_columns({"aug_label": LABELS}, "cpu"),
    }
    return method, model, batch


def test_loss_is_contrastive_plus_lambda_disc(tiny_model):
    method, model, batch = _setup(tiny_model, lambda_disc=0.3)
    model.train()
    torch.manual_seed(1)
    loss, metrics = method.loss(model, batch, 0)
    torch.manual_seed(1)
    z1, z2, logits = _forward(model, batch, method.aux[0].params.grl_multiplier)
    expected = info_nce(z1, z2, 0.05) + 0.3 * discriminator_loss(logits, batch["aug_label"])
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
    assert set(metrics) == {"contrastive_loss", "disc_loss", "disc_accuracy"} and 0 <= metrics["disc_accuracy"] <= 1


def _forward(model, batch, multiplier):
    """[x; x; x_aug] in one pass through encoder and projector, the discriminator behind the GRL."""
    n = batch["sentence"]["input_ids"].shape[0]
    z = model.projection(model(pad_cat([batch["sentence"], batch["sentence"], batch["augmented"]])))
    z1, z2, za = z[:n], z[n : 2 * n], z[2 * n :]
    return z1, z2, model.heads["augcse"](grad_reverse(torch.cat([z1, za], dim=1), multiplier))


def _grads(model_dir, multiplier):
    method, model, batch = _setup(model_dir, grl_multiplier=multiplier, lambda_disc=1.0, disc_dropout=0.0)
    model.train()
    _, _, logits = _forward(model, batch, multiplier)
    discriminator_loss(logits, batch["aug_label"]).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_grl_makes_the_encoder_work_against_the_discriminator(tiny_model):
    """The discriminator learns the same way under +1 and -1; the encoder and projector get the
    opposite gradient (antagonistic), and none at all under 0."""
    plus, minus, zero = _grads(tiny_model, 1.0), _grads(tiny_model, -1.0), _grads(tiny_model, 0.0)
    disc = [n for n in plus if n.startswith("heads.augcse.")]
    body = [n for n in plus if not n.startswith("heads.augcse.")]
    assert disc and body
    for n in disc:
        torch.testing.assert_close(minus[n], plus[n])
    for n in body:
        torch.testing.assert_close(minus[n], -plus[n])
        assert float(zero[n].abs().max()) == 0.0
    assert any(float(plus[n].abs().max()) > 0 for n in body)


# ------------------------------------------------------------------------------------------------
# global_mean under DDP: two gloo processes vs one process on the whole batch


def _head():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


X = torch.arange(24, dtype=torch.float32).reshape(8, 3) / 10


def _per_row(head, x):
    return (head(x) ** 2).sum(1).mean()


def _gm_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {}
    for kind in ("global_mean", "naive"):
        head = torch.nn.parallel.DistributedDataParallel(_head())
        local = X[rank * 4 : (rank + 1) * 4]
        loss = _per_row(head, local)
        loss = global_mean(loss) if kind == "global_mean" else loss
        (loss * world).backward()  # the training loop's x W
        results[kind] = {"loss": float(loss.detach()), "grad": head.module.weight.grad.clone()}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    leave_process_group()


def test_global_mean_gives_the_global_gradient_under_ddp():
    head = _head()
    ref_loss = _per_row(head, X)
    ref_loss.backward()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_gm_worker, args=(2, os.path.join(tmp, "init"), tmp), nprocs=2, join=True, start_method="spawn")
        outs = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(2)]
    for out in outs:
        assert out["global_mean"]["loss"] == pytest.approx(float(ref_loss.detach()), rel=1e-6)
        torch.testing.assert_close(out["global_mean"]["grad"], head.weight.grad)
        # Without it, a local mean x W is W times the global gradient: the check can fail.
        torch.testing.assert_close(out["naive"]["grad"], 2 * head.weight.grad)


def test_the_projector_normalises_every_row_with_the_reference_rows_statistics():
    """AugCSE's BN projector: negatives projected beside (or apart from) the batch take the
    anchors' batch statistics, not their own; with every row as the reference it is plain BN."""
    from methods.augcse import BatchNormProjector

    torch.manual_seed(0)
    g = BatchNormProjector(16).train()
    x = torch.randn(12, 16)
    reference = torch.tensor([True] * 8 + [False] * 4)
    plain = BatchNormProjector(16).train()
    plain.load_state_dict(g.state_dict())
    torch.testing.assert_close(g(x, torch.ones(12, dtype=torch.bool)), plain(x))
    alone = plain(x[:8])  # the reference rows by themselves
    mixed = g(x, reference)
    torch.testing.assert_close(mixed[:8], alone)  # the negatives do not move the batch's statistics
    moved = BatchNormProjector(16).train()
    moved.load_state_dict(g.state_dict())
    assert not torch.allclose(moved(x)[:8], alone)  # as they would as part of the batch
    torch.testing.assert_close(g.net[1].running_mean, plain.net[1].running_mean)  # updated by the reference rows


def test_the_projectors_statistics_are_float32_under_low_precision_autocast():
    """Under bf16 autocast (CPU) the hand-written BN of the projector (the DDP path, or a
    recipe with negatives) computes its statistics in float32, as nn.BatchNorm1d's kernel does: the
    same running statistics and output as nn.BatchNorm1d, and the fp32 run's within bf16's rounding."""
    from methods.augcse import batch_norm_from

    torch.manual_seed(0)
    x = torch.randn(64, 32) * 30 + 100  # large, offset rows: where low-precision sums of squares fail
    every = torch.ones(64, dtype=torch.bool)
    ours, reference = torch.nn.BatchNorm1d(32).train(), torch.nn.BatchNorm1d(32).train()
    fp32 = batch_norm_from(torch.nn.BatchNorm1d(32).train(), x, every)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = x.to(torch.bfloat16)  # what a bf16 Linear hands the BN
        got = batch_norm_from(ours, low, every)
        want = reference(low)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(ours.running_mean, reference.running_mean, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(ours.running_var, reference.running_var, atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=1e-2)  # bf16 output rounding
    torch.testing.assert_close(got.float(), fp32, atol=0.05, rtol=0.05)  # bf16's input rounding alone
