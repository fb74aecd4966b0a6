"""After training: the 7 STS tasks on a best checkpoint, and its export (Hugging Face and
sentence-transformers formats, logged to the run) and registration (``platform.tracking.registry``)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from methods.encoder import Encoder
from platform.data import STS_TASKS
from platform.run import checkpoint, storage
from platform.tracking import registry
from platform.tracking.runs import DEV_METRIC, Run
from platform.tracking.store import git_commit


def evaluate_sts(run: Run, location: str, quiet: bool = False) -> dict[str, float]:
    """The 7 STS tasks and their mean on the checkpoint at ``location`` (a folder or a URI),
    logged on ``run`` as ``sts_<task>`` at the checkpoint's step; printed unless ``quiet``."""
    from platform.evaluation.sts import STSEvaluator, format_table, with_mean

    with storage.local_copy(location) as folder:
        state = checkpoint.read_state(folder)
        encoder = Encoder.from_pretrained(str(checkpoint.model_dir(folder)), pooler=state["eval_pooler"])
        scores = with_mean(STSEvaluator()(encoder, progress=f"STS, {len(STS_TASKS)} tasks"))
    if not quiet:
        print(format_table(scores), flush=True)
    run.log_metrics({f"sts_{k}": v for k, v in scores.items()}, state["step"])
    return scores


def export_and_register(run: Run, location: str, scores: dict[str, float], dev: float,
                        tags: dict[str, str] | None = None) -> None:
    """The checkpoint at ``location`` into ``run``'s artifacts (``sts_results.json``,
    ``best_checkpoint/hf``, ``best_checkpoint/sentence-transformers``) and into the Model Registry
    with ``scores`` and ``dev`` (means over seeds where there are several) and ``tags``."""
    from platform.evaluation.export import ExportUnsupported, export_sentence_transformers

    with storage.local_copy(location) as folder, tempfile.TemporaryDirectory() as tmp:
        state = checkpoint.read_state(folder)
        model, pooler = checkpoint.model_dir(folder), state["eval_pooler"]
        results = Path(tmp) / "sts_results.json"
        results.write_text(json.dumps({"scores": scores, "pooler": pooler, "step": state["step"], DEV_METRIC: dev,
                                       **(tags or {})}, indent=2))
        run.log_file(results)
        run.log_folder(model, "best_checkpoint/hf")
        try:
            st_dir = export_sentence_transformers(model, Path(tmp) / "st", pooler)
            run.log_folder(st_dir, "best_checkpoint/sentence-transformers")
            register(run, st_dir, state, scores, dev, tags)
        except ExportUnsupported as exc:
            run.set_tags({"sentence_transformers_export": f"skipped: {exc}"})
    run.set_tags({"best_step": str(state["step"])})


def register(run: Run, st_dir: Path, state: dict, scores: dict[str, float], dev: float,
             tags: dict[str, str] | None = None) -> None:
    """The exported encoder as an MLflow model in ``run`` and a version of ``<recipe>-encoder``;
    the ``champion`` alias moves to it only if ``dev`` beats the champion's STS-B dev."""
    name = registry.registered_name(state["method"], state["recipe"])
    model_uri = registry.log_encoder_model(run.uri, run.id, st_dir)
    version_tags = {"recipe": state["recipe"], "method": state["method"], "git_commit": git_commit(),
                    "step": str(state["step"]), **{f"sts_{k}": f"{v:.4f}" for k, v in scores.items()}, **(tags or {})}
    try:
        version, champion = registry.register_encoder(run.uri, name, model_uri, run.id, dev, version_tags)
    except registry.RegistryUnavailable as exc:  # e.g. a file store: the model stays logged in the run
        run.set_tags({"registered_model": f"skipped: {exc}"})
        print(f"note: model logged in run {run.id}, not registered ({exc})", flush=True)
        return
    run.set_tags({"registered_model": f"{name}/{version}"})
    verdict = "now the champion" if champion else "the champion stays (better STS-B dev)"
    print(f"registered {name} version {version} ({DEV_METRIC} {dev:.2f}): {verdict}; load it with "
          f"mlflow.sentence_transformers.load_model('models:/{name}@{registry.CHAMPION}')", flush=True)
