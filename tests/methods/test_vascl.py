"""VaSCL (Zhang et al.): neighbourhoods, the virtual augmentation, the loss and its gradient flow."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from methods.ingredients import InvalidParams, derive_seed
from methods.losses import gather_with_grad
from methods.recipe import Recipe
from methods.vascl import (
    VaSCL,
    VaSCLParams,
    Head,
    neighbourhood_loss,
    neighbours,
    virtual_augmentation_loss,
    virtual_perturbation,
)
from tests.helpers import leave_process_group
from tests.reference import slow_neighbourhood_loss, slow_nt_xent


def brute_neighbours(e, k):
    out = []
    for i in range(len(e)):
        scores = [(float(e[i] @ e[j]), j) for j in range(len(e)) if j != i]
        out.append(sorted(j for _, j in sorted(scores, reverse=True)[:k]))
    return out


def test_neighbourhood_excludes_self_and_matches_brute_force():
    e = torch.randn(12, 5, generator=torch.Generator().manual_seed(0))
    nb = neighbours(e, 4, cosine=False)
    assert all(i not in nb[i].tolist() for i in range(12))
    assert [sorted(r) for r in nb.tolist()] == brute_neighbours(e, 4)
    unit = F.normalize(e, dim=-1)
    assert [sorted(r) for r in neighbours(e, 4).tolist()] == brute_neighbours(unit, 4)  # cosine (paper)


def test_cosine_and_dot_product_neighbourhoods_differ_on_long_vectors():
    """Paper (cosine, Eq. 1's sim) and the authors' code (raw dot product) pick other neighbours
    when norms differ: a long vector in another direction wins the dot product only."""
    e = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 10.0], [5.0, 5.0]])
    assert neighbours(e, 1)[0].tolist() == [1]
    assert neighbours(e, 1, cosine=False)[0].tolist() == [3]


def _nbr_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    full = torch.randn(10, 6, generator=torch.Generator().manual_seed(3))
    local = full[rank * 5 : (rank + 1) * 5].clone()
    nb = neighbours(gather_with_grad(local), 3, cosine=False)
    torch.save(nb, os.path.join(out_dir, f"nb{rank}.pt"))
    leave_process_group()


def test_neighbourhood_over_two_gloo_workers_uses_global_indices():
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_nbr_worker, args=(2, os.path.join(tmp, "init"), tmp), nprocs=2, join=True, start_method="spawn")
        got = [torch.load(os.path.join(tmp, f"nb{r}.pt")) for r in range(2)]
    full = torch.randn(10, 6, generator=torch.Generator().manual_seed(3))
    for nb in got:
        assert [sorted(r) for r in nb.tolist()] == brute_neighbours(full, 3)


def test_neighbourhood_loss_matches_reference():
    g = torch.Generator().manual_seed(1)
    q, p = F.normalize(torch.randn(6, 4, generator=g), dim=-1), F.normalize(torch.randn(6, 4, generator=g), dim=-1)
    negs = F.normalize(torch.randn(6, 3, 4, generator=g), dim=-1)
    assert float(neighbourhood_loss(q, p, negs, 0.05)) == pytest.approx(slow_neighbourhood_loss(q, p, negs, 0.05), rel=1e-5)


def test_total_loss_matches_reference(tiny_model):
    from methods.encoder import Encoder

    torch.manual_seed(0)
    method = Recipe.named("vascl", k=3)
    enc = Encoder.from_pretrained(str(tiny_model), dropout=0.0)
    model = method.build(enc).eval()
    sents = ["a man plays guitar", "the cat sleeps", "rain falls", "stocks fell", "she reads", "dogs run"]
    loss, metrics = method.loss(model, {"sentence": enc.tokenize(sents)}, step=0)
    with torch.no_grad():
        e = model(enc.tokenize(sents))
        z = model.projection(e)
        nb = neighbours(e, 3)
        # The step's noise: from the run's seed (0) and the step.
        delta = virtual_perturbation(model.projection, e, nb, VaSCLParams(k=3), 0.05,
                                     torch.Generator().manual_seed(derive_seed(0, "vascl-noise", 0)))
        za = model.projection(e + delta)
    # Eq. 1: each of the 2M views (no dropout: the two coincide) among the 2M-1 others.
    n = len(sents)
    instance = slow_nt_xent(list(torch.cat([z, z])), [i + n for i in range(n)] + list(range(n)), 0.05)
    # Eq. 4: both directions against N_A(i) = the K neighbours and their virtual augmentations;
    # Eq. 5's 1/2M: the mean over the 2M views.
    n_a = [[*z[nb[i]], *za[nb[i]]] for i in range(n)]
    va = (slow_neighbourhood_loss(za, z, n_a, 0.05) + slow_neighbourhood_loss(z, za, n_a, 0.05)) / 2
    assert metrics["contrastive_loss"] == pytest.approx(instance, rel=1e-4)
    assert metrics["vascl_neighbourhood"] == pytest.approx(va, rel=1e-4)
    assert float(loss.detach()) == pytest.approx(instance + va, rel=1e-4)


def test_delta_has_norm_Delta_and_beats_a_random_direction():
    torch.manual_seed(0)
    head = Head(16, 8)
    e = torch.randn(32, 16)
    nb = neighbours(e, 5)
    params = VaSCLParams(k=5, delta=2.0)
    delta = virtual_perturbation(head, e, nb, params, 0.05, torch.Generator().manual_seed(0))
    torch.testing.assert_close(delta.norm(dim=-1), torch.full((32,), 2.0))
    z = head(e).detach()
    with torch.no_grad():
        adv = neighbourhood_loss(head(e + delta), z, z[nb], 0.05)
        rand = F.normalize(torch.randn(32, 16, generator=torch.Generator().manual_seed(5)), dim=-1) * 2.0
        rnd = neighbourhood_loss(head(e + rand), z, z[nb], 0.05)
    assert adv > rnd


def test_the_initial_perturbation_is_at_radius_delta_as_in_the_authors_code():
    """The authors' vat_utils.py takes the gradient at e + Delta u (xi = Delta, ``xi=0``), u uniform
    in [-0.5, 0.5) normalised; the paper's start is isotropic Gaussian. Checked against the gradient
    of the slow Eq. 2 at that point; the result lies on the Delta-sphere, the two starts differ."""
    torch.manual_seed(0)
    head = Head(16, 8)
    e = torch.randn(10, 16)
    nb = neighbours(e, 3)
    params = VaSCLParams(k=3, delta=2.0)
    paper = virtual_perturbation(head, e, nb, params, 0.05, torch.Generator().manual_seed(0))
    authors = virtual_perturbation(head, e, nb, params, 0.05, torch.Generator().manual_seed(0), authors=True)
    for d in (paper, authors):
        torch.testing.assert_close(d.norm(dim=-1), torch.full((10,), 2.0))
    assert not torch.allclose(paper, authors)

    u = torch.rand(e.shape, generator=torch.Generator().manual_seed(0)) - 0.5
    start = (2.0 * F.normalize(u, dim=-1)).double().requires_grad_(True)
    head64 = Head(16, 8).double()
    head64.load_state_dict({k: v.double() for k, v in head.state_dict().items()})
    z = head64(e.double()).detach()
    q = head64(e.double() + start)
    loss = sum(-torch.log(torch.exp(q[i] @ z[i] / 0.05)
                          / (torch.exp(q[i] @ z[i] / 0.05) + sum(torch.exp(q[i] @ z[j] / 0.05) for j in nb[i])))
               for i in range(10))  # sum over i of l_N(i) (Eq. 2), one instance at a time
    (grad,) = torch.autograd.grad(loss, start)
    # Row by row the same direction (float32 against float64 through tau = 0.05).
    cosines = F.cosine_similarity(authors.double(), grad, dim=-1)
    assert float(cosines.min()) > 0.9999, cosines
    small = virtual_perturbation(head, e, nb, VaSCLParams(k=3, delta=2.0, xi=1e-3), 0.05,
                                 torch.Generator().manual_seed(0), authors=True)
    assert not torch.allclose(small, authors, atol=1e-2)  # VAT's small xi: another direction


@pytest.mark.parametrize("fidelity,reaches", [("paper", True), ("authors_code", False)])
def test_neighbourhood_term_reaches_encoder_only_in_paper_mode(tiny_model, fidelity, reaches):
    from methods.encoder import Encoder

    torch.manual_seed(0)
    enc = Encoder.from_pretrained(str(tiny_model), dropout=0.0)
    method = Recipe.named("vascl", k=2, fidelity=fidelity)
    model = method.build(enc)
    e = model(enc.tokenize(["a b c", "the cat", "rain falls", "dogs run"]))
    nb = neighbours(e, 2)
    head = model.projection
    delta = virtual_perturbation(head, e, nb, VaSCLParams(k=2), 0.05, torch.Generator().manual_seed(0))
    # The recipe's own step, and the equation with its attach flag, both per fidelity.
    step_grads = torch.autograd.grad(method.aux[0].forward(_outputs(model, e))[0],
                                     [p for p in enc.parameters() if p.requires_grad], allow_unused=True,
                                     retain_graph=True)
    assert (sum(float(g.abs().sum()) for g in step_grads if g is not None) > 0) == reaches
    va = virtual_augmentation_loss(head, e, nb, delta, 0.05, attach=fidelity == "paper")
    grads = torch.autograd.grad(va, [p for p in enc.parameters() if p.requires_grad], allow_unused=True)
    encoder_grad = sum(float(g.abs().sum()) for g in grads if g is not None)
    assert (encoder_grad > 0) == reaches
    head_grads = torch.autograd.grad(virtual_augmentation_loss(head, e, nb, delta, 0.05, attach=False),
                                     list(head.parameters()))
    assert all(float(g.abs().sum()) > 0 for g in head_grads)  # the head always learns from it


def test_authors_code_trains_the_head_through_the_augmented_views_only():
    """vat_utils.py: the clean projections are computed under no_grad, so the head's gradient is
    that of Eq. 4 with z held constant (a direct reference with z detached by hand), not Eq. 4's."""
    torch.manual_seed(0)
    head = Head(8, 4)
    e, nb = torch.randn(6, 8), neighbours(torch.randn(6, 8), 2)
    delta = 0.5 * F.normalize(torch.randn(6, 8), dim=-1)

    def reference(clean_trains: bool):
        z, z_aug = head(e), head(e + delta)
        z = z if clean_trains else z.detach()
        augmented = torch.cat([z[nb], z_aug[nb]], dim=1)
        terms = []
        for q, p in ((z_aug, z), (z, z_aug)):  # both directions, each row against its 2K neighbours
            for i in range(len(e)):
                logits = torch.cat([(q[i] * p[i]).sum().view(1), augmented[i] @ q[i]]) / 0.05
                terms.append(-F.log_softmax(logits, 0)[0] / len(e))
        return 0.5 * sum(terms)

    for attach in (False, True):
        got = torch.autograd.grad(virtual_augmentation_loss(head, e, nb, delta, 0.05, attach=attach),
                                  list(head.parameters()))
        want = torch.autograd.grad(reference(clean_trains=attach), list(head.parameters()))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def _outputs(model, e):
    from methods.ingredients import StepOutputs

    return StepOutputs(model, 0, {"anchor": e}, {}, {})


def test_head_learning_rate_group(tiny_model):
    from methods.encoder import Encoder

    method = Recipe.named("vascl", head_lr_scale=100.0)
    model = method.build(Encoder.from_pretrained(str(tiny_model)))
    groups = method.param_groups(model, 1e-5)
    assert [g["lr"] for g in groups] == [1e-5, 1e-3]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in model.projection.parameters()}


