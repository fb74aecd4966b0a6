"""Export a checkpoint's encoder for others: a sentence-transformers folder, and its model card
(``README.md``): what it is, what it was trained from and how, its scores beside its backbone's,
and what to cite, written from the checkpoint's recorded configuration, so it says what ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from platform import outputs
from platform.config import TrainConfig
from platform.data import SHORT_NAMES, STS_TASKS

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
    outputs.check_replaceable(out_dir, "remove it or export elsewhere")
    tmp = outputs.staging(out_dir)
    try:
        SentenceTransformer(modules=modules, device="cpu").save(str(tmp))
    except BaseException:
        outputs.discard(tmp)
        raise
    return outputs.install(tmp, out_dir, "platform export (sentence-transformers)",
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
    header = "| | " + " | ".join(SHORT_NAMES.get(t, t) for t in tasks) + " |"
    rows = [header, "|---" * (len(tasks) + 1) + "|",
            "| this model | " + " | ".join(f"{scores[t]:.2f}" + (f" ± {scores[t + '_std']:.2f}" if t + "_std" in scores
                                                                      else "") for t in tasks) + " |"]
    if baseline:
        rows.append(f"| {backbone} (untouched) | " + " | ".join(f"{baseline[t]:.2f}" for t in tasks) + " |")
        rows.append("| difference | " + " | ".join(f"{scores[t] - baseline[t]:+.2f}" for t in tasks) + " |")
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
