"""Batches come from a uniformly shuffled corpus in every epoch, with or without Ray Data.

On a corpus stored in groups (as wiki1m is stored by article), the fraction of batch-mates from
the same group is what uniform sampling gives; the earlier pipeline (1,024-row blocks in corpus
order, shuffled locally) drew each batch from one block's few groups, and the test shows it."""

from __future__ import annotations

import itertools

import pytest

from methods.recipe import Recipe
from platform.config import TrainConfig
from platform.run.loop import local_batches, ray_collate

GROUPS, SIZE, BATCH = 1024, 64, 32
CORPUS = {"sentence": [f"g{g}-{i}" for g in range(GROUPS) for i in range(SIZE)]}
N = GROUPS * SIZE
# Under uniform sampling without replacement, a batch-mate of a row is any of the other N-1 rows.
UNIFORM = (SIZE - 1) / (N - 1)


def same_group_fraction(batches) -> float:
    pairs = same = 0
    for batch in batches:
        groups = [s.split("-")[0] for s in batch]
        for a, b in itertools.combinations(groups, 2):
            pairs += 1
            same += a == b
    return same / pairs


@pytest.fixture(scope="module")
def local_ray():
    import ray

    from platform.run.ray_env import init_ray

    init_ray(num_cpus=2)
    yield ray
    ray.shutdown()


def _epoch(ds) -> list[list[str]]:
    return [list(b["sentence"]) for b in ds.iter_batches(batch_size=BATCH, drop_last=True, batch_format="numpy")]


@pytest.mark.e2e
def test_every_epoch_is_a_fresh_uniform_permutation_under_ray_data(local_ray):
    from platform.data.pipeline import epoch_datasets

    datasets = epoch_datasets(Recipe.named("simcse"), CORPUS, {}, epochs=2, seed=42)
    assert set(datasets) == {"train_0", "train_1"}
    epochs = [_epoch(datasets[f"train_{e}"]) for e in range(2)]
    for batches in epochs:
        rows = [s for b in batches for s in b]
        assert sorted(rows) == sorted(CORPUS["sentence"])  # every row once
        assert same_group_fraction(batches) == pytest.approx(UNIFORM, rel=0.25)
    assert epochs[0] != epochs[1]


@pytest.mark.e2e
def test_the_per_epoch_columns_follow_their_rows(local_ray):
    """UNA's negatives are made for the gathered rows: each negative belongs to its sentence."""
    from methods.una import fit_tfidf
    from platform.data.pipeline import epoch_datasets

    sentences = [f"the {w} cat sat on the {v} mat number {i}" for i, (w, v) in
                 enumerate(itertools.product(["black", "white", "grey", "tall"], ["red", "blue", "green", "old"]))] * 8
    recipe = Recipe.named("una", r=2)
    ds = epoch_datasets(recipe, {"sentence": sentences}, {"una": fit_tfidf(sentences)}, epochs=1, seed=0)["train_0"]
    for batch in ds.iter_batches(batch_size=16, batch_format="numpy"):
        for s, neg in zip(batch["sentence"], batch["una_negative"]):
            assert neg and neg != s and neg.split()[-1] == s.split()[-1] and len(neg.split()) == len(s.split())


def test_the_local_pipeline_has_the_same_distribution():
    cfg = TrainConfig.build("simcse", "local", {"batch_size": BATCH, "num_workers": 1, "seed": 42})
    batches = [list(b["sentence"]) for b in local_batches(CORPUS, cfg, 0, 1, epoch=0)]
    assert same_group_fraction(batches) == pytest.approx(UNIFORM, rel=0.25)


