"""InfoNCE against a slow reference, and DDP all-gather training equal to one process."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from methods.losses import gather_with_grad, info_nce
from methods.recipe import NAMED
from platform.data.pipeline import StepInputs
from tests.helpers import leave_process_group
from tests.reference import slow_info_nce


@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_info_nce_matches_reference(tau):
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    assert float(info_nce(z1, z2, tau)) == pytest.approx(slow_info_nce(z1, z2, tau), rel=1e-5)


def test_info_nce_with_extra_negatives_matches_reference():
    g = torch.Generator().manual_seed(1)
    z1, z2, neg = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g), torch.randn(7, 8, generator=g)
    assert float(info_nce(z1, z2, 0.05, neg)) == pytest.approx(slow_info_nce(z1, z2, 0.05, neg), rel=1e-5)


@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_augcses_symmetric_term_matches_a_direct_computation(tau):
    """Tang et al., App. A.14 (the authors' code): (CE(S) + CE(S^T)) / 2, each direction computed
    term by term with explicit cosines: the anchors against the positives, and the positives
    against the anchors; it differs from SimCSE's one direction on the same views."""
    import math

    from methods.losses import symmetric_info_nce

    g = torch.Generator().manual_seed(2)
    z1, z2 = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)

    def direction(a, b):
        cos = lambda x, y: float(x @ y) / (math.sqrt(float(x @ x)) * math.sqrt(float(y @ y)))  # noqa: E731
        return sum(-math.log(math.exp(cos(a[i], b[i]) / tau) / sum(math.exp(cos(a[i], b[j]) / tau) for j in range(6)))
                   for i in range(6)) / 6

    want = (direction(z1, z2) + direction(z2, z1)) / 2
    assert float(symmetric_info_nce(z1, z2, tau)) == pytest.approx(want, rel=1e-5)
    assert abs(want - slow_info_nce(z1, z2, tau)) > 1e-3


def test_the_symmetric_loss_takes_no_negatives_and_augcse_uses_it():
    from methods.ingredients import InvalidParams
    from methods.recipe import NAMED, RecipeSpec

    assert NAMED["augcse"].resolve("paper").loss == NAMED["augcse"].resolve("authors_code").loss == "symmetric"
    with pytest.raises(InvalidParams, match="loss=symmetric has no place for negatives"):
        RecipeSpec(negatives=("una",), loss="symmetric").validate()


def test_info_nce_rejects_bad_temperature():
    with pytest.raises(ValueError, match="temperature"):
        info_nce(torch.randn(2, 3), torch.randn(2, 3), 0.0)


def test_gather_is_identity_without_distributed():
    x = torch.randn(3, 4, requires_grad=True)
    assert gather_with_grad(x) is x


# ------------------------------------------------------------------------------------------------
# Two gloo processes vs one process on the concatenated batch


# Every named recipe, with its random draws outside the data turned off (dropout, SAN's p2, the
# discriminator's dropout), so one process and two see the same views; recipe@variant: the named
# recipe with these values ("queued": ESimCSE's queue filled before the step; "matryoshka": its loss over prefixes; "rank": RankCSE's term).
DDP_PARAMS = {**{name: {} for name in NAMED}, "vascl": {"k": 3}, "una": {"alpha": 1}, "san": {"p2": 0.0},
              "augcse": {"disc_dropout": 0.0, "augmentations": "12-aug"}, "cotbert@replicas": {"replicas": 2},
              "esimcse@queued": {"queue_size": 12}, "simcse@matryoshka": {"pooler": "avg", "matryoshka_dims": "32,16,8"},
              "simcse@rank": {"aux": "rank_distill", "rank_loss": "listmle"}, "esimcse@rank": {"aux": "rank_distill"}}


def _build(model_dir, recipe="simcse"):
    from methods.encoder import Encoder
    from methods.recipe import Recipe

    torch.manual_seed(0)
    method = Recipe.named(recipe.split("@")[0], **DDP_PARAMS[recipe])
    encoder = Encoder.from_pretrained(str(model_dir), dropout=0.0)  # no dropout: deterministic views
    model = method.build(encoder)
    for state in model.states.values():
        if recipe.endswith("@queued"):
            state.push(torch.randn(10, state.queue.shape[1]))
    return method, encoder, model


