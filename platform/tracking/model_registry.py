"""The Model Registry: every run's best checkpoint becomes a version of ``<recipe>-encoder``
(MLflow's ``sentence_transformers`` flavor). Versions carry their lineage (backbone, profile,
corpus, and whether they are a smoke test), and STS-B dev is compared only like with like:

- ``best-<profile>-<backbone>-<digest>``: the best version of one lineage;
- ``champion``: moves to a version when there is none yet, when it beats the champion of its own
  lineage, or when the champion is a smoke test and it is not. A smoke version never displaces a
  model trained from a real backbone, and versions of different real lineages are not ranked
  against each other (the champion stays; each keeps its ``best-...`` alias)."""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import time
from pathlib import Path

from platform.config import smoke_reason
from platform.errors import one_line
from platform.tracking import store
from platform.tracking.names import DEV_METRIC, MODEL_VERSIONS_TAG, NOTE_TAG

CHAMPION = "champion"
# Markdown: the alias patterns in code spans, or the UI's renderer takes <profile> for an HTML tag.
REGISTERED_DESCRIPTION = ("Sentence encoders trained by the contrastive sentence-embedding platform. Alias "
                          "`champion`: the best STS-B dev among comparable versions (a smoke test never displaces a "
                          "real backbone's model); `best-<profile>-<backbone>-<id>`: the best of one lineage. Each "
                          "version's description says what won, by how much, and how to load it.")
INPUT_EXAMPLE = ["A man is playing a guitar.", "A woman is slicing a tomato."]


class RegistryUnavailable(Exception):
    """The tracking store has no Model Registry (a ``file:`` store)."""


def registered_name(method: str, recipe: str) -> str:
    """``<recipe>-encoder``: the paper's name for a named recipe (``una-encoder``), else the
    ingredients (``recipe-negatives-una-san-loss-hince-aux-vascl-encoder``)."""
    if method != "recipe":
        return f"{method}-encoder"
    parts = [p for p in recipe.split() if not p.endswith(("=none", "=dropout"))]
    return "recipe-" + re.sub(r"[^A-Za-z0-9]+", "-", " ".join(parts)).strip("-") + "-encoder"


def log_encoder_model(uri: str, run_id: str, st_dir: Path, base_model: str, step: int,
                      params: dict[str, str] | None = None, name: str = "model", card: str = "") -> str:
    """The exported encoder as the run's logged model ``name`` (MLflow's ``sentence_transformers``
    flavor, signature and input example included): listed under the run's "Logged models", linked
    from the registry's versions, its model ``card`` as its description and as ``README.md`` at the
    top of its artifacts. Returns its ``models:/<model_id>`` URI. The flavor's own requirements are
    listed: inferring them loads the model in a new interpreter (~11 s). ``base_model`` is what the
    flavor records as the source model (else the temporary folder it was saved from)."""
    import mlflow.sentence_transformers
    from mlflow.entities import LoggedModelOutput
    from mlflow.models import Model, infer_signature
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Transformer

    model = SentenceTransformer(str(st_dir), device="cpu")
    for module in model.modules():
        if isinstance(module, Transformer):
            module.auto_model.name_or_path = base_model
            module.auto_model.config._name_or_path = base_model
    signature = infer_signature(INPUT_EXAMPLE, model.encode(INPUT_EXAMPLE))
    c = store.client(uri)
    logged = c.create_logged_model(c.get_run(run_id).info.experiment_id, name=name, source_run_id=run_id,
                                   params=params, model_type="sentence-encoder",
                                   tags={NOTE_TAG: without_front_matter(card)} if card else None)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            mlflow.sentence_transformers.save_model(
                model, str(path), signature=signature, input_example=INPUT_EXAMPLE,
                mlflow_model=Model(run_id=run_id, artifact_path=name, model_id=logged.model_id),
                pip_requirements=mlflow.sentence_transformers.get_default_pip_requirements())
            if card:
                (path / "README.md").write_text(card, encoding="utf-8")
            c.log_model_artifacts(logged.model_id, str(path))
    except BaseException:
        c.finalize_logged_model(logged.model_id, "FAILED")
        raise
    c.finalize_logged_model(logged.model_id, "READY")
    c.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step)])
    return f"models:/{logged.model_id}"


