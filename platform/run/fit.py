"""One fit of one configuration and seed: Ray Train's ``TorchTrainer`` (DDP workers, every
evaluation's checkpoint persisted to ``storage_path``) or the training loop in this process
(``runtime=process``). The points each report carries are written by this process
(``RunWriter``: from the loop's reports, or from Ray Train's controller through a queue),
except a sweep trial's own run, whose reports go to Tune and its driver. At its end the fit's best
checkpoint is decided from storage and named on its run.

A fit named like an earlier one in the same storage continues it: Ray Train restores the run of
that name from its latest state; the process runtime from the latest state under its folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from typing import Any, Callable

from platform import checkpoint, storage
from platform.config import TrainConfig
from platform.data import data_dir, load_sts
from platform.data.columns import CorpusData
from platform.data.pipeline import StepInputs, epoch_datasets
from platform.errors import ClusterError
from platform.run.loop import WorkerContext, train_loop_per_worker
from platform.tracking.names import POINTS, POINTS_RUN
from platform.tracking import recorder
from platform.tracking.recorder import Run
from platform.tracking.writer import RunWriter, delivered, points_in


INTERRUPTED_WAIT_S = 15.0  # an interrupted fit's end: how long it waits for the tracking server


@dataclasses.dataclass
class FitResult:
    best_dev: float | None
    checkpoint: str | None  # the best checkpoint: a local folder or a URI in output_dir's storage
    metrics: dict = dataclasses.field(default_factory=dict)  # the last report (Ray) or the loop's summary


def release(best: str | None) -> None:
    """Once the fit's run is FINISHED (never trained again): only what the registry, the report and
    evaluation need stays, its best checkpoint ``best`` without its optimizer state; every other goes."""
    if best is None:
        return
    storage.remove(storage.join(best, checkpoint.TRAIN_STATE))
    folder, name = best.rstrip("/").rsplit("/", 1)
    checkpoint.prune(folder, {name}, whole=True)


def dev_pairs() -> dict[str, list]:
    """STS-B dev as plain lists, read here on the driver: training workers on other nodes get
    it with their configuration instead of reading a data folder they may not have."""
    return load_sts("STSBenchmark", data_dir(), split="dev").plain()


def fit(cfg: TrainConfig, corpus: CorpusData, run: Run | None, *, storage_path: str, name: str,
        tune_reports: bool = False, label: str | None = None) -> FitResult:
    """Train ``cfg`` on ``corpus``, logging to ``run`` (None: print only), checkpoints under
    ``storage_path/name``; ``tune_reports``: every evaluation also goes to the Tune trial this
    runs in; ``label`` prefixes the console line of each evaluation. Returns the best checkpoint."""
    folder = storage.join(storage_path, name)  # the fit's checkpoints (Ray Train's run folder, or the loop's)
    ctx = WorkerContext(cfg=cfg, runtime=cfg.runtime, num_sentences=corpus.num_sentences, run_id=run.id if run else None,
                        run_dir=folder, dev=dev_pairs(), label=label, to_tune=tune_reports and run is not None and run.in_trial)
    # The sweep's driver writes its trial's own run; this process every other run it fits.
    writer = RunWriter(run.uri) if run is not None and not ctx.to_tune else None
    take = (lambda metrics: writer.log(run.id, points_in(metrics))) if writer else None
    reports = ReportQueue(take) if writer is not None and cfg.runtime == "ray" else None
    try:
        if cfg.runtime == "process":
            ctx.corpus, ctx.on_report = corpus, take
            metrics = train_loop_per_worker(ctx)
        else:
            trainer = ray_trainer(cfg, corpus, ctx, storage_path, name, tune_reports, reports)
            with reports.draining() if reports is not None else contextlib.nullcontext(), on_lost_workers(cfg):
                metrics = dict(off_the_main_thread(trainer.fit)().metrics or {})
        if writer is not None:
            delivered(writer, run.id, where=f" ({folder})")
    except BaseException:
        # Interrupted or failed: what the controller handed over is taken, what the writer holds
        # gets a short wait (the checkpoints keep it for --resume), and the run its best checkpoint
        # in storage, if it can be told.
        if reports is not None:
            reports.drain()
        if writer is not None:
            writer.close(INTERRUPTED_WAIT_S)
        with contextlib.suppress(Exception):
            name_best(run, folder)
        raise
    finally:
        if reports is not None:
            reports.close()
    best = name_best(run, folder)
    return FitResult(best.dev if best else None, best.checkpoint if best else None, metrics)


def name_best(run: Run | None, folder: str) -> checkpoint.Best | None:
    """The fit's best checkpoint, decided from its storage, named on its run (a trial's own run:
    by the sweep's driver, which ends it)."""
    best = checkpoint.best_under(folder)
    if best is not None and run is not None and not run.in_trial:
        recorder.name_best(run, best.checkpoint)
    return best


