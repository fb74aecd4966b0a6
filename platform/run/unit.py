"""One unit of work, the *configuration run*: one resolved configuration fitted with N >= 1 seeds,
then finalized. ``platform.train``, every Tune trial and every grid point run it.

In the order it happens: ``preflight`` (everything that can be checked before Ray starts),
``start`` (Ray, when the runtime uses it), ``prepare`` (the corpus' generated columns and
statistics, once), ``run_configuration`` (each seed fitted by ``platform.run.fit``: in the
configuration's own MLflow run for one seed, in a run nested under it per seed for several; the
configuration's run gets the mean and std of every score), and ``finalize`` (the 7 STS tasks on
every seed's best checkpoint, ``platform.run.final_evaluation``; for ``final="full"`` the best
seed's checkpoint exported and registered, ``platform.run.export``). A configuration run that was
interrupted continues where its checkpoints left it: finished seeds are read back, the others resume from storage.
"""

from __future__ import annotations

import dataclasses
import json
import time

from methods.encoder import backbone_config, load_tokenizer, max_positions
from methods.errors import InvalidParams
from platform import storage
from platform.config import TrainConfig, smoke_reason
from platform.console import seed_table, still_working
from platform.data import STS_TASKS, data_dir, load_sts, read_corpus, resolve_corpus
from platform.data.columns import (CorpusData, check_given_columns, generate_missing, missing_generations, prepare_corpus,
                                  resolve_local_models, uses_random_mlm)
from platform.errors import ConfigError, DataError, UserError
from platform.run import export, final_evaluation
from platform.run.fit import FitResult, fit, release
from platform.run.ray_env import init_ray  # before Ray is imported: it sets Ray's console options
from platform.tracking import recorder, store
from platform.checkpoint import exists as checkpoint_exists
from platform.tracking.names import (BEST, BEST_CHECKPOINT_TAG, WINNER_RUN_ID_TAG, BEST_SEED_TAG, CORPUS_SHA256_TAG, DRIVER_TAG,
                                     METHOD_TAG, MLM_NOTE_TAG, MLM_RANDOM_WEIGHTS_TAG, MODEL_TAG, PROFILE_TAG, RECIPE_TAG,
                                     SEED_TAG, SEEDS_TAG, STS_PREFIX, SUPERVISION_TAG, prefix_of, sts)
from platform.tracking.recorder import Run

FINALS = ("none", "evaluate", "full")  # after fitting: nothing; the 7 STS tasks; those, export and registry
MAX_SEEDS = 100


def preflight(cfg: TrainConfig, final_eval: bool | None = None) -> list[str]:
    """Validate data, corpus, backbone, the ingredients' resources, output folder and MLflow;
    return the corpus sentences (read once, here). Resolves ``corpus`` and ``output_dir`` in place."""
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

    tokenizer = load_tokenizer(cfg.model)
    positions = max_positions(cfg.model)
    if positions is not None and cfg.max_len > positions:
        raise ConfigError(f"max_len={cfg.max_len} is beyond the {positions} positions of {cfg.model}; "
                          f"use max_len <= {positions}")
    check_text_left(sentences, tokenizer, corpus, cfg.batch_size)
    resolve_local_models(cfg.ingredient_params)
    recipe = cfg.build_recipe()
    hidden = getattr(backbone_config(cfg.model), "hidden_size", None) if recipe.matryoshka is not None else None
    if hidden:  # the prefixes fit the backbone's vectors, checked before any worker starts
        try:
            recipe.matryoshka.check_width(int(hidden))
        except InvalidParams as exc:
            raise ConfigError(f"{cfg.model}: {exc}") from None
    recipe.preflight()
    if cfg.final_eval and cfg.final_benchmark:  # unknown or unreachable tasks refused before any training
        final_evaluation.benchmark_tasks(cfg.final_benchmark, announce=True)
    check_given_columns(recipe, sentences)
    recipe.check_corpus(sentences)
    for line in [n for i in recipe.ingredients for n in i.notes(cfg.batch_size)]:
        print(f"note: {line}", flush=True)
    if cfg.runtime == "process" and storage.is_uri(cfg.output_dir):
        raise ConfigError(f"runtime=process keeps its checkpoint on this machine: output_dir must be a local path, not {cfg.output_dir}")
    cfg.output_dir = storage.check_writable(cfg.output_dir)
    store.check_reachable(store.tracking_uri())
    return sentences