@pytest.mark.parametrize("kw,message", [({"k": 0}, "k must be >= 1"), ({"delta": 0}, "delta must be > 0")])
def test_bad_params(kw, message):
    with pytest.raises(InvalidParams, match=message):
        VaSCL(VaSCLParams(**kw))
    with pytest.raises(InvalidParams, match="smaller than the batch size"):
        VaSCLParams(k=16).validate_batch(16)


def test_the_perturbation_keeps_its_radius_and_direction_under_low_precision_autocast():
    """The gradient that finds delta is taken in float32 whatever the caller's autocast
    (under fp16 an unscaled gradient can underflow to zero, and the perturbation would vanish):
    under bf16 autocast (CPU) delta has norm Delta on every row and the fp32 run's direction."""
    torch.manual_seed(0)
    head = Head(16, 8)
    e = torch.randn(10, 16)
    nb = neighbours(e, 3)
    params = VaSCLParams(k=3, delta=2.0)
    fp32 = virtual_perturbation(head, e, nb, params, 0.05, torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = virtual_perturbation(head, e, nb, params, 0.05, torch.Generator().manual_seed(0))
    assert low.dtype == torch.float32
    torch.testing.assert_close(low.norm(dim=-1), torch.full((10,), 2.0))
    torch.testing.assert_close(low, fp32)
