"""One fit of one configuration and seed: Ray Train's ``TorchTrainer`` (DDP workers, every
evaluation's checkpoint persisted to ``storage_path``, its step metrics sent to MLflow by Ray
Train's controller once Ray has persisted it) or the training loop in this process
(``runtime=process``). At its end the fit sends its latest checkpoint's points again where any
are missing (a tracking outage) and waits for them (``platform.tracking.runs.Publisher``).

A fit named like an earlier one in the same storage continues it: Ray Train restores the run of
that name from its latest checkpoint; the process runtime restores ``<run_dir>/latest``.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any, Callable

from platform.config import TrainConfig
from platform.data import data_dir, load_sts
from platform.data.columns import CorpusData
from platform.run import checkpoint, storage
from platform.run.loop import RunContext, train_loop_per_worker
from platform.tracking.runs import (BEST, DEV_METRIC, Publisher, Run, checkpoint_exists, load_points,
                                    published_checkpoint)


@dataclasses.dataclass
class FitResult:
    best_dev: float | None
    checkpoint: str | None  # the best checkpoint: a local folder or a URI in output_dir's storage
    metrics: dict = dataclasses.field(default_factory=dict)  # the last report (Ray) or the loop's summary
    latest: str | None = None  # the latest checkpoint (what a resumed fit continues from)


def release(result: FitResult) -> None:
    """Once the fit's run is FINISHED (never trained again): only what the registry, the report and
    evaluation need stays, the best checkpoint without its optimizer state; the latest checkpoint,
    when it is another one, goes."""
    if result.checkpoint is None:
        return
    storage.remove(storage.join(result.checkpoint, checkpoint.TRAIN_STATE))
    if result.latest and storage.resolve(result.latest) != storage.resolve(result.checkpoint):
        storage.remove(result.latest)


def dev_pairs() -> dict[str, list]:
    """STS-B dev as plain lists, read here on the driver: training workers on other nodes get
    it with their configuration instead of reading a data folder they may not have."""
    pairs = load_sts("STSBenchmark", data_dir(), split="dev")
    return {"sent1": list(pairs.sent1), "sent2": list(pairs.sent2), "scores": [float(x) for x in pairs.scores]}


def fit(cfg: TrainConfig, corpus: CorpusData, run: Run | None, *, storage_path: str, name: str,
        tune_reports: bool = False, label: str | None = None) -> FitResult:
    """Train ``cfg`` on ``corpus``, logging to ``run`` (None: print only), checkpoints under
    ``storage_path/name``; ``tune_reports``: every evaluation also goes to the Tune trial this
    runs in; ``label`` prefixes the console line of each evaluation. Returns the best checkpoint."""
    ctx = RunContext(cfg=cfg, runtime=cfg.runtime, num_sentences=corpus.num_sentences,
                     tracking_uri=run.uri if run else None, run_id=run.id if run else None, dev=dev_pairs(),
                     label=label, resumed=bool(run and run.resumed))
    publisher = Publisher(run.uri, run.id) if run else None
    if cfg.runtime == "process":
        ctx.corpus, ctx.run_dir, ctx.publisher = corpus, storage.join(storage_path, name), publisher
        out = train_loop_per_worker(ctx)
        best = str(Path(ctx.run_dir, "best"))
        result = FitResult(out[BEST], best if checkpoint_exists(best) else None, metrics=out)
        latest = str(Path(ctx.run_dir, "latest"))
    else:
        result, latest = _off_the_main_thread(lambda: _fit_ray(cfg, corpus, ctx, storage_path, name, tune_reports))
    result.latest = latest
    if publisher is not None:  # every point of the run, and its best checkpoint, arrived (or one line)
        published_checkpoint(publisher, latest if latest and storage.exists(latest) else None, result.checkpoint)
        publisher.finish(where=f" ({storage.join(storage_path, name)})")
    return result


def _off_the_main_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a helper thread while this one waits: Ray Train's ``fit`` takes over SIGINT in
    the main thread (and then exits the process with status 0); here Ctrl-C and SIGTERM stay a
    ``KeyboardInterrupt`` of this thread, which ends the run KILLED. Its checkpoints stay in storage."""
    if threading.current_thread() is not threading.main_thread():
        return fn()
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # handed to the waiting thread
            box["error"] = exc

    thread = threading.Thread(target=call, name="ray-train-fit", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
    if "error" in box:
        raise box["error"]
    return box["result"]


def _fit_ray(cfg: TrainConfig, corpus: CorpusData, ctx: RunContext, storage_path: str, name: str,
             tune_reports: bool) -> FitResult:
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from platform.data.pipeline import epoch_datasets

    resources = {"CPU": cfg.cpus_per_worker, **({"GPU": 1} if cfg.use_gpu else {})}
    callbacks = [checkpoint_publisher(ctx.tracking_uri, ctx.run_id)] if ctx.run_id else []
    if tune_reports:  # after the recorder: Tune (and ASHA, which may end the trial on it) sees the report last
        from ray.tune.integration.ray_train import TuneReportCallback

        callbacks.append(TuneReportCallback())
    datasets = {}
    if cfg.data_pipeline == "ray":
        datasets = epoch_datasets(cfg.build_recipe(), corpus.columns, corpus.states, cfg.epochs, cfg.seed,
                                  num_cpus=cfg.augment_cpus)
    else:  # every worker slices the same global batches: the corpus reaches it through the object store
        ctx.corpus_ref = ray.put((corpus.columns, corpus.states))
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=ctx.loop_config(),
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                                               resources_per_worker=resources),
        torch_config=TorchConfig(backend="nccl" if cfg.use_gpu else "gloo"),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=storage_path,  # a URI on a cluster: every node reads and writes checkpoints there
            # Every evaluation reports a resumable checkpoint; Ray keeps the best by STS-B dev and
            # always the latest, which a restarted worker group resumes from.
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=1, checkpoint_score_attribute=DEV_METRIC, checkpoint_score_order="max"),
            failure_config=ray.train.FailureConfig(max_failures=cfg.max_failures),
            callbacks=callbacks,
        ),
        datasets=datasets,
    )
    result = trainer.fit()
    scored = [(c, m) for c, m in (result.best_checkpoints or []) if DEV_METRIC in m]
    best = max(scored, key=lambda cm: cm[1][DEV_METRIC])[0] if scored else result.checkpoint
    metrics = dict(result.metrics or {})
    latest = storage.uri_of(result.checkpoint.filesystem, result.checkpoint.path) if result.checkpoint else None
    return FitResult(metrics.get(BEST), storage.uri_of(best.filesystem, best.path) if best else None, metrics), latest


def checkpoint_publisher(uri: str, run_id: str):
    """A Ray Train callback that sends each persisted checkpoint's step metrics (every point up
    to its step, ``metrics.json``) and, for a new best, the tag naming it, in the background,
    before the report goes on to Tune: a scheduler that ends the trial on that report ends it
    with its points on their way. Runs in Ray Train's controller, which registers exactly the
    checkpoints a restarted worker group resumes from: the history follows them. (Built here: Ray
    is imported only by a fit that uses it, and cloudpickle sends a class defined in a function by
    value, so the controller imports only the tracking modules.)"""
    import ray.train

    class PublishCheckpoint(ray.train.UserCallback):
        def __init__(self):
            self.publisher: Publisher | None = None

        def after_report(self, run_context, metrics, checkpoint):
            first = metrics[0]  # rank 0 evaluates
            if checkpoint is None or BEST not in first:
                return
            if self.publisher is None:
                self.publisher = Publisher(uri, run_id)
            location = storage.uri_of(checkpoint.filesystem, checkpoint.path)
            improved = first[DEV_METRIC] >= first[BEST]
            self.publisher.publish(load_points(location), location if improved else None)

    return PublishCheckpoint()