def _batch(method, model_dir, rows: slice):
    """The rows' batch as the training loop gets it (the data pipeline's arrays, collated), with the
    columns a recipe's data steps add: UNA's and SAN's negatives (one empty), AugCSE's augmentation."""
    from tests.recipe_reference import COLUMNS, NEGATIVES

    teacher = np.random.default_rng(0).normal(size=(len(NEGATIVES), 16)).astype(np.float16)  # a teacher's vectors
    columns = {k: v[rows] for k, v in {**COLUMNS, "una_negative": NEGATIVES, "san_negative": NEGATIVES,
                                       "soft_negative": NEGATIVES, "rank_teacher_0": teacher}.items()}
    inputs = StepInputs(method, str(model_dir), 32)
    return inputs.nest(inputs.collate(inputs.arrays(columns)))


# Each case in one step, and with GradCache's chunks of 2 rows those whose heads or negatives meet them.
DDP_CASES = [(recipe, 0) for recipe in DDP_PARAMS] + [(recipe, 2) for recipe in ("vascl", "una", "augcse", "cotbert",
                                                                                "esimcse@queued", "simcse@rank")]


def _worker(rank, world, model_dir, init_file, out_dir):
    """Every case in one process group: a spawned worker's interpreter (torch, transformers, the
    platform) costs more than its cases. A case that raises saves its traceback for its test."""
    import contextlib
    import traceback

    import torch.distributed as dist

    from platform.run.loop import forward_backward
    from tests.recipe_reference import SENTENCES

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    for recipe, mini_batch_size in DDP_CASES:
        path = os.path.join(out_dir, f"{recipe}-{mini_batch_size}-rank{rank}.pt")
        try:
            method, encoder, model = _build(model_dir, recipe)
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            local = len(SENTENCES) // world
            batch = _batch(method, model_dir, slice(rank * local, (rank + 1) * local))
            # Exactly what train_loop_per_worker does: (loss * world).backward(), or GradCache's chunks.
            scaler = torch.amp.GradScaler("cpu", enabled=False)
            loss, _ = forward_backward(method, ddp, batch, 0, mini_batch_size, contextlib.nullcontext(), scaler, world)
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            method.after_step(ddp)  # a queue takes the step's all-gathered embeddings
            queues = {name: state.columns().clone() for name, state in model.states.items()}
            torch.save({"loss": loss.detach(), "grads": grads, "queues": queues}, path)
        except Exception:
            torch.save({"error": traceback.format_exc()}, path)
            os._exit(1)  # the other rank may wait in this case's collectives: spawn's join ends it
    leave_process_group()