TEXT_SAMPLE = 10_000  # lines of the corpus tokenised before Ray starts


def check_text_left(sentences: list[str], tokenizer, corpus, batch_size: int) -> None:
    """Lines of invisible or control characters pass every text check and tokenise to nothing
    (``[CLS] [SEP]``): refuse a corpus that is all such lines, and say how many there are."""
    sample = sentences[:TEXT_SAMPLE]
    empty = sum(not ids for ids in tokenizer(sample, add_special_tokens=False)["input_ids"])
    if len(sample) - empty < min(batch_size, len(sample)):
        raise DataError(f"corpus {corpus}: {empty:,} of the first {len(sample):,} lines have no text left after "
                        "tokenisation (invisible or control characters only); one sentence per line")
    if empty:
        print(f"note: {empty:,} of the first {len(sample):,} lines of {corpus} tokenise to nothing "
              "(invisible characters); they train as empty sentences", flush=True)


def start(cfg: TrainConfig, num_cpus: int | None = None) -> None:
    if cfg.runtime == "ray":
        init_ray(num_cpus=num_cpus)


def prepare(cfg: TrainConfig, sentences: list[str], check: bool = True, generate: bool = True) -> CorpusData:
    """Once per corpus, on the driver: the generated columns (Ray Data actors under the Ray
    runtime) and the corpus statistics, both cached, so errors surface here and every worker and
    trial finds them ready. ``generate=False`` (a sweep's trial): the columns must be cached."""
    recipe = cfg.build_recipe()
    corpus = prepare_corpus(recipe, sentences, use_ray=cfg.runtime == "ray", use_gpu=cfg.use_gpu, cpus=cfg.augment_cpus,
                            generate=generate)
    if check:
        recipe.check_statistics(corpus.statistics)
    return corpus


def seed_corpus(cfg: TrainConfig, scfg: TrainConfig, corpus: CorpusData, generate: bool) -> CorpusData:
    """The corpus a seed trains on: ``cfg``'s, unless the recipe generates columns from the seed
    (SAN's masks, AugCSE's choices), which each seed has of its own (a trial's were made before it)."""
    if [c.kwargs for c in scfg.build_recipe().generated_columns()] == [c.kwargs for c in cfg.build_recipe().generated_columns()]:
        return corpus
    return prepare(scfg, corpus.columns["sentence"].to_pylist(), check=False, generate=generate)


def generate_all(base: TrainConfig, configs: list[TrainConfig], sentences: list[str], what: str,
                 seeds: int = 1) -> None:
    """The generated columns of ``base`` and of every configuration in ``configs`` (a sweep's
    searched generation values, ``what``), for each of ``seeds`` seeds, that the cache lacks, made
    in one pass over the corpus by the cluster's actors, said before and timed."""
    digest = storage.sentences_digest(sentences)
    pending = missing_generations([c.with_values({"seed": s}, source="--seeds").build_recipe()
                                   for c in [base, *configs] for s in seed_values(c, seeds)], digest)
    if not pending:
        return
    columns = ", ".join(dict.fromkeys(c for job, _ in pending for c in job.columns))
    print(f"generating before the trials: {columns}{f' for {what}' if what else ''} "
          f"({len(pending)} generation(s) of {len(sentences):,} sentences) ...", flush=True)
    start = time.perf_counter()
    generate_missing(pending, sentences, digest, use_ray=base.runtime == "ray", use_gpu=base.use_gpu,
                     cpus=base.augment_cpus)
    print(f"generated in {time.perf_counter() - start:.1f} s", flush=True)


