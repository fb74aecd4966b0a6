"""One training job, in the order it happens: ``preflight`` (everything that can be checked before
Ray starts), ``start`` (Ray, when the runtime uses it), ``prepare`` (the corpus' generated columns
and statistics, once), ``fit`` (Ray Train's ``TorchTrainer``, or the loop in this process), and
``finalize`` (the 7 STS tasks on the best checkpoint, its export, MLflow). ``platform.train``,
``platform.tune`` and ``platform.augment`` are thin commands over these steps.

With several seeds (``--seeds N``), ``fit_seeds`` fits the same configuration once per seed, each
in its own MLflow run nested under the run it belongs to, and ``finalize_seeds`` gives that run
the mean and standard deviation of every score; the registry compares means.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from methods.encoder import Encoder, load_tokenizer
from platform import tracking
from platform.config import TrainConfig
from platform.data import STS_TASKS, data_dir, load_sts, read_corpus, resolve_corpus
from platform.data.columns import CorpusData, prepare_corpus
from platform.errors import ConfigError, DataError
from platform.run import checkpoint, storage
from platform.run.local_models import resolve_local_models, uses_random_mlm
from platform.run.loop import DEV_METRIC, RunContext, train_loop_per_worker
from platform.run.ray_env import init_ray  # before Ray is imported: it sets Ray's console options


def preflight(cfg: TrainConfig, final_eval: bool | None = None) -> list[str]:
    """Validate data, corpus, backbone, the ingredients' resources, output folder and MLflow;
    return the corpus sentences (read once, here)."""
    root = data_dir()
    load_sts("STSBenchmark", root, split="dev")
    if cfg.final_eval if final_eval is None else final_eval:
        for task in STS_TASKS:
            load_sts(task, root)
    corpus = resolve_corpus(cfg.corpus)
    cfg.corpus = str(corpus)  # absolute: workers run in a copy of the repository
    sentences = read_corpus(corpus, limit=cfg.max_sentences or None)
    if len(sentences) < cfg.batch_size:
        raise DataError(f"corpus {corpus} has {len(sentences)} sentences, fewer than one batch of {cfg.batch_size}")
    load_tokenizer(cfg.model)
    resolve_local_models(cfg.ingredient_params)
    cfg.build_recipe().preflight()
    if cfg.runtime == "process" and storage.is_uri(cfg.output_dir):
        raise ConfigError(f"runtime=process keeps its checkpoint on this machine: output_dir must be a local path, not {cfg.output_dir}")
    cfg.output_dir = storage.check_writable(cfg.output_dir)
    tracking.check_reachable(tracking.tracking_uri())
    return sentences


def start(cfg: TrainConfig, num_cpus: int | None = None) -> None:
    if cfg.runtime == "ray":
        init_ray(num_cpus=num_cpus)


def prepare(cfg: TrainConfig, sentences: list[str], check: bool = True) -> CorpusData:
    """Once per corpus, on the driver: the generated columns (Ray Data actors under the Ray
    runtime) and the corpus statistics, both cached, so errors surface here and every worker and
    trial finds them ready."""
    recipe = cfg.build_recipe()
    corpus = prepare_corpus(recipe, sentences, use_ray=cfg.runtime == "ray", use_gpu=cfg.use_gpu, cpus=cfg.augment_cpus)
    if check:
        recipe.check_statistics(corpus.states)
    return corpus


@dataclasses.dataclass
class FitResult:
    best_dev: float | None
    checkpoint: str | None  # the best checkpoint: a local folder or a URI in output_dir's storage
    metrics: dict = dataclasses.field(default_factory=dict)  # the last report (Ray) or the loop's summary


def dev_pairs() -> dict[str, list]:
    """STS-B dev as plain lists, read here on the driver: training workers on other nodes get
    it with their configuration instead of reading a data folder they may not have."""
    pairs = load_sts("STSBenchmark", data_dir(), split="dev")
    return {"sent1": list(pairs.sent1), "sent2": list(pairs.sent2), "scores": [float(x) for x in pairs.scores]}


def fit(cfg: TrainConfig, corpus: CorpusData, *, uri: str | None, run_id: str | None, storage_path: str, name: str,
        tune_callback: bool = False, label: str | None = None) -> FitResult:
    """Train with the configured runtime; the best checkpoint by STS-B dev. ``label`` prefixes the
    console line each evaluation prints (a trial's id)."""
    ctx = RunContext(config=cfg.flat(), runtime=cfg.runtime, num_sentences=corpus.num_sentences,
                     tracking_uri=uri, run_id=run_id, dev=dev_pairs(), label=label)
    if cfg.runtime == "process":
        ctx.corpus, ctx.run_dir = corpus, str(Path(storage_path, name))
        out = train_loop_per_worker(ctx.loop_config())
        best = Path(storage_path, name, "best")
        return FitResult(out["best_" + DEV_METRIC], str(best) if checkpoint.is_checkpoint(best) else None, metrics=out)
    return _fit_ray(cfg, corpus, ctx, storage_path, name, tune_callback)


def _fit_ray(cfg: TrainConfig, corpus: CorpusData, ctx: RunContext, storage_path: str, name: str,
             tune_callback: bool) -> FitResult:
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from platform.data.pipeline import epoch_datasets

    resources = {"CPU": cfg.cpus_per_worker, **({"GPU": 1} if cfg.use_gpu else {})}
    callbacks = [best_checkpoint_tag_class()(ctx.tracking_uri, ctx.run_id)] if ctx.run_id else []
    if tune_callback:  # after the tag: Tune (and ASHA, which may end the trial on it) sees the report last
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
    return FitResult(metrics.get("best_" + DEV_METRIC), storage.uri_of(best.filesystem, best.path) if best else None,
                     metrics)


def best_checkpoint_tag_class():
    # Built here: Ray is imported only by a fit that uses it, and cloudpickle sends a class
    # defined in a function to the controller by value (it then imports only tracking, storage).
    import ray.train

    class BestCheckpointTag(ray.train.UserCallback):
        """Tags the run with each new best checkpoint (by STS-B dev) as soon as Ray has persisted
        it, before the report goes on to Tune: a scheduler that ends the trial on that report (ASHA
        at a rung that is also the last evaluation) ends it before ``fit`` returns, and the run
        still says where its best checkpoint is. Runs in Ray Train's controller."""

        def __init__(self, uri: str | None, run_id: str):
            self.uri, self.run_id = uri, run_id

        def after_report(self, run_context, metrics, checkpoint):
            # Rank 0 evaluates; its best so far is restored with the loop after a restart.
            dev, best = metrics[0].get(DEV_METRIC), metrics[0].get("best_" + DEV_METRIC)
            if checkpoint is None or dev is None or best is None or dev < best:
                return
            tracking.set_tags(self.uri, self.run_id, {"best_checkpoint": storage.uri_of(checkpoint.filesystem, checkpoint.path)})

    return BestCheckpointTag


@dataclasses.dataclass
class SeedRun:
    seed: int
    run_id: str  # its own MLflow run, nested under the configuration's run
    fit: FitResult


def seed_values(cfg: TrainConfig, n: int) -> list[int]:
    """``n`` seeds from the configured one: ``seed, seed + 1, ...`` (one seed: just ``seed``)."""
    if n < 1:
        raise ConfigError(f"--seeds must be >= 1, got {n}")
    return [cfg.seed + i for i in range(n)]


def mean_std(rows: list[dict[str, float]]) -> dict[str, float]:
    """Per key present in every row: its mean under the key and its sample standard deviation
    (n - 1 in the denominator, the convention of reported seed spreads) under ``<key>_std``."""
    import numpy as np

    out: dict[str, float] = {}
    for key in [k for k in rows[0] if all(k in r for r in rows)]:
        values = np.asarray([r[key] for r in rows], dtype=float)
        out[key] = float(values.mean())
        out[f"{key}_std"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return out


def fit_seeds(cfg: TrainConfig, corpus: CorpusData, seeds: int, *, uri: str, parent: str, experiment: str,
              storage_path: str, name: str, tune_callback: bool = False, label: str | None = None) -> list[SeedRun]:
    """The configuration fitted once per seed, one after the other, each in an MLflow run nested
    under ``parent``; ``parent`` gets the mean and std of the best STS-B dev. In a Tune trial only
    the first seed reports to Tune, so ASHA compares configurations on one learning curve and a
    configuration it keeps gets all its seeds."""
    runs: list[SeedRun] = []
    for i, seed in enumerate(seed_values(cfg, seeds)):
        scfg = TrainConfig.from_flat({**cfg.flat(), "seed": seed})
        run_name = f"{name}-seed{seed}"
        run_id = tracking.start_run(uri, experiment, run_name, {**run_tags(scfg), "seed": str(seed)}, parent_run_id=parent)
        status = "FAILED"
        try:
            tracking.log_params(uri, run_id, scfg.flat())
            tracking.log_corpus(uri, run_id, cfg.corpus, corpus.digest, corpus.num_sentences)
            out = fit(scfg, corpus, uri=uri, run_id=run_id, storage_path=storage_path, name=run_name,
                      tune_callback=tune_callback and i == 0, label=" ".join(filter(None, [label, f"seed {seed}"])))
            if out.checkpoint is None:
                raise DataError(f"seed {seed}: training finished without a checkpoint (no STS-B dev evaluation ran)")
            tracking.set_tags(uri, run_id, {"best_checkpoint": out.checkpoint})
            status = "FINISHED"
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            tracking.end_run(uri, run_id, status)
        runs.append(SeedRun(seed, run_id, out))
    tracking.log_metrics(uri, parent, seed_dev(runs))
    best = best_seed(runs)
    tracking.set_tags(uri, parent, {"best_checkpoint": best.fit.checkpoint, "best_seed": str(best.seed)})
    return runs


def best_seed(runs: list[SeedRun]) -> SeedRun:
    return max(runs, key=lambda r: r.fit.best_dev)


def seed_dev(runs: list[SeedRun]) -> dict[str, float]:
    """``best_<dev>`` (the mean over the seeds' best STS-B dev) and ``best_<dev>_std``."""
    return mean_std([{"best_" + DEV_METRIC: r.fit.best_dev} for r in runs])


def seed_runs_of(uri: str, run_id: str) -> list[SeedRun]:
    """The seed runs nested under ``run_id`` (a trial's, read back after the sweep)."""
    found = []
    for run in tracking.child_runs(uri, run_id, "attributes.status = 'FINISHED'"):
        if "seed" in run.data.tags and run.data.tags.get("best_checkpoint"):
            fit_result = FitResult(run.data.metrics.get("best_" + DEV_METRIC), run.data.tags["best_checkpoint"])
            found.append(SeedRun(int(run.data.tags["seed"]), run.info.run_id, fit_result))
    return sorted(found, key=lambda r: r.seed)


def finalize_seeds(uri: str, run_id: str, runs: list[SeedRun], log_to: list[str] | None = None,
                   scores: dict[str, float] | None = None) -> dict[str, float]:
    """The 7 STS tasks on every seed's best checkpoint (logged in its run); ``run_id`` and
    ``log_to`` get each score's mean as ``sts_<task>`` and its std as ``sts_<task>_std``; the best
    seed's checkpoint (by STS-B dev) is exported and registered with the means, and the champion
    alias is compared on the mean STS-B dev. ``scores``: those means and stds, already logged on
    ``run_id`` (a grid point's), so the seeds are not evaluated again."""
    if len(runs) == 1:
        return finalize(uri, run_id, runs[0].fit.checkpoint, log_to, scores=scores)
    if scores is None:
        scores = evaluate_seeds(uri, run_id, runs, log_to)
    else:
        _log_seed_scores(uri, log_to or [], scores, len(runs))
    dev = seed_dev(runs)
    best = best_seed(runs)
    with storage.local_copy(best.fit.checkpoint) as folder:
        _finalize(uri, run_id, folder, log_to, scores=scores, dev=dev["best_" + DEV_METRIC],
                  extra_tags={"seeds": str(len(runs)), "best_seed": str(best.seed),
                              "best_" + DEV_METRIC + "_std": f"{dev['best_' + DEV_METRIC + '_std']:.4f}"})
    return scores


def evaluate_seeds(uri: str, run_id: str, runs: list[SeedRun], log_to: list[str] | None = None) -> dict[str, float]:
    """The 7 STS tasks on every seed's best checkpoint, logged in the seed's run; their means
    (``sts_<task>``) and stds (``sts_<task>_std``) logged on ``run_id`` and ``log_to``."""
    per_seed = [evaluate_sts(uri, r.run_id, r.fit.checkpoint, quiet=True) for r in runs]
    scores = mean_std(per_seed)
    print(format_seed_table(per_seed, [r.seed for r in runs], scores), flush=True)
    _log_seed_scores(uri, [run_id, *(log_to or [])], scores, len(runs))
    return scores


def _log_seed_scores(uri: str, targets: list[str], scores: dict[str, float], seeds: int) -> None:
    for target in targets:
        tracking.log_metrics(uri, target, {f"sts_{k}": v for k, v in scores.items()})
        tracking.set_tags(uri, target, {"seeds": str(seeds)})


def format_seed_table(per_seed: list[dict[str, float]], seeds: list[int], scores: dict[str, float]) -> str:
    import pandas as pd

    from platform.evaluation.sts import SHORT_NAMES
    from platform.sweep_summary import format_table

    rows = [{"": f"seed {s}", **{SHORT_NAMES.get(t, t): f"{v:.2f}" for t, v in row.items()}}
            for s, row in zip(seeds, per_seed)]
    rows.append({"": "mean +- std", **{SHORT_NAMES.get(t, t): f"{scores[t]:.2f} +- {scores[t + '_std']:.2f}"
                                       for t in per_seed[0]}})
    return format_table(pd.DataFrame(rows))


def finalize(uri: str, run_id: str, location: str, log_to: list[str] | None = None,
             scores: dict[str, float] | None = None) -> dict[str, float]:
    """Evaluate a checkpoint (a folder or a URI) on the 7 STS tasks (``scores``: its table, already
    logged on ``run_id``, e.g. a grid point's); log the table and the model in both formats."""
    if scores is not None:
        for target in log_to or []:
            tracking.log_metrics(uri, target, {f"sts_{k}": v for k, v in scores.items()})
    with storage.local_copy(location) as folder:
        return _finalize(uri, run_id, folder, log_to, scores=scores)


def evaluate_sts(uri: str, run_id: str, location: str, log_to: list[str] | None = None,
                 quiet: bool = False) -> dict[str, float]:
    """The 7 STS tasks (and their mean) on a checkpoint (a folder or a URI), logged as ``sts_*``."""
    with storage.local_copy(location) as folder:
        return _evaluate_sts(uri, run_id, folder, log_to, quiet)


def _evaluate_sts(uri: str, run_id: str, checkpoint_dir: Path, log_to: list[str] | None,
                  quiet: bool = False) -> dict[str, float]:
    from platform.evaluation.sts import STSEvaluator, format_table, with_mean

    state = checkpoint.read_state(checkpoint_dir)
    model = checkpoint.model_dir(checkpoint_dir)
    encoder = Encoder.from_pretrained(str(model), pooler=state["eval_pooler"])
    scores = with_mean(STSEvaluator()(encoder, progress=f"STS, {len(STS_TASKS)} tasks"))
    if not quiet:
        print(format_table(scores), flush=True)
    for target in [run_id, *(log_to or [])]:
        tracking.log_metrics(uri, target, {f"sts_{k}": v for k, v in scores.items()}, state["step"])
    return scores


def _finalize(uri: str, run_id: str, checkpoint_dir: Path, log_to: list[str] | None,
              scores: dict[str, float] | None = None, dev: float | None = None,
              extra_tags: dict[str, str] | None = None) -> dict[str, float]:
    """``scores``/``dev``: already computed (a mean over seeds), instead of this checkpoint's own."""
    from platform.evaluation.export import ExportUnsupported, export_sentence_transformers

    state = checkpoint.read_state(checkpoint_dir)
    model = checkpoint.model_dir(checkpoint_dir)
    pooler = state["eval_pooler"]
    if scores is None:
        scores = _evaluate_sts(uri, run_id, checkpoint_dir, log_to)
    dev = float(state[DEV_METRIC]) if dev is None else dev
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "sts_results.json"
        results.write_text(json.dumps({"scores": scores, "pooler": pooler, "step": state["step"],
                                       DEV_METRIC: dev, **(extra_tags or {})}, indent=2))
        tracking.log_file(uri, run_id, results)
        tracking.log_folder(uri, run_id, model, "best_checkpoint/hf")
        try:
            st_dir = export_sentence_transformers(model, Path(tmp) / "st", pooler)
            tracking.log_folder(uri, run_id, st_dir, "best_checkpoint/sentence-transformers")
            register(uri, run_id, st_dir, state, scores, dev, extra_tags)
        except ExportUnsupported as exc:
            tracking.set_tags(uri, run_id, {"sentence_transformers_export": f"skipped: {exc}"})
    tracking.set_tags(uri, run_id, {"best_step": str(state["step"])})
    return scores


def register(uri: str, run_id: str, st_dir: Path, state: dict, scores: dict[str, float], dev: float,
             extra_tags: dict[str, str] | None = None) -> None:
    """The best checkpoint as an MLflow model (``sentence_transformers`` flavor) in the run, and a
    version of ``<recipe>-encoder`` in the Model Registry, tagged with its 7-task table, recipe and
    commit; the ``champion`` alias moves to it only if its STS-B dev (``dev``: the mean over seeds
    where there are several) beats the champion's."""
    name = tracking.registered_name(state["method"], state["recipe"])
    model_uri = tracking.log_encoder_model(uri, run_id, st_dir)
    tags = {"recipe": state["recipe"], "method": state["method"], "git_commit": tracking.git_commit(),
            "step": str(state["step"]), **{f"sts_{k}": f"{v:.4f}" for k, v in scores.items()}, **(extra_tags or {})}
    try:
        version, champion = tracking.register_encoder(uri, name, model_uri, run_id, dev, tags)
    except tracking.RegistryUnavailable as exc:  # e.g. a file store: the model stays logged in the run
        tracking.set_tags(uri, run_id, {"registered_model": f"skipped: {exc}"})
        print(f"note: model logged in run {run_id}, not registered ({exc})", flush=True)
        return
    tracking.set_tags(uri, run_id, {"registered_model": f"{name}/{version}"})
    verdict = "now the champion" if champion else "the champion stays (better STS-B dev)"
    print(f"registered {name} version {version} ({DEV_METRIC} {dev:.2f}): {verdict}; "
          f"load it with mlflow.sentence_transformers.load_model('models:/{name}@{tracking.CHAMPION}')", flush=True)


def run_tags(cfg: TrainConfig) -> dict[str, str]:
    tags = {"method": cfg.method, "recipe": cfg.recipe.describe(), "profile": cfg.profile, "model": cfg.model}
    if uses_random_mlm(cfg.ingredient_params):
        tags["mlm_random_weights"] = "true"
        tags["mlm_note"] = "negatives from a randomly initialised tiny MLM (offline local profile): noise, not real SAN negatives"
    return tags