@pytest.fixture(scope="module")
def ddp_runs(tiny_model):
    """Two gloo workers, half the batch each, through every case; their saved loss and gradients."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mp.start_processes(_worker, args=(2, str(tiny_model), os.path.join(tmp, "init"), tmp), nprocs=2,
                               join=True, start_method="spawn")
            failed = None
        except Exception as exc:  # the cases before the failing one still have their results
            failed = f"{type(exc).__name__}: {exc}"
        runs = {"failed": failed}
        for case in DDP_CASES:
            outs = [torch.load(f) for r in range(2) if os.path.exists(f := os.path.join(tmp, f"{case[0]}-{case[1]}-rank{r}.pt"))]
            errors = [o["error"] for o in outs if "error" in o]
            if errors:
                runs["failed"] = f"{case} raised in a worker:\n{errors[0]}"
            elif len(outs) == 2:
                runs[case] = outs
        yield runs


@pytest.mark.parametrize("recipe,mini_batch_size", DDP_CASES)
def test_ddp_two_workers_equal_one_process(tiny_model, ddp_runs, recipe, mini_batch_size):
    """Two gloo workers with half the batch each give the loss and the gradient of one process on
    the whole batch, for every named recipe: VaSCL's head sees the all-gathered batch (applied to
    local rows and gathered, its gradient counts every row once), UNA's and SAN's negatives join
    the gathered candidates, AugCSE's projector normalises with the whole batch's statistics and
    its discriminator's loss is the whole batch's mean. With ``mini_batch_size`` 2 each worker runs
    GradCache's chunks outside DDP's reducer and averages the gradients itself: the heads', which
    no DDP forward prepared, too."""
    loss, ref, queues = _one_process_grads(tiny_model, recipe, torch.get_num_threads())
    # The float32 rounding of this very computation: the same process with another thread count
    # sums in another order. DDP sums in yet another (half batches, then the all-reduce), so it may
    # differ from one process by a few times that much, and no more (AugCSE's batch-normalised
    # projector amplifies it: ~2e-6 of ~5e-4 in the word embeddings' gradient).
    _, other, _ = _one_process_grads(tiny_model, recipe, 1 if torch.get_num_threads() > 1 else 2)
    spread = {n: (g - other[n]).abs().max().item() for n, g in ref.items()}

    assert (recipe, mini_batch_size) in ddp_runs, f"the workers stopped before this case: {ddp_runs['failed']}"
    outs = ddp_runs[(recipe, mini_batch_size)]
    for out in outs:
        assert float(out["loss"]) == pytest.approx(float(loss.detach()), rel=1e-5)
        # A queue holds the whole batch's embeddings in rank order, the same on every worker.
        assert set(out["queues"]) == set(queues)
        for name, queue in queues.items():
            torch.testing.assert_close(out["queues"][name], queue, rtol=1e-5, atol=1e-6)
    # DDP has averaged the gradients: every rank holds the same, equal to the single-process one.
    assert set(outs[0]["grads"]) == set(ref)
    largest = max(g.abs().max().item() for g in ref.values())
    for name, g in ref.items():
        atol = max(1e-6, 4 * spread[name])
        if recipe.split("@")[0] in ("promptbert", "cotbert"):
            # Denoising subtracts the template's nearly equal [MASK] state from each row's: the
            # difference is small, its normalisation large, and round-off grows with it (measured:
            # 2e-4 of a tensor's largest gradient, 5e-6 of the largest of all; the loss equal to the
            # last bit). A rank missing a share of the template's gradient is off by a whole share.
            atol = max(atol, 1e-3 * g.abs().max().item(), 2e-5 * largest)
        if recipe.endswith("@rank"):
            # ListMLE sums every position of each row's list at 1 / tau2 = 20: the [CLS] embedding's
            # gradient is a sum of large per-row shares that nearly cancel, and summed in two shards
            # it is off by 1.6e-6 (measured); a shard missing from it is off by its whole share.
            atol = max(atol, 5e-6)
        torch.testing.assert_close(outs[0]["grads"][name], g, rtol=1e-4, atol=atol, msg=name)
        torch.testing.assert_close(outs[1]["grads"][name], g, rtol=1e-4, atol=atol, msg=name)


def _one_process_grads(tiny_model, recipe: str, threads: int) -> tuple[torch.Tensor, dict, dict]:
    """The loss, the gradients (by parameter name) and the queues after the step of one process on
    the whole batch, computed with ``threads`` torch threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        method, encoder, model = _build(tiny_model, recipe)
        loss, _ = method.loss(model, _batch(method, tiny_model, slice(None)), 0)
        loss.backward()
        method.after_step(model)
    finally:
        torch.set_num_threads(before)
    return (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
            {name: state.columns().clone() for name, state in model.states.items()})


# ------------------------------------------------------------------------------------------------
# Under bf16 autocast (the GPU path) the similarities and softmax stay in float32


def _close_views(seed: int, n: int = 8, d: int = 64):
    """bf16 embeddings whose cosines all sit near 1 (a shared direction, rows near it, views near
    their row: ~0.98 between rows, ~0.997 within one), where the bf16 rounding of a similarity
    (~0.004) is ~0.08 in a logit at tau 0.05 while the logits differ by a few tenths."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(d, generator=g) + 0.15 * torch.randn(n, d, generator=g)
    return [(rows + 0.05 * torch.randn(n, d, generator=g)).bfloat16() for _ in range(4)]


def test_every_loss_is_float32_under_bf16_autocast():
    """Each loss on bf16 embeddings inside CPU bf16 autocast (which, like CUDA's, casts matmuls to
    bf16) equals the float64 computation on the same embeddings within 1e-3 relative."""
    from methods.losses import hince, nt_xent
    from methods.vascl import neighbourhood_loss
    from tests.reference import slow_hince, slow_neighbourhood_loss, slow_nt_xent

    z1, z2, z3, z4 = _close_views(0)
    d = [z.double() for z in (z1, z2, z3, z4)]
    unit = [torch.nn.functional.normalize(z, dim=-1) for z in d]
    negs = torch.stack([unit[2][(i + 1) % 8 : (i + 1) % 8 + 1].repeat(3, 1) for i in range(8)])
    cases = {
        "infonce": (lambda: info_nce(z1, z2, 0.05, z3), slow_info_nce(d[0], d[1], 0.05, d[2])),
        "hince": (lambda: hince(z1, z2, z3, 0.05, 0.08), slow_hince(d[0], d[1], d[2], 0.05, 0.08)),
        "ntxent": (lambda: nt_xent([(z1, z2), (z3, z4)], 0.05),
                   slow_nt_xent(list(torch.cat(d)), [8 + i for i in range(8)] + list(range(8))
                                + [24 + i for i in range(8)] + [16 + i for i in range(8)], 0.05)),
        "vascl": (lambda: neighbourhood_loss(unit[0].bfloat16(), unit[1].bfloat16(), negs.bfloat16(), 0.05),
                  slow_neighbourhood_loss(*(t.bfloat16().double() for t in (unit[0], unit[1], negs)), 0.05)),
    }
    for name, (loss, want) in cases.items():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = loss()
        assert got.dtype == torch.float32, name
        assert float(got) == pytest.approx(want, rel=1e-3), name


def test_the_bf16_similarity_the_losses_avoid_is_off_by_more():
    """The comparison above can fail: the same InfoNCE with its matmul left to bf16 autocast is
    off by more than 1e-3 relative."""
    z1, z2, z3, _ = _close_views(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sims = torch.nn.functional.normalize(z1.float(), dim=-1) @ torch.nn.functional.normalize(z2.float(), dim=-1).T
        assert sims.dtype == torch.bfloat16
        bf16_loss = torch.nn.functional.cross_entropy(sims.float() / 0.05, torch.arange(8))
    want = slow_info_nce(z1.double(), z2.double(), 0.05)
    assert abs(float(bf16_loss) - want) / want > 1e-3


# ------------------------------------------------------------------------------------------------
# HiNCE on steps without negatives; NT-Xent's empty negatives


def test_hince_on_a_step_without_active_negatives_is_its_positive_part():
    """UNA's negatives arrive every alpha-th step: on the others HiNCE is InfoNCE at tau1."""
    from methods.losses import HiNCE, Views
    from methods.recipe import SharedParams

    z1, z2, _, _ = _close_views(1)
    loss = HiNCE(shared=SharedParams(temperature=0.05))(Views(z1.float(), z2.float(), []))
    assert float(loss) == pytest.approx(slow_info_nce(z1.double(), z2.double(), 0.05), rel=1e-5)