def run_tags(cfg: TrainConfig) -> dict[str, str]:
    tags = {METHOD_TAG: cfg.method, RECIPE_TAG: cfg.recipe.describe(), PROFILE_TAG: cfg.profile, MODEL_TAG: cfg.model}
    why = smoke_reason(cfg.profile, cfg.model)
    if why:
        tags.update(smoke="true", smoke_note=f"smoke test, not a result: {why}")
    recipe = cfg.build_recipe()
    tags[SUPERVISION_TAG] = recipe.supervision
    for ingredient in recipe.ingredients:
        tags.update(ingredient.run_tags())
    if uses_random_mlm(cfg.ingredient_params):
        tags[MLM_RANDOM_WEIGHTS_TAG] = "true"
        tags[MLM_NOTE_TAG] = "negatives from a randomly initialised tiny MLM (offline local profile): noise, not real SAN negatives"
    return tags


def seed_values(cfg: TrainConfig, n: int) -> list[int]:
    """``n`` seeds from the configured one: ``seed, seed + 1, ...`` (one seed: just ``seed``)."""
    if not 1 <= n <= MAX_SEEDS:
        raise ConfigError(f"--seeds must be between 1 and {MAX_SEEDS}, got {n}")
    return [cfg.seed + i for i in range(n)]


def mean_std(rows: list[dict[str, float]]) -> dict[str, float]:
    """Per key present in every row: its mean under the key and, for several rows, its sample
    standard deviation (n - 1 in the denominator, as seed spreads are reported) as ``<key>_std``."""
    import numpy as np

    out: dict[str, float] = {}
    for key in [k for k in rows[0] if all(k in r for r in rows)]:
        values = np.asarray([r[key] for r in rows], dtype=float)
        out[key] = float(values.mean())
        if len(values) > 1:
            out[f"{key}_std"] = float(values.std(ddof=1))
    return out


@dataclasses.dataclass
class SeedFit:
    seed: int
    run: Run  # the seed's MLflow run: the configuration's own for one seed
    result: FitResult


@dataclasses.dataclass
class ConfigResult:
    """A configuration's fits, its 7-task scores once evaluated (means and stds over seeds), and the
    untouched backbone's beside them once finalized."""

    fits: list[SeedFit]
    scores: dict[str, float] | None = None
    baseline: dict[str, float] | None = None

    @property
    def best_seed(self) -> SeedFit:
        return max(self.fits, key=lambda f: f.result.best_dev)

    @property
    def dev(self) -> dict[str, float]:
        """``best_<dev>``: the mean over the seeds' best STS-B dev (and ``best_<dev>_std``)."""
        return mean_std([{BEST: f.result.best_dev} for f in self.fits])

    @property
    def checkpoint(self) -> str:
        return self.best_seed.result.checkpoint


def run_configuration(cfg: TrainConfig, corpus: CorpusData, run: Run, *, storage_path: str, name: str, seeds: int,
                      final: str, tune_reports: bool = False, label: str | None = None) -> ConfigResult:
    """Fit ``cfg`` with ``seeds`` seeds (checkpoints under ``storage_path/name[-seed<s>]``), record
    them on ``run``, then finalize (``final``: one of ``FINALS``). ``tune_reports``: the first
    seed's evaluations also go to the Tune trial this runs in (what ASHA compares)."""
    values = seed_values(cfg, seeds)
    if len(values) == 1:  # one seed: fitted in the configuration's own run, which its fit names the best of
        out = fit(cfg, corpus, run, storage_path=storage_path, name=name, tune_reports=tune_reports, label=label)
        fits = [SeedFit(values[0], run, require_checkpoint(out, ""))]
    else:
        fits = [_fit_seed(cfg, corpus, run, seed, storage_path, name, tune_reports and i == 0, label)
                for i, seed in enumerate(values)]
    result = ConfigResult(fits)
    if len(fits) > 1:  # one seed: its fit named the run's best checkpoint
        recorder.log_results(run, result.dev)
        recorder.name_best(run, result.checkpoint, {BEST_SEED_TAG: str(result.best_seed.seed), SEEDS_TAG: str(len(fits))})
    finalize(run, result, final)
    return result