def off_the_main_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` called in a helper thread while this one waits: Ray Train's ``fit`` takes over SIGINT
    in the main thread (and then exits the process with status 0); here Ctrl-C and SIGTERM stay a
    ``KeyboardInterrupt`` of this thread, which ends the run KILLED. Its checkpoints stay in storage."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return fn(*args, **kwargs)
        box: dict[str, Any] = {}

        def call() -> None:
            try:
                box["result"] = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the waiting thread
                box["error"] = exc

        thread = threading.Thread(target=call, name="ray-train-fit", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.2)
        if "error" in box:
            raise box["error"]
        return box["result"]
    return wrapper


def ray_trainer(cfg: TrainConfig, corpus: CorpusData, ctx: WorkerContext, storage_path: str, name: str,
                tune_reports: bool, reports: "ReportQueue | None"):
    """The fit's Ray Train ``TorchTrainer``: ``cfg.num_workers`` DDP workers running the loop, its
    checkpoints under ``storage_path/name``, its reports to ``reports`` (and Tune)."""
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    resources = {"CPU": cfg.cpus_per_worker, **({"GPU": 1} if cfg.use_gpu else {})}
    callbacks = [reports.callback()] if reports is not None else []  # the reports' points, back to this process
    if tune_reports:  # every evaluation goes on to Tune (and ASHA, which may end the trial on it)
        from ray.tune.integration.ray_train import TuneReportCallback

        callbacks.append(TuneReportCallback())
    datasets = {}
    if cfg.data_pipeline == "ray":
        recipe = cfg.build_recipe()
        datasets = epoch_datasets(recipe, corpus.columns, corpus.statistics, cfg.epochs, cfg.seed, num_cpus=cfg.augment_cpus,
                                  inputs=StepInputs(recipe, cfg.model, cfg.max_len, static=cfg.static_shapes))
    else:  # every worker slices the same global batches: the corpus reaches it through the object store
        ctx.corpus_ref = ray.put((corpus.columns, corpus.statistics))
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=ctx.loop_config(),
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                                               resources_per_worker=resources),
        torch_config=TorchConfig(backend="nccl" if cfg.use_gpu else "gloo"),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=storage_path,  # a URI on a cluster: every node reads and writes checkpoints there
            # Ray keeps every checkpoint reported; the loop's rank 0 empties what the fit no longer
            # keeps (checkpoint.Kept: the latest state, the best model, the best as of that state).
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=None),
            failure_config=ray.train.FailureConfig(max_failures=cfg.max_failures),
            # Ray Train's own notes (a retry's traceback, a dead worker's failed shutdown, ~45
            # lines per lost worker) stay in Ray's session logs; a fit that fails for good raises.
            logging_config=ray.train.LoggingConfig(log_level="ERROR"),
            callbacks=callbacks,
        ),
        datasets=datasets,
    )


@contextlib.contextmanager
def on_lost_workers(cfg: TrainConfig):
    """A Ray Train fit whose workers died more often than ``max_failures`` allows fails in one line
    (``ClusterError``); a worker that raised an exception of its own raises it, with its traceback."""
    import ray.train

    try:
        yield
    except ray.train.WorkerGroupError as exc:
        lost = workers_lost(exc)
        if lost is None:
            raise
        raise ClusterError(f"training lost its Ray Train workers {cfg.max_failures + 1} time(s), more than "
                           f"max_failures={cfg.max_failures} allows (the last time {lost}); the run keeps its "
                           "checkpoints: --resume continues it (raise --set max_failures=N for a cluster that loses "
                           "nodes)") from None


class ReportQueue:
    """The points of a Ray Train fit's reports, brought back to the process that writes its run: a
    callback on the fit's controller (``callback``) puts each report's on a Ray queue, and a helper
    thread here hands them to ``take`` while the fit runs (``draining``), then once more at its
    end (``drain``: an interrupted fit takes what the controller handed over before it stopped)."""

    def __init__(self, take: Callable[[dict], None]):
        import ray
        from ray.util.queue import Queue
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # On this process's node: a queue on a worker node dies with it, and with the queue the fit
        # that max_failures would have restarted.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.queue, self.take = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here}), take

    def callback(self):
        from ray.train import UserCallback

        queue = self.queue

        class ToQueue(UserCallback):
            def after_report(self, run_context, metrics, checkpoint):
                # Taken out: Tune's callback, after this one, forwards the rest (a first seed's ASHA reports).
                queue.put({k: metrics[0].pop(k) for k in (POINTS, POINTS_RUN) if k in metrics[0]})

        return ToQueue()

    def drain(self) -> None:
        with contextlib.suppress(Exception):
            while not self.queue.empty():
                self.take(self.queue.get_nowait())

    @contextlib.contextmanager
    def draining(self):
        done = threading.Event()

        def loop() -> None:
            while not done.wait(0.5):
                self.drain()

        thread = threading.Thread(target=loop, name="reports", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(30)
            self.drain()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.queue.shutdown()


def workers_lost(exc) -> str | None:
    """What Ray Train's ``WorkerGroupError`` says when its workers died (a killed process, an OOM, a
    lost node: each worker's failure is a failed health check on a dead actor), in a line; None
    when a worker raised an exception of its own."""
    import ray.exceptions

    died = {rank: getattr(failure, "health_check_failure", None) for rank, failure in exc.worker_failures.items()}
    if not died or not all(isinstance(f, ray.exceptions.RayActorError) for f in died.values()):
        return None
    rank, failure = min(died.items())
    detail = " ".join(str(failure).split())
    why = detail.split("Worker exit detail: ", 1)[1].split(". ")[0] if "Worker exit detail: " in detail else detail[:160]
    return f"rank {rank}'s process died: {why}"
