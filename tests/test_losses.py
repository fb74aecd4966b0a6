"""InfoNCE against a slow reference, and DDP all-gather training equal to one process."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

from methods.losses import gather_with_grad, info_nce
from tests.helpers import slow_info_nce


@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_info_nce_matches_reference(tau):
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    assert float(info_nce(z1, z2, tau)) == pytest.approx(slow_info_nce(z1, z2, tau), rel=1e-5)


def test_info_nce_with_extra_negatives_matches_reference():
    g = torch.Generator().manual_seed(1)
    z1, z2, neg = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g), torch.randn(7, 8, generator=g)
    assert float(info_nce(z1, z2, 0.05, neg)) == pytest.approx(slow_info_nce(z1, z2, 0.05, neg), rel=1e-5)


def test_info_nce_rejects_bad_temperature():
    with pytest.raises(ValueError, match="temperature"):
        info_nce(torch.randn(2, 3), torch.randn(2, 3), 0.0)


def test_gather_is_identity_without_distributed():
    x = torch.randn(3, 4, requires_grad=True)
    assert gather_with_grad(x) is x


# ------------------------------------------------------------------------------------------------
# Two gloo processes vs one process on the concatenated batch


def _build(model_dir, recipe="simcse"):
    from methods.encoder import Encoder
    from methods.recipe import Recipe

    torch.manual_seed(0)
    method = Recipe.named(recipe, **({"k": 3} if recipe == "vascl" else {}))
    encoder = Encoder.from_pretrained(str(model_dir), dropout=0.0)  # no dropout: deterministic views
    return method, encoder, method.build(encoder)


SENTENCES = [
    "a man is playing a guitar .", "the cat sleeps on the mat .", "stocks fell sharply on monday .",
    "she reads a book in the garden .", "two dogs run across the field .", "the meeting was postponed again .",
    "rain is expected tomorrow afternoon .", "he cooked pasta for dinner .",
]


def _worker(rank, world, model_dir, init_file, out_dir, recipe):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    method, encoder, model = _build(model_dir, recipe)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    local = len(SENTENCES) // world
    batch = {"sentence": encoder.tokenize(SENTENCES[rank * local : (rank + 1) * local], max_len=32)}
    loss, _ = method.loss(ddp, batch, 0)
    (loss * world).backward()  # exactly what train_loop_per_worker does
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.save({"loss": loss.detach(), "grads": grads}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.parametrize("recipe", ["simcse", "vascl"])
def test_ddp_two_workers_equal_one_process(tiny_model, recipe):
    """Also for VaSCL, whose head sees the all-gathered batch: applied to local rows and gathered,
    its gradient counts every row once (applied to the gathered rows, it was W times too large)."""
    method, encoder, model = _build(tiny_model, recipe)
    # Pad to the longest sentence of the whole batch in both runs, so inputs are identical.
    batch = {"sentence": encoder.tokenize(SENTENCES, max_len=32)}
    loss, _ = method.loss(model, batch, 0)
    loss.backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _worker, args=(2, str(tiny_model), os.path.join(tmp, "init"), tmp, recipe), nprocs=2, join=True,
            start_method="spawn"
        )
        outs = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(2)]
    for out in outs:
        assert float(out["loss"]) == pytest.approx(float(loss.detach()), rel=1e-5)
    # DDP has averaged the gradients: every rank holds the same, equal to the single-process one.
    assert set(outs[0]["grads"]) == set(ref)
    for name, g in ref.items():
        torch.testing.assert_close(outs[0]["grads"][name], g, rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(outs[1]["grads"][name], g, rtol=1e-4, atol=1e-6, msg=name)
