"""The training loop without Ray: the same code a GPU box without Ray runs."""

from __future__ import annotations

import json

from platform.config import TrainConfig
from platform.run.loop import local_batches, train_loop_per_worker


def test_plain_loop_trains_and_keeps_best_checkpoint(tiny_model, small_corpus, tmp_path):
    cfg = TrainConfig.build(
        "simcse", "local",
        {"model": str(tiny_model), "corpus": str(small_corpus), "batch_size": 16, "max_steps": 6,
         "eval_steps": 3, "num_workers": 1, "output_dir": str(tmp_path)},
    )
    out = train_loop_per_worker(cfg.flat())
    assert out["steps"] == 6 and out["best_step"] in (3, 6)
    state = json.loads((tmp_path / "local" / "best" / "state.json").read_text())
    assert state["step"] == out["best_step"]
    assert abs(state["stsb_dev_spearman"] - out["best_stsb_dev_spearman"]) < 1e-9
    assert state["eval_pooler"] == "cls_before_pooler"
    assert (tmp_path / "local" / "best" / "model" / "model.safetensors").is_file()


def test_workers_split_each_global_batch():
    cfg = TrainConfig.build("simcse", "local", {"batch_size": 4, "num_workers": 2})
    sentences = {"sentence": [f"s{i}" for i in range(10)]}
    one = [list(b["sentence"]) for b in local_batches(sentences, cfg, 0, 1, epoch=0)]
    r0 = [list(b["sentence"]) for b in local_batches(sentences, cfg, 0, 2, epoch=0)]
    r1 = [list(b["sentence"]) for b in local_batches(sentences, cfg, 1, 2, epoch=0)]
    assert len(one) == 2  # drop_last
    assert [a + b for a, b in zip(r0, r1)] == one
    assert [list(b["sentence"]) for b in local_batches(sentences, cfg, 0, 1, epoch=1)] != one