def test_ntxent_leaves_out_the_negatives_that_do_not_exist():
    """An empty negative (no replaceable word) is in no pair: both of its views leave the matrix,
    as InfoNCE and HiNCE leave out its column."""
    from methods.losses import Negative, NTXent, Views
    from methods.recipe import SharedParams
    from tests.reference import slow_nt_xent

    g = torch.Generator().manual_seed(2)
    a, p, n1, n2 = (torch.randn(4, 6, generator=g) for _ in range(4))
    valid = torch.tensor([True, False, True, True])
    loss = NTXent(shared=SharedParams(temperature=0.05))(Views(a, p, [Negative(n1, valid, n2)]))
    rows = list(torch.cat([a, p, n1[valid], n2[valid]]).double())
    partner = [4, 5, 6, 7, 0, 1, 2, 3, 11, 12, 13, 8, 9, 10]
    assert float(loss) == pytest.approx(slow_nt_xent(rows, partner, 0.05), rel=1e-5)


# ------------------------------------------------------------------------------------------------
# Gradient clipping


def test_the_loop_clips_the_gradient_norm_before_each_step(tiny_model, small_corpus, tmp_path):
    """``max_grad_norm`` (1.0, the HF Trainer's default that SimCSE, SAN and AugCSE train with):
    the optimizer steps with a gradient of at most that norm; 0 leaves it as it is."""
    from platform.config import TrainConfig
    from platform.run import loop

    seen: list[float] = []
    original = loop.make_optimizer

    def recording(*args, **kwargs):
        optimizer, schedule = original(*args, **kwargs)
        grads = lambda: [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]  # noqa: E731
        optimizer.register_step_pre_hook(
            lambda *_: seen.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads()])))))
        return optimizer, schedule

    loop.make_optimizer = recording
    try:
        for norm in (1e-3, 0.0):
            cfg = TrainConfig.build("simcse", "local", {"model": str(tiny_model), "corpus": str(small_corpus),
                                                        "batch_size": 8, "max_steps": 3, "eval_steps": 3,
                                                        "max_grad_norm": norm, "output_dir": str(tmp_path / str(norm))})
            loop.train_loop_per_worker(cfg.flat())
    finally:
        loop.make_optimizer = original
    clipped, free = seen[:3], seen[3:]
    assert all(n == pytest.approx(1e-3, rel=1e-4) for n in clipped), clipped
    assert all(n > 1e-2 for n in free), free
    assert TrainConfig.build("simcse", "paper").max_grad_norm == 1.0
    assert TrainConfig.build("una", "paper").max_grad_norm == 0.0 and TrainConfig.build("vascl", "paper").max_grad_norm == 0.0
