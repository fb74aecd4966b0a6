"""Every name the platform writes to or reads from MLflow, in one place: the metrics a run logs, the
tags it carries, and MLflow's own tags the platform uses. Writers, queries, reports and the sweep
read the same constants, so a renamed key cannot leave one of them behind. (Configuration values
are logged as params under their config keys: ``config.py`` owns those.)"""

import re

# Metrics, per evaluation (step-indexed)
DEV_METRIC = "stsb_dev_spearman"  # STS-B dev Spearman x100: what checkpoints and runs are selected by
# Wang & Isola's alignment and uniformity of the STS-B dev embeddings, logged beside it at each evaluation.
DEV_GEOMETRY = {"alignment": "stsb_dev_alignment", "uniformity": "stsb_dev_uniformity"}
BEST_PREFIX = "best_"  # a metric's best so far in a run: best_<metric>
BEST = BEST_PREFIX + DEV_METRIC
TRAIN_LOSS = "train_loss_avg"  # the mean training loss since the previous evaluation
STEP = "step"  # also a key of a trial's Tune result
# Metrics of the final evaluation
STS_PREFIX = "sts_"
STS_AVG = STS_PREFIX + "avg"


def sts(task: str) -> str:
    """The final test metric of one STS task (``sts_STSBenchmark``), or of ``avg``."""
    return STS_PREFIX + task


PREFIX_METRIC = re.compile(r"^dim(\d+)/")  # a score at a Matryoshka prefix: dim<m>/<metric>


def at_prefix(metric: str, dims: int | None) -> str:
    """``metric`` of the embeddings' first ``dims`` coordinates (``dim128/transfer_MR``); itself for
    the whole vector (None)."""
    return f"dim{dims}/{metric}" if dims else metric


def prefix_of(metric: str) -> int | None:
    """The Matryoshka prefix an ``at_prefix`` metric is of; None for the whole vector's."""
    found = PREFIX_METRIC.match(metric)
    return int(found.group(1)) if found else None


def sts_at(task: str, dims: int | None) -> str:
    """The final test metric of one STS task at a Matryoshka prefix of ``dims`` coordinates
    (``dim128/sts_STSBenchmark``); ``sts(task)`` for the whole vector (None)."""
    return at_prefix(sts(task), dims)


def pairs_at(task: str, dims: int | None) -> str:
    """A task's per-pair similarities in ``sts_pairs.npz`` at a prefix (``STS12_dim128``), or the whole vector's."""
    return f"{task}_dim{dims}" if dims else task


def vs_backbone(task: str, kind: str) -> str:
    """The untouched backbone's score of a task (``kind="baseline"``) or the trained model's gain
    over it (``"delta"``), logged beside the final test."""
    return f"vs_backbone/{kind}_sts_{task}"


def run_setting(key: str) -> str:
    """The tag of a setting that finds a run or accounts its GPU-hours (``run.use_gpu``; config.RUN_TAGS)."""
    return f"run.{key}"


WINNER = "best."  # a sweep's parent holds its best trial's numbers under these keys, never the trials' own
RESUMED_FINISHED = "resumed_finished_trial"  # a Tune result: the trial had finished before a resume
# A report's points (JSON: [key, value, timestamp ms, step] each) since the one before, and the run
# they belong to: what the writer of that run sends (platform.tracking.recorder).
POINTS, POINTS_RUN = "points", "points_run"
PROGRESS_LINE = "progress_line"  # a report's console line, printed by the sweep's driver for a trial's reports

# Tags the platform writes on a run
METHOD_TAG, RECIPE_TAG, PROFILE_TAG, MODEL_TAG = "method", "recipe", "profile", "model"
SUPERVISION_TAG = "supervision"  # unsupervised, or teacher-assisted (MODEL): methods.recipe.Recipe.supervision


def supervision_note(tags: dict[str, str]) -> str:
    """`` [teacher-assisted (MODEL)]`` after a run's name in a table of results; "" for an
    unsupervised run, which is what every row is unless it says otherwise."""
    label = tags.get(SUPERVISION_TAG, "unsupervised")
    return "" if label == "unsupervised" else f" [{label}]"
GIT_COMMIT_TAG = "git_commit"
SEED_TAG = "seed"  # a seed's child run of a configuration with several seeds
SEEDS_TAG, BEST_SEED_TAG = "seeds", "best_seed"  # a configuration's run: how many seeds, which won
SWEEP_TAG = "sweep"  # "true" on a sweep's parent run
SEARCHED_TAG = "searched"  # a sweep's parent: the searched keys, comma-separated
TRIAL_ID_TAG = "trial_id"  # a sweep's trial run: Tune's trial id (also a key of its Tune results)
WINNER_RUN_ID_TAG = "best_run_id"  # a sweep's parent: the winning trial's run
STOPPED_BY_SCHEDULER_TAG = "stopped_by_scheduler"  # a trial's run that ASHA stopped early
BEST_CHECKPOINT_TAG = "best_checkpoint"  # the run's best checkpoint (a folder or URI): written by name_best only
BEST_STEP_TAG = "best_step"
STORAGE_TAG = "platform.storage"  # where the run's checkpoints and resumable state live
END_REASON_TAG = "platform.end_reason"
DRIVER_TAG = "platform.driver"  # the process (host and pid) that drives the run
RESUMED_TAG = "platform.resumed"  # how many times the run was resumed
CORPUS_SHA256_TAG, CORPUS_SENTENCES_TAG = "corpus_sha256", "corpus_sentences"
MLM_RANDOM_WEIGHTS_TAG, MLM_NOTE_TAG = "mlm_random_weights", "mlm_note"
BASELINE_TAG = "baseline"  # the untouched backbone's STS average
MTEB_BENCHMARK_TAG = "mteb_benchmark"
EXPORT_TAG = "sentence_transformers_export"  # why no sentence-transformers model was logged
LOGGED_MODEL_TAG = "logged_model"
REGISTERED_MODEL_TAG = "registered_model"  # "name/version" in the Model Registry, or why not
HUB_REPO_TAG, HUB_COMMIT_TAG = "hub_repo", "hub_commit"

# MLflow's own tags
PARENT_TAG = "mlflow.parentRunId"  # MLflow's nesting: a sweep's trials, a configuration's seeds
NOTE_TAG = "mlflow.note.content"  # the description MLflow's UI shows (Markdown), of a run or experiment
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
VIEW_TAG = "mlflow.sharedViewState."  # MLflow's UI keeps a saved view of an experiment's runs table here
MODEL_VERSIONS_TAG = "mlflow.modelVersions"  # on a logged model: the registry versions made from it


def winner_key(key: str) -> str:
    """The parent's key for a trial's metric: ``best_stsb_dev_spearman`` -> ``best.stsb_dev_spearman``,
    ``sts_avg`` -> ``best.sts_avg``: a sort by a trial metric lists trials only."""
    return WINNER + (key[len(BEST_PREFIX):] if key.startswith(BEST_PREFIX) else key)


def trial_key(key: str) -> str | None:
    """The trial metric a parent's ``best.`` key stands for (None for other keys)."""
    if not key.startswith(WINNER):
        return None
    key = key[len(WINNER):]
    return BEST_PREFIX + key if key.startswith(DEV_METRIC) else key