def test_no_two_seeds_share_an_epoch_order():
    """Orders from (seed, epoch) hashed: seed 42's second epoch is not seed 43's first (it was, with
    ``seed + epoch``), and both pipelines take the same order."""
    from methods.ingredients import epoch_permutation

    orders = {(s, e): tuple(epoch_permutation(s, e, 500)) for s in range(40, 46) for e in range(4)}
    assert len(set(orders.values())) == len(orders)
    assert epoch_permutation(42, 1, 500).tolist() == list(orders[42, 1])  # a function of (seed, epoch)
    cfg = TrainConfig.build("simcse", "local", {"batch_size": BATCH, "num_workers": 1, "seed": 43})
    rows = [r for b in local_batches({"sentence": [str(i) for i in range(500)]}, cfg, 0, 1, epoch=0) for r in b["row"]]
    assert rows == list(orders[43, 0][: len(rows)])


@pytest.mark.e2e
def test_the_earlier_pipeline_fails_the_statistic(local_ray):
    """Corpus-order blocks and a local shuffle buffer of 4 batches (what training used before)."""
    from platform.data.pipeline import augment_dataset

    ds = augment_dataset(Recipe.named("simcse"), CORPUS, {}, batch_size=1024)
    batches = [list(b["sentence"]) for b in ds.iter_batches(
        batch_size=BATCH, drop_last=True, batch_format="numpy", local_shuffle_buffer_size=4 * BATCH,
        local_shuffle_seed=42)]
    assert same_group_fraction(batches) > 20 * UNIFORM


@pytest.mark.e2e
@pytest.mark.parametrize("aux", ["", "rank_distill"])
def test_ray_data_hands_the_step_the_tensors_the_local_pipeline_makes(local_ray, tiny_model, aux):
    """Tokenised in Ray Data, collated by Ray's prefetch (``iter_torch_batches``): each batch of
    an epoch is, tensor for tensor, the local pipeline's batch with the same seed (UNA's negatives
    included; with RankCSE's term, its rows' teacher vectors), so the step cannot tell which
    pipeline fed it."""
    import numpy as np
    import torch

    from methods.una import fit_tfidf
    from platform.data.pipeline import StepInputs, epoch_datasets

    sentences = [f"the {w} cat sat on the {v} mat number {i}" + " again" * (i % 7) for i, (w, v) in
                 enumerate(itertools.product(["black", "white", "grey", "tall"], ["red", "blue", "green", "old"]))] * 4
    recipe, states = Recipe.named("una", r=2, aux=aux), {"una": fit_tfidf(sentences)}
    if aux:  # a teacher's vector for each corpus row
        states["rank_distill"] = [np.random.default_rng(0).normal(size=(len(sentences), 6)).astype(np.float16)]
    inputs = StepInputs(recipe, str(tiny_model), 12)  # short enough that long rows are truncated
    ds = epoch_datasets(recipe, {"sentence": sentences}, states, epochs=1, seed=3, inputs=inputs)["train_0"]
    got = [inputs.nest(b) for b in ds.iter_torch_batches(batch_size=16, drop_last=True, collate_fn=ray_collate(inputs))]
    cfg = TrainConfig.build("una", "local", {"batch_size": 16, "num_workers": 1, "seed": 3})
    want = [inputs.nest(inputs.collate(inputs.arrays(recipe.augment(b, states, 0))))
            for b in local_batches({"sentence": sentences}, cfg, 0, 1, epoch=0)]
    assert len(got) == len(want) == len(sentences) // 16
    for g, w in zip(got, want):
        assert set(g) == set(w) == {"sentence", "una_negative", *(["rank_teacher_0"] if aux else [])}
        for column in w:
            if not isinstance(w[column], dict):  # a tensor column
                assert torch.equal(g[column], w[column]) and w[column].shape == (16, 6), column
                continue
            assert set(g[column]) == set(w[column]) == {"input_ids", "token_type_ids", "attention_mask"}
            for key in w[column]:
                assert torch.equal(g[column][key], w[column][key]), (column, key)
    assert max(b["sentence"]["input_ids"].shape[1] for b in got) == 12  # a batch holding a truncated row
