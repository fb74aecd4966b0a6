"""A run is a function of its configuration and seed: every named recipe gives the same
train_loss at every step for the same seed and another for another seed, in this process's
runtime; and on Ray (one worker, the recipe's augmentation in Ray Data tasks) the same as here."""

from __future__ import annotations

import pytest

from tests.helpers import runs_of, sets, steps_of

RECIPES = {"simcse": {}, "una": {"alpha": 1, "r": 50}, "san": {}, "augcse": {}, "vascl": {"k": 4}}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache for the module: a recipe's generated columns (SAN's, AugCSE's) are made once."""
    return tmp_path_factory.mktemp("cache")


def _losses(method: str, seed: int, tiny_model, corpus, out, uri: str, extra=None) -> list[float]:
    from platform.config import TrainConfig
    from platform.run.loop import WorkerContext, train_loop_per_worker
    from platform.tracking.recorder import Run
    from platform.tracking.writer import RunWriter, points_in
    from platform.tracking.store import client

    cfg = TrainConfig.build(method, "local", {"model": str(tiny_model), "corpus": str(corpus), "batch_size": 16,
                                              "max_sentences": 256, "max_steps": 3, "eval_steps": 3, "log_steps": 1,
                                              "runtime": "process", "num_workers": 1, "seed": seed,
                                              "output_dir": str(out), **RECIPES[method], **(extra or {})})
    run = Run.create(uri, method, f"seed{seed}", {})
    writer = RunWriter(uri)
    train_loop_per_worker(WorkerContext(cfg=cfg, run_id=run.id, run_dir=str(out / run.id),
                                        on_report=lambda metrics: writer.log(run.id, points_in(metrics))))
    assert writer.flush(60)
    return [m.value for m in sorted(client(uri).get_metric_history(run.id, "train_loss"), key=lambda m: m.step)]


@pytest.mark.parametrize("method", list(RECIPES))
def test_the_same_seed_gives_the_same_run_and_another_seed_another(method, tiny_model, small_corpus, tmp_path,
                                                                   mlflow_uri, cache, monkeypatch):
    monkeypatch.setenv("PLATFORM_CACHE_DIR", str(cache))
    first = _losses(method, 42, tiny_model, small_corpus, tmp_path, mlflow_uri)
    again = _losses(method, 42, tiny_model, small_corpus, tmp_path, mlflow_uri)
    other = _losses(method, 43, tiny_model, small_corpus, tmp_path, mlflow_uri)
    assert len(first) == 3 and first == again
    assert other != first


@pytest.mark.e2e
def test_a_ray_worker_trains_as_this_process_does_for_one_seed(tiny_model, small_corpus, tmp_path, mlflow_uri):
    """UNA on Ray (one worker; its negatives made per epoch in Ray Data tasks) and in this process,
    one seed: the same losses at every step (up to float sums in another thread count)."""
    from tests.helpers import run_cli, run_main

    common = dict(model=tiny_model, corpus=small_corpus, batch_size=16, max_steps=4, eval_steps=4, log_steps=1,
                  alpha=1, r=50, num_workers=1, final_eval="false", seed=7, output_dir=tmp_path / "runs")
    env = {"MLFLOW_TRACKING_URI": mlflow_uri, "PLATFORM_CACHE_DIR": str(tmp_path / "cache")}
    for runtime, command in (("ray", run_cli), ("process", run_main)):  # the process runtime starts no Ray
        proc = command("train", "una", *sets(**common, runtime=runtime), env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
    c, runs = runs_of(mlflow_uri, "una")
    by = {r.data.tags["run.runtime"]: r.info.run_id for r in runs}
    loss = {rt: [m.value for m in sorted(c.get_metric_history(i, "train_loss"), key=lambda m: m.step)]
            for rt, i in by.items()}
    assert steps_of(c, by["ray"], "train_loss") == [1, 2, 3, 4]
    assert loss["ray"] == pytest.approx(loss["process"], rel=1e-4)