def without_front_matter(card: str) -> str:
    """A model card's Markdown without its YAML header (MLflow's UI would print it as text)."""
    if card.startswith("---\n"):
        end = card.find("\n---\n", 4)
        if end >= 0:
            return card[end + 5:].lstrip("\n")
    return card


LINEAGE = ("backbone", "profile", "corpus")


def lineage(backbone: str, profile: str, corpus: str) -> dict[str, str]:
    """A version's lineage tags: what its STS-B dev may be compared with."""
    why = smoke_reason(profile, backbone)
    return {"backbone": backbone, "profile": profile, "corpus": corpus, "smoke": "true" if why else "false",
            **({"smoke_note": f"smoke test, not a result: {why}"} if why else {})}


def lineage_alias(tags: dict[str, str]) -> str:
    """``best-<profile>-<backbone>-<digest of the lineage>`` (an alias MLflow accepts)."""
    digest = hashlib.sha256("|".join(tags.get(k, "") for k in LINEAGE).encode()).hexdigest()[:8]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{tags.get('profile', '')}-{tags.get('backbone', '').split('@')[0]}")
    return f"best-{slug.strip('-')[:40]}-{digest}"


def _same_lineage(a: dict[str, str], b: dict[str, str]) -> bool:
    return all(a.get(k) == b.get(k) for k in LINEAGE)


def _version_by_alias(c, name: str, alias: str):
    from mlflow.exceptions import MlflowException

    try:
        return c.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def champion_verdict(new: dict[str, str], dev: float, champion) -> bool | str:
    """True if a version with tags ``new`` and STS-B dev ``dev`` takes the champion alias from
    ``champion`` (an MLflow model version, or None); else why not."""
    if champion is None:
        return True
    old = champion.tags
    best = float(old.get(DEV_METRIC, "-inf"))
    if new.get("smoke") == "true" and old.get("smoke") != "true":
        return f"version {champion.version} was trained from a real backbone; a smoke test never displaces it"
    if old.get("smoke") == "true" and new.get("smoke") != "true":
        return True
    if not _same_lineage(new, old):
        return (f"version {champion.version} has another lineage ({old.get('backbone')}, profile "
                f"{old.get('profile')}, corpus {old.get('corpus')}): not compared")
    return True if dev > best else f"better STS-B dev: {best:.2f}"


def register_encoder(uri: str, name: str, model_uri: str, run_id: str, dev: float,
                     tags: dict[str, str]) -> tuple[str, bool | str]:
    """A new version of ``name`` with ``tags`` (its lineage among them). Its lineage's ``best-...``
    alias moves to it when it beats that lineage's best; ``champion`` as ``champion_verdict``
    says. Returns (version, True if it became champion, else why not)."""
    from mlflow.exceptions import MlflowException

    c = store.client(uri)
    try:
        c.get_registered_model(name)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            raise RegistryUnavailable(one_line(exc, 200)) from None
        c.create_registered_model(name, description=REGISTERED_DESCRIPTION)
    model_id = model_uri.split("/", 1)[1] if model_uri.startswith("models:/") else None
    version = c.create_model_version(name, model_uri, run_id=run_id, model_id=model_id,
                                     tags={**tags, DEV_METRIC: f"{dev:.6f}"}).version
    _wait_ready(c, name, version)
    if model_id:  # the logged model lists its versions, as mlflow.register_model records them
        listed = json.loads(c.get_logged_model(model_id).tags.get(MODEL_VERSIONS_TAG, "[]"))
        c.set_logged_model_tags(model_id, {MODEL_VERSIONS_TAG: json.dumps([*listed, {"name": name, "version": version}])})
    if all(k in tags for k in LINEAGE):
        alias = lineage_alias(tags)
        best = _version_by_alias(c, name, alias)
        if best is None or dev > float(best.tags.get(DEV_METRIC, "-inf")):
            c.set_registered_model_alias(name, alias, version)
    verdict = champion_verdict(tags, dev, _version_by_alias(c, name, CHAMPION))
    if verdict is True:
        c.set_registered_model_alias(name, CHAMPION, version)
    return version, verdict


def describe_version(uri: str, name: str, version: str, description: str) -> None:
    store.client(uri).update_model_version(name, version, description=description)


def _wait_ready(c, name: str, version: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while c.get_model_version(name, version).status == "PENDING_REGISTRATION" and time.monotonic() < deadline:
        time.sleep(0.5)
