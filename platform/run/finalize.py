"""After training: the 7 STS tasks on a best checkpoint, and its export (Hugging Face and
sentence-transformers formats, logged to the run) and registration (``platform.tracking.registry``)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from methods.encoder import Encoder
from platform.config import TrainConfig, smoke_reason
from platform.data import SHORT_NAMES, STS_TASKS
from platform.data.cache import cached, encoder_key
from platform.evaluation.export import ExportUnsupported, export_sentence_transformers, model_card
from platform.evaluation.sts import STSEvaluator, format_table, with_mean
from platform.run import checkpoint, storage
from platform.tracking import recorder, registry
from platform.tracking.runs import DEV_METRIC, Run
from platform.tracking.store import git_commit


def evaluate_sts(run: Run, location: str, quiet: bool = False) -> dict[str, float]:
    """The 7 STS tasks and their mean on the checkpoint at ``location`` (a folder or a URI),
    logged on ``run`` as ``sts_<task>`` at the checkpoint's step; printed unless ``quiet``."""
    with storage.local_copy(location) as folder:
        state = checkpoint.read_state(folder)
        encoder = Encoder.from_pretrained(str(checkpoint.model_dir(folder)), pooler=state["eval_pooler"])
        scores = with_mean(STSEvaluator()(encoder, progress=f"STS, {len(STS_TASKS)} tasks"))
    if not quiet:
        print(format_table(scores), flush=True)
    recorder.log_results(run, {f"sts_{k}": v for k, v in scores.items()}, state["step"])
    return scores


def baseline_sts(backbone: str, pooler: str) -> dict[str, float]:
    """The 7 STS tasks and their mean of the untouched ``backbone`` with ``pooler``: what a trained
    model is measured against. A cache entry keyed by the backbone's weights, tokenizer and the
    pooler (``platform.data.cache``), so each backbone is evaluated once."""
    encoder = Encoder.from_pretrained(backbone, pooler=pooler)

    def build(folder: Path) -> None:
        print(f"evaluating the untouched backbone {backbone} (pooler {pooler}) once, as the baseline", flush=True)
        scores = with_mean(STSEvaluator()(encoder, progress=f"baseline STS, {len(STS_TASKS)} tasks"))
        (folder / "scores.json").write_text(json.dumps(scores))

    entry = cached("baseline_sts", encoder_key(encoder, pooler), {"pooler": pooler}, build)
    return json.loads((entry / "scores.json").read_text())


def against_baseline(run: Run, location: str, scores: dict[str, float], quiet: bool = False) -> dict[str, float]:
    """The trained model's table beside its backbone's (same pooler) and the difference, printed
    (unless ``quiet``) and logged on ``run`` (``baseline_sts_<task>``, ``delta_sts_<task>``); returns the baseline."""
    state = read_state_at(location)
    config = state.get("config", {})
    backbone, pooler = config.get("model", ""), state["eval_pooler"]
    baseline = baseline_sts(backbone, pooler)
    tasks = [t for t in (*STS_TASKS, "avg") if t in scores and t in baseline]
    names = [SHORT_NAMES.get(t, t) for t in tasks]
    width = max(14, len(backbone.split("/")[-1]) + 2)
    rows = [("", names), (backbone.split("/")[-1][: width], [f"{baseline[t]:.2f}" for t in tasks]),
            ("trained", [f"{scores[t]:.2f}" + (f" +- {scores[t + '_std']:.2f}" if t + "_std" in scores else "")
                         for t in tasks]),
            ("difference", [f"{scores[t] - baseline[t]:+.2f}" for t in tasks])]
    cols = [max(len(r[1][i]) for r in rows) for i in range(len(tasks))]
    lines = [f"{label:<{width}}| " + " | ".join(v.rjust(w) for v, w in zip(values, cols)) for label, values in rows]
    lines.insert(1, "-" * len(lines[0]))
    why = smoke_reason(config.get("profile", ""), backbone)
    if not quiet:
        print(f"STS (Spearman x100, pooler {pooler}), against the untouched backbone:", flush=True)
        print("\n".join(lines), flush=True)
        if why:
            print(f"note: a smoke test, not a result ({why})", flush=True)
    recorder.log_results(run, {**{f"baseline_sts_{t}": baseline[t] for t in tasks},
                               **{f"delta_sts_{t}": scores[t] - baseline[t] for t in tasks}}, state["step"])
    run.set_tags({"baseline": f"{backbone} (pooler {pooler}) STS avg {baseline['avg']:.2f}"} if "avg" in baseline else {})
    return baseline


