"""After the final evaluation: a best checkpoint exported (Hugging Face and sentence-transformers
formats, with its model card, logged to the run) and registered (``platform.tracking.model_registry``).
The export loads weights, so it runs on the run's device (``final_evaluation.on_device``)."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from platform import checkpoint, storage
from platform.console import markdown_table, short
from platform.config import TrainConfig, smoke_reason
from platform.data import SHORT_NAMES, STS_TASKS
from platform.run.final_evaluation import beside_block, device_of, on_device
from platform.tracking import model_registry, recorder
from platform.tracking.names import (BEST, BEST_STEP_TAG, CORPUS_SENTENCES_TAG, CORPUS_SHA256_TAG, DEV_METRIC, EXPORT_TAG,
                                     GIT_COMMIT_TAG, LOGGED_MODEL_TAG, METHOD_TAG, RECIPE_TAG, REGISTERED_MODEL_TAG, STEP,
                                     sts)
from platform.tracking.recorder import Run
from platform.tracking.store import git_commit, load_code, redact, ui_route


def export_model(location: str, uri: str, run_id: str, card: str, results: str, name: str = "model") -> tuple[str | None, str]:
    """(task) The checkpoint at ``location`` into run ``run_id``: ``sts_results.json``, and the
    sentence-transformers folder with ``card`` as its logged model; returns its URI (None, and
    why, when sentence-transformers cannot express the pooler: the Hugging Face folder is logged
    as ``best_checkpoint/hf`` instead)."""
    run = Run(uri, run_id)
    with storage.local_copy(location) as folder, tempfile.TemporaryDirectory() as tmp:
        state = checkpoint.read_state(folder)
        model = checkpoint.model_dir(folder)
        (Path(tmp) / "sts_results.json").write_text(results)
        run.log_file(Path(tmp) / "sts_results.json")
        try:
            st_dir = export_sentence_transformers(model, Path(tmp) / "st", state["eval_pooler"])
        except ExportUnsupported as exc:
            run.log_folder(model, "best_checkpoint/hf")
            return None, str(exc)
        (st_dir / "README.md").write_text(card, encoding="utf-8")
        config = state.get("config", {})
        return model_registry.log_encoder_model(uri, run_id, st_dir, config.get("model", ""), state["step"],
                                          params={"recipe": state["recipe"], "pooler": state["eval_pooler"]},
                                          name=name, card=card), ""


def export_and_register(run: Run, location: str, scores: dict[str, float], dev: float,
                        tags: dict[str, str] | None = None, baseline: dict[str, float] | None = None,
                        seeds: int = 1, searched: dict[str, str] | None = None) -> None:
    """The checkpoint at ``location`` into ``run`` (``export_model``, on the run's device):
    ``sts_results.json``, and the model once, as the run's logged model named for the recipe
    (sentence-transformers folder with its model card, which Hugging Face also loads); then a
    version in the Model Registry with ``scores`` and ``dev`` (means over seeds where there are
    several), ``tags`` and a sweep's ``searched`` values, described for a reader of the registry."""
    state = checkpoint.read_state_at(location)
    name = model_registry.registered_name(state["method"], state["recipe"])
    config = state.get("config", {})
    recorded = run.info().data.tags
    corpus = corpus_identity(config, recorded[CORPUS_SHA256_TAG], recorded[CORPUS_SENTENCES_TAG])
    card = model_card(state, scores, baseline, name=name, dev=dev, commit=git_commit(), seeds=seeds,
                      cites=_cites(config), smoke=smoke_reason(config.get("profile", ""), config.get("model", "")),
                      corpus=corpus)
    results = json.dumps({"scores": scores, "baseline": baseline, "pooler": state["eval_pooler"], "step": state["step"],
                          DEV_METRIC: dev, **(tags or {})}, indent=2)
    model_uri, why = on_device(export_model, location, run.uri, run.id, card, results, name, device=device_of(state))
    if model_uri is None:
        run.set_tags({EXPORT_TAG: f"skipped: {why}"})
    else:
        recorder.link_to_model(run, model_uri.split("/", 1)[1], [sts(k) for k in scores] + [BEST])
        register(run, model_uri, name, state, scores, dev, tags,
                 Registration(corpus, baseline, searched or {}, seeds))
    run.set_tags({BEST_STEP_TAG: str(state["step"])})


def _cites(config: dict) -> list[str]:
    try:
        return list(dict.fromkeys(c.cites for c in TrainConfig.from_flat(config).recipe.classes() if c.cites))
    except Exception:  # noqa: BLE001 - a card without citations beats no card
        return []


@dataclasses.dataclass
class Registration:
    """What a version's tags and description say besides its scores."""

    corpus: str = ""  # the corpus by content (``corpus_identity``)
    baseline: dict[str, float] | None = None  # the untouched backbone's 7 tasks
    searched: dict[str, str] = dataclasses.field(default_factory=dict)  # a sweep's winning values
    seeds: int = 1


def register(run: Run, model_uri: str, name: str, state: dict, scores: dict[str, float], dev: float,
             tags: dict[str, str] | None = None, about: Registration | None = None) -> None:
    """The logged model ``model_uri`` as a version of ``name``, with its description; the
    ``champion`` alias moves as ``model_registry.champion_verdict`` says."""
    about = about or Registration()
    config = state.get("config", {})
    version_tags = {RECIPE_TAG: state["recipe"], METHOD_TAG: state["method"], GIT_COMMIT_TAG: git_commit(),
                    **model_registry.lineage(config.get("model", ""), config.get("profile", ""), about.corpus),
                    STEP: str(state["step"]), **{sts(k): f"{v:.4f}" for k, v in scores.items()},
                    **{f"searched.{k}": str(v) for k, v in about.searched.items()}, **(tags or {})}
    try:
        version, champion = model_registry.register_encoder(run.uri, name, model_uri, run.id, dev, version_tags)
    except model_registry.RegistryUnavailable as exc:  # e.g. a file store: the model stays logged in the run
        run.set_tags({REGISTERED_MODEL_TAG: f"skipped: {exc}"})
        print(f"note: model logged in run {run.id}, not registered ({exc})", flush=True)
        return
    load = f"models:/{name}@{model_registry.CHAMPION}" if champion is True else f"models:/{name}/{version}"
    model_registry.describe_version(run.uri, name, version, version_description(run, name, version, state, scores, dev,
                                                                          about, load))
    run.set_tags({REGISTERED_MODEL_TAG: f"{name}/{version}"})
    run.set_tags({LOGGED_MODEL_TAG: model_uri})
    verdict = "now the champion" if champion is True else f"the champion stays: {champion}"
    print(f"registered {name} version {version} ({DEV_METRIC} {dev:.2f}), {verdict}", flush=True)
    print(f"  load it: python -c \"{load_code(run.uri, f'models:/{name}/{version}')}\""
          + (f"  (also models:/{name}@{model_registry.CHAMPION})" if champion is True else ""), flush=True)


def corpus_identity(config: dict, digest: str, read: str) -> str:
    """The corpus a lineage is trained on, by content: its file name, the sha256 of the lines read
    and how many were read (``read``: the run's ``corpus_sentences`` tag), so the same lines give
    the same lineage whatever ``max_sentences`` allowed (a limit above the file's length reads the
    whole file; the same corpus on another machine is the same lineage; no local path is recorded)."""
    return f"{Path(str(config.get('corpus', ''))).name} sha256:{digest[:16]} ({int(read)} sentences)"


def version_description(run: Run, name: str, version: str, state: dict, scores: dict[str, float], dev: float,
                        about: Registration, load: str) -> str:
    """A registered version's description (Markdown): where it comes from, what won, by how much
    against the untouched backbone, the smoke caveat, and the line that loads it."""
    config = state.get("config", {})
    info = run.info().info
    backbone = config.get("model", "?")
    spread = f" (mean of {about.seeds} seeds)" if about.seeds > 1 else ""
    lines = [f"**{name} version {version}**: the best checkpoint (step {state['step']}) of run "
             f"[{info.run_name}]({ui_route(f'#/experiments/{info.experiment_id}/runs/{run.id}')}), recipe `{state['recipe']}`, "
             f"from `{backbone}` on `{about.corpus}`."]
    if about.searched:
        lines.append("**Searched values (the sweep's winner):** "
                      + ", ".join(f"`{k}={short(v)}`" for k, v in about.searched.items()) + ".")
    lines.append(f"**STS-B dev** (Spearman x100): {dev:.2f}{spread}.")
    if about.baseline and "avg" in scores and "avg" in about.baseline:
        lines.append(f"**STS, 7 tasks (avg):** {scores['avg']:.2f}, {scores['avg'] - about.baseline['avg']:+.2f} "
                     f"against the untouched backbone ({about.baseline['avg']:.2f}):")
        lines.append(beside_block(backbone, about.baseline, scores).rstrip("\n"))
    why = smoke_reason(config.get("profile", ""), backbone)
    if why:
        lines.append(f"> **Smoke test, not a result:** {why}.")
    lines.append(f"Load it (in a new Python session):\n\n```python\nimport mlflow\n\nmlflow.set_tracking_uri({redact(run.uri)!r})\n"
                 f"model = mlflow.sentence_transformers.load_model(\"{load}\")\n```")
    return "\n\n".join(lines)


# ------------------------------------------------------------------------------------------------
# The export: a sentence-transformers folder that embeds like the encoder, and its model card
# (README.md: what it is, what it was trained from and how, its scores beside its backbone's, what
# to cite), written from the checkpoint's recorded configuration, so it says what ran.

# Our pooler -> sentence-transformers Pooling mode. 'cls' additionally needs the pooler layer as a
# Dense(d, d, tanh) module; avg_first_last has no sentence-transformers equivalent.
_ST_MODES = {"cls_before_pooler": "cls", "cls": "cls", "avg": "mean"}


class ExportUnsupported(ValueError):
    pass


def export_sentence_transformers(hf_dir: str | Path, out_dir: str | Path, pooler: str) -> Path:
    """Write a folder that ``SentenceTransformer(out_dir)`` loads and that embeds like our encoder."""
    import torch
    from sentence_transformers import SentenceTransformer, models

    if pooler not in _ST_MODES:
        raise ExportUnsupported(f"pooler {pooler!r} has no sentence-transformers equivalent")
    transformer = models.Transformer(str(hf_dir))
    dim = transformer.get_embedding_dimension()
    modules = [transformer, models.Pooling(dim, pooling_mode=_ST_MODES[pooler])]
    if pooler == "cls":
        dense = getattr(transformer.auto_model, "pooler", None)
        if dense is None:
            raise ExportUnsupported("pooler 'cls' needs the model's pooler layer, which this model lacks")
        modules.append(
            models.Dense(
                dim,
                dim,
                activation_function=torch.nn.Tanh(),
                init_weight=dense.dense.weight.detach().clone(),
                init_bias=dense.dense.bias.detach().clone(),
            )
        )
    out_dir = Path(out_dir)
    storage.check_replaceable(out_dir, "remove it or export elsewhere")
    tmp = storage.staging(out_dir)
    try:
        SentenceTransformer(modules=modules, device="cpu").save(str(tmp))
    except BaseException:
        storage.discard(tmp)
        raise
    return storage.install(tmp, out_dir, "platform export (sentence-transformers)",
                           "remove it or export elsewhere")


# Where and how it ran, not what was learned: left off the card.
OPERATIONAL = {"corpus", "output_dir", "runtime", "cpus_per_worker", "augment_cpus", "use_gpu", "num_workers", "log_steps", "checkpoint_minutes",
               "eval_batch_size", "data_pipeline", "profile"}


def non_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """The recorded configuration's values that differ from its recipe's defaults (the papers'),
    leaving out where and how it ran."""
    try:
        defaults = TrainConfig.for_recipe(config.get("method", "simcse"),
                                          {k: v for k, v in config.items() if k in ("fidelity", "positives",
                                                                                    "negatives", "loss", "aux")}).flat()
    except Exception:  # noqa: BLE001 - a card is still written, with every value
        defaults = {}
    return {k: v for k, v in config.items() if k not in OPERATIONAL and str(defaults.get(k, object())) != str(v)}


def model_card(state: dict[str, Any], scores: dict[str, float], baseline: dict[str, float] | None, *,
               name: str, dev: float, commit: str, seeds: int = 1, cites: list[str] | None = None,
               smoke: str | None = None, corpus: str = "") -> str:
    config = state.get("config", {})
    backbone, pooler = config.get("model", "?"), state.get("eval_pooler", "?")
    tasks = [t for t in (*STS_TASKS, "avg") if t in scores]
    cells = [["this model", *(f"{scores[t]:.2f}" + (f" ± {scores[t + '_std']:.2f}" if t + "_std" in scores else "")
                              for t in tasks)]]
    if baseline:
        cells += [[f"{backbone} (untouched)", *(f"{baseline[t]:.2f}" for t in tasks)],
                  ["difference", *(f"{scores[t] - baseline[t]:+.2f}" for t in tasks)]]
    rows = markdown_table(["", *(SHORT_NAMES.get(t, t) for t in tasks)], cells)
    changed = non_defaults(config)
    lines = [
        "---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity",
        f"base_model: {backbone.split('@')[0]}", "tags: [sentence-transformers, sentence-similarity, contrastive-learning]",
        "---", "", f"# {name}", "",
        f"A sentence encoder trained with **{config.get('method', '?')}** ({state.get('recipe', '')}) from "
        f"`{backbone}`, pooling `{pooler}`.", "",
    ]
    if smoke:
        lines += [f"> **Smoke test, not a result:** {smoke}.", ""]
    lines += [
        "## Training", "",
        f"- base model: `{backbone}`",
        f"- corpus: `{corpus or Path(str(config.get('corpus', '?'))).name}`",
        f"- profile: `{config.get('profile', '?')}`, fidelity: `{config.get('fidelity', 'paper')}`",
        f"- steps: {state.get('step', '?')} (best STS-B dev checkpoint), seed {config.get('seed', '?')}"
        + (f", {seeds} seeds (the table holds their mean ± std; this model is the best seed's)" if seeds > 1 else ""),
        f"- STS-B dev Spearman x100: {dev:.2f}",
        f"- code: git commit `{commit}`", "",
        "Values that differ from the recipe's defaults (the papers'):", "",
        *([f"- `{k}`: `{v}`" for k, v in sorted(changed.items())] or ["- none"]), "",
        "## Evaluation", "",
        "SentEval protocol: cosine similarity, Spearman correlation x100, STS12-16 in the \"all\" setting, "
        "STS-B and SICK-R test sets, no truncation.", "", *rows, "",
        "## Usage", "", "```python", "from sentence_transformers import SentenceTransformer", "",
        "model = SentenceTransformer(PATH)  # this folder", "embeddings = model.encode([\"A man is playing a guitar.\"])",
        "```", "", "## Citation", "",
        *([f"- {c}" for c in (cites or [])] or ["- the papers of the recipe's ingredients"]), "",
    ]
    return "\n".join(lines)