def require_checkpoint(out: FitResult, who: str) -> FitResult:
    """A fit that ended without evaluating has nothing to finalize: a data error (``who``: which seed)."""
    if out.checkpoint is None:
        raise DataError(f"{who}training finished without a checkpoint (no STS-B dev evaluation ran)")
    return out


def _fit_seed(cfg: TrainConfig, corpus: CorpusData, run: Run, seed: int, storage_path: str, name: str,
              tune_reports: bool, label: str | None) -> SeedFit:
    """One of several seeds, in a run of its own nested under the configuration's ``run``."""
    scfg = cfg.with_values({"seed": seed}, source="--seeds")
    seed_name = f"{name}-seed{seed}"
    found = _seed_run(run, seed)
    if found is not None and found.info.status == "FINISHED" and checkpoint_exists(found.data.tags.get(BEST_CHECKPOINT_TAG)):
        return SeedFit(seed, Run(run.uri, found.info.run_id, seed_name), _fit_result(found))  # a resumed configuration
    corpus = seed_corpus(cfg, scfg, corpus, generate=not run.in_trial)  # read only for a seed that trains
    seed_run = (Run.reopen(run.uri, found.info.run_id) if found is not None
                else run.child(seed_name, {**run_tags(scfg), SEED_TAG: str(seed)}))
    with seed_run.closing():
        if found is None or CORPUS_SHA256_TAG not in found.data.tags:  # a start stopped before it logged them
            seed_run.log_config(scfg)
            seed_run.log_corpus(cfg.corpus, corpus.digest, corpus.num_sentences)
        out = fit(scfg, corpus, seed_run, storage_path=storage_path, name=seed_name, tune_reports=tune_reports,
                  label=" ".join(filter(None, [label, f"seed {seed}"])))
        require_checkpoint(out, f"seed {seed}: ")
        seed_run.complete(out.checkpoint)
    release(out.checkpoint)  # the seed's work is done: it is never trained again
    return SeedFit(seed, seed_run, out)


def _seed_run(run: Run, seed: int):
    """The seed's run nested under ``run`` from an earlier attempt of this configuration, if any."""
    if not run.resumed:
        return None
    found = store.child_runs(run.uri, run.id, f"tags.{SEED_TAG} = '{seed}'", order_by=["attributes.start_time DESC"])
    return found[0] if found else None


def _fit_result(mlflow_run) -> FitResult:
    return FitResult(mlflow_run.data.metrics.get(BEST), mlflow_run.data.tags.get(BEST_CHECKPOINT_TAG))


def read_result(run: Run) -> ConfigResult:
    """A finished configuration run read back from MLflow (a sweep's trial, to finalize it): its
    seed runs, or itself for one seed, and its 7-task scores when it holds the full table."""
    seeds = [r for r in store.child_runs(run.uri, run.id, "attributes.status = 'FINISHED'") if SEED_TAG in r.data.tags]
    mlflow_run = run.info()
    fits = ([SeedFit(int(r.data.tags[SEED_TAG]), Run(run.uri, r.info.run_id), _fit_result(r))
             for r in sorted(seeds, key=lambda r: int(r.data.tags[SEED_TAG]))]
            or [SeedFit(int(mlflow_run.data.params.get("seed", 0)), run, _fit_result(mlflow_run))])
    table = {k[len(STS_PREFIX):]: v for k, v in mlflow_run.data.metrics.items() if k.startswith(STS_PREFIX)}
    complete = {*STS_TASKS, "avg"} <= set(table) and (len(fits) == 1 or "avg_std" in table)
    return ConfigResult(fits, table if complete else None)