def read_state_at(location: str) -> dict:
    """A checkpoint's ``state.json`` at a folder or URI, without copying its weights."""
    if not storage.is_uri(location):
        return checkpoint.read_state(location)
    text = storage.read_text(storage.join(location, checkpoint.STATE))
    if text is None:
        with storage.local_copy(location) as folder:
            return checkpoint.read_state(folder)
    return json.loads(text)


def export_and_register(run: Run, location: str, scores: dict[str, float], dev: float,
                        tags: dict[str, str] | None = None, baseline: dict[str, float] | None = None,
                        seeds: int = 1) -> None:
    """The checkpoint at ``location`` into ``run``: ``sts_results.json``, and the model once, as
    the run's logged model (sentence-transformers folder with its model card, which Hugging Face
    also loads) and a version in the Model Registry with ``scores`` and ``dev`` (means over seeds
    where there are several) and ``tags``. A pooler sentence-transformers cannot express leaves
    the Hugging Face folder as the artifact ``best_checkpoint/hf`` instead."""
    with storage.local_copy(location) as folder, tempfile.TemporaryDirectory() as tmp:
        state = checkpoint.read_state(folder)
        model, pooler = checkpoint.model_dir(folder), state["eval_pooler"]
        results = Path(tmp) / "sts_results.json"
        results.write_text(json.dumps({"scores": scores, "baseline": baseline, "pooler": pooler, "step": state["step"],
                                       DEV_METRIC: dev, **(tags or {})}, indent=2))
        run.log_file(results)
        try:
            st_dir = export_sentence_transformers(model, Path(tmp) / "st", pooler)
        except ExportUnsupported as exc:
            run.log_folder(model, "best_checkpoint/hf")
            run.set_tags({"sentence_transformers_export": f"skipped: {exc}"})
        else:
            register(run, st_dir, state, scores, dev, tags, baseline, seeds)
    run.set_tags({"best_step": str(state["step"])})


def _cites(config: dict) -> list[str]:
    try:
        return list(dict.fromkeys(c.cites for c in TrainConfig.from_flat(config).recipe.classes() if c.cites))
    except Exception:  # noqa: BLE001 - a card without citations beats no card
        return []


def register(run: Run, st_dir: Path, state: dict, scores: dict[str, float], dev: float,
             tags: dict[str, str] | None = None, baseline: dict[str, float] | None = None, seeds: int = 1) -> None:
    """The exported encoder, with its model card, as the logged model of ``run`` and a version of
    ``<recipe>-encoder``; the ``champion`` alias moves as ``registry.champion_verdict`` says."""
    name = registry.registered_name(state["method"], state["recipe"])
    config = state.get("config", {})
    card = model_card(state, scores, baseline, name=name, dev=dev, commit=git_commit(), seeds=seeds,
                      cites=_cites(config), smoke=smoke_reason(config.get("profile", ""), config.get("model", "")))
    (st_dir / "README.md").write_text(card, encoding="utf-8")
    model_uri = registry.log_encoder_model(run.uri, run.id, st_dir, config.get("model", ""), state["step"],
                                           params={"recipe": state["recipe"], "pooler": state["eval_pooler"]})
    version_tags = {"recipe": state["recipe"], "method": state["method"], "git_commit": git_commit(),
                    **registry.lineage(config.get("model", ""), config.get("profile", ""), _corpus(config)),
                    "step": str(state["step"]), **{f"sts_{k}": f"{v:.4f}" for k, v in scores.items()}, **(tags or {})}
    try:
        version, champion = registry.register_encoder(run.uri, name, model_uri, run.id, dev, version_tags)
    except registry.RegistryUnavailable as exc:  # e.g. a file store: the model stays logged in the run
        run.set_tags({"registered_model": f"skipped: {exc}"})
        print(f"note: model logged in run {run.id}, not registered ({exc})", flush=True)
        return
    run.set_tags({"registered_model": f"{name}/{version}"})
    run.set_tags({"logged_model": model_uri})
    verdict = "now the champion" if champion is True else f"the champion stays: {champion}"
    print(f"registered {name} version {version} ({DEV_METRIC} {dev:.2f}), {verdict}", flush=True)
    print(f"  load it: mlflow.sentence_transformers.load_model('models:/{name}/{version}')"
          + (f"  (also models:/{name}@{registry.CHAMPION})" if champion is True else ""), flush=True)


def _corpus(config: dict) -> str:
    """The corpus a lineage is trained on: its name, and the prefix when only one was read."""
    n = int(config.get("max_sentences") or 0)
    return f"{config.get('corpus', '')}" + (f" (first {n} sentences)" if n else "")
