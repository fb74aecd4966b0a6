"""The local pipeline's batches cut on the device from blocks of steps equal, tensor for tensor,
the batches the host made one at a time (``StepInputs.collate`` + ``nest`` of each batch's rows),
for every recipe family: dropout views, generated columns per epoch, prompts, static shapes, and a
worker's share of a global batch."""

from __future__ import annotations

import pytest
import torch

from platform.config import TrainConfig
from platform.data import read_corpus
from platform.data.columns import prepare_corpus, resolve_local_models
from platform.data.pipeline import StepInputs
from platform.run.loop import ProcessRuntime, WorkerContext, local_batches


def _same(a, b, where: str) -> None:
    assert a.keys() == b.keys(), where
    for key in a:
        if isinstance(a[key], dict):
            _same(a[key], b[key], f"{where}/{key}")
        else:
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), f"{where}/{key}"


@pytest.mark.parametrize("method, over, world", [
    ("simcse", {}, 1),                        # dropout views: the sentence column only
    ("una", {"r": 500}, 1),                   # generated columns, drawn again each epoch
    ("san", {}, 1),                           # MLM-made negatives and their tensor columns
    ("promptbert", {}, 1),                    # the prompt encoder's template widths
    ("simcse", {"static_shapes": True}, 1),   # every step the fixed width
    ("una", {"r": 500}, 2),                   # rank 1's half of each global batch
])
def test_batches_cut_on_the_device_equal_the_host_made_ones(method, over, world, tiny_model, small_corpus, tmp_path):
    cfg = TrainConfig.build(method, "local", {"model": str(tiny_model), "corpus": str(small_corpus), "batch_size": 8,
                                              "output_dir": str(tmp_path), **over})
    resolve_local_models(cfg.ingredient_params)  # SAN's tiny MLM, by name, as the loop does
    recipe = cfg.build_recipe()
    corpus = prepare_corpus(recipe, read_corpus(small_corpus), use_ray=False)
    inputs = StepInputs(recipe, cfg.model, cfg.max_len, static=cfg.static_shapes)
    rt = ProcessRuntime(WorkerContext(cfg=cfg, corpus=corpus), cfg)
    rt.rank, rt.world = world - 1, world
    for epoch in (0, 1):
        made = list(rt.batches(recipe, epoch, inputs))
        host = []
        for rows in local_batches(corpus.columns, cfg, rt.rank, world, epoch):
            rows = recipe.augment(rows, corpus.statistics, epoch) if recipe.augments_per_epoch else rows
            host.append(StepInputs.nest(inputs.collate(inputs.arrays(rows))))
        assert len(made) == len(host) == 256 // 8
        for i, (a, b) in enumerate(zip(made, host)):
            _same(a, b, f"epoch {epoch} step {i}")
    assert set(made[0]) >= set(recipe.text_columns)