def finalize(run: Run, result: ConfigResult, final: str, searched: dict[str, str] | None = None) -> None:
    """``final``: ``evaluate`` the 7 STS tasks on every seed's best checkpoint (skipped where
    ``result`` holds them already), their means and stds on ``run``; ``full``: also export and
    register the best seed's checkpoint with those numbers (``searched``: a sweep's winning
    values, for the registered version). The untouched backbone's scores go to ``result.baseline``."""
    if final not in FINALS:
        raise ValueError(f"final must be one of {FINALS}, got {final!r}")
    if final == "none":
        return
    if result.scores is None:
        if final == "full":  # what the user waits on at the end: said before it starts
            of = f"each of the {len(result.fits)} seeds' best checkpoints" if len(result.fits) > 1 else "the best checkpoint"
            print(f"final evaluation: the {len(STS_TASKS)} STS tasks on {of} ...", flush=True)
        with still_working("final evaluation, the 7 STS tasks"):
            result.scores = evaluate_fits(run, result.fits, alone=final == "full")
    with still_working("the untouched backbone's 7 STS tasks (once per backbone and pooler)"):
        result.baseline = final_evaluation.against_baseline(run, result.checkpoint, result.scores,
                                                            quiet=final != "full", alone=final == "full")
    if final == "full":
        n = len(result.fits)
        dev = result.dev
        tags = {} if n == 1 else {SEEDS_TAG: str(n), BEST_SEED_TAG: str(result.best_seed.seed),
                                  BEST + "_std": f"{dev[BEST + '_std']:.4f}"}
        print("export: the sentence-transformers model with its card, logged to MLflow and registered ...", flush=True)
        with still_working("export and registration"):
            export.export_and_register(run, result.checkpoint, result.scores, dev[BEST], tags, result.baseline, n,
                                       searched)
        with still_working("MTEB on the best checkpoint (final_benchmark)"):
            final_evaluation.evaluate_benchmark(run, result.checkpoint)
        final_evaluation.log_geometry(run)


def evaluate_fits(run: Run, fits: list[SeedFit], alone: bool = False) -> dict[str, float]:
    """The 7 STS tasks on every seed's best checkpoint (in the seed's run); for several seeds the
    per-seed table is printed and the means and stds logged on ``run``."""
    per_seed = [final_evaluation.evaluate_sts(f.run, f.result.checkpoint, quiet=True, alone=alone) for f in fits]
    if len(fits) == 1:
        return per_seed[0]
    scores = mean_std(per_seed)
    print(seed_table(per_seed, [f.seed for f in fits], scores), flush=True)
    # A Matryoshka run's prefixes (``dim<m>/sts_<task>``, on each seed's run): their means and stds too.
    prefixes = mean_std([{k: v for k, v in f.run.info().data.metrics.items() if prefix_of(k)} for f in fits])
    recorder.log_results(run, {**{sts(k): v for k, v in scores.items()}, **prefixes})
    run.set_tags({SEEDS_TAG: str(len(fits))})
    return scores


# ------------------------------------------------------------------------------------------------
# A configuration run's state beside its checkpoints: what --resume continues, and checks against


RUN_STATE = "platform_run.json"


def check_stopped(what: str, found) -> None:
    """``--resume``'s refusals of a run or a sweep (its MLflow run ``found``): finished, or driven by a
    process still alive."""
    driver = found.data.tags.get(DRIVER_TAG)
    if found.info.status == "FINISHED":
        best = f" (best run {found.data.tags[WINNER_RUN_ID_TAG]})" if found.data.tags.get(WINNER_RUN_ID_TAG) else ""
        raise UserError(f"--resume: {what} finished{best}; there is nothing to resume")
    if found.info.status == "RUNNING" and store.driver_alive(driver):
        raise UserError(f"--resume: {what} is still running (process {driver.split(':')[1]}); stop it first (Ctrl-C, kill)")


def check_same(what: str, changed: list[str], give: str) -> None:
    """``--resume``'s refusal of a run or a sweep started with another configuration (``changed``)."""
    if changed:
        raise ConfigError(f"--resume: {what} was started with another configuration: {', '.join(changed)}; give the "
                          f"same {give}, or start a new one")


def save_state(location: str, state: dict) -> None:
    storage.write_text(storage.join(location, RUN_STATE), json.dumps(state, indent=1, default=str))


def load_state(location: str) -> dict:
    text = storage.read_text(storage.join(location, RUN_STATE))
    if text is None:
        raise UserError(f"{location} holds no {RUN_STATE}: the run cannot be resumed (started before this version, "
                        "or its storage is gone)")
    return json.loads(text)
