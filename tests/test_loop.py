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


def test_a_run_restored_at_its_end_reports_its_last_state_once(tiny_model, small_corpus, tmp_path, mlflow_uri):
    """A fit continued after it had trained to its end (``--resume`` of a trial cut just after its
    last step) evaluates and reports that state once: Tune expects a result from every trial. Its
    MLflow points are not duplicated."""
    from platform.run.loop import RunContext
    from platform.tracking.runs import Run
    from platform.tracking.store import client

    cfg = TrainConfig.build("simcse", "local", {"model": str(tiny_model), "corpus": str(small_corpus), "batch_size": 8,
                                                "max_steps": 4, "eval_steps": 2, "runtime": "process", "num_workers": 1})
    run = Run.create(mlflow_uri, "simcse", "fit", {})
    ctx = RunContext(cfg=cfg, tracking_uri=mlflow_uri, run_id=run.id, run_dir=str(tmp_path / "fit"))
    first = train_loop_per_worker(ctx)
    again = train_loop_per_worker(RunContext(cfg=cfg, tracking_uri=mlflow_uri, run_id=run.id,
                                             run_dir=str(tmp_path / "fit"), resumed=True))
    assert first["steps"] == again["steps"] == 4 and again["best_stsb_dev_spearman"] == first["best_stsb_dev_spearman"]
    history = client(mlflow_uri).get_metric_history(run.id, "stsb_dev_spearman")
    assert sorted(m.step for m in history) == [2, 4]
    assert (tmp_path / "fit" / "latest" / "train_state.pt").is_file() and (tmp_path / "fit" / "best" / "state.json").is_file()
