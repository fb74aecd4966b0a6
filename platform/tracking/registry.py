"""The Model Registry: every run's best checkpoint becomes a version of ``<recipe>-encoder``
(MLflow's ``sentence_transformers`` flavor), and the ``champion`` alias moves to a version only
when its STS-B dev beats the champion's."""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

from platform.tracking import store

CHAMPION = "champion"
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


def log_encoder_model(uri: str, run_id: str, st_dir: Path, artifact_path: str = "model") -> str:
    """The exported encoder as an MLflow model of the ``sentence_transformers`` flavor (signature
    and input example included) in the run's artifacts; returns its ``runs:/`` URI. The flavor's
    own requirements are listed: inferring them loads the model in a new interpreter (~11 s)."""
    import mlflow.sentence_transformers
    from mlflow.models import infer_signature
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(st_dir), device="cpu")
    signature = infer_signature(INPUT_EXAMPLE, model.encode(INPUT_EXAMPLE))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / artifact_path
        mlflow.sentence_transformers.save_model(
            model, str(path), signature=signature, input_example=INPUT_EXAMPLE,
            pip_requirements=mlflow.sentence_transformers.get_default_pip_requirements())
        store.client(uri).log_artifacts(run_id, str(path), artifact_path)
    return f"runs:/{run_id}/{artifact_path}"


def register_encoder(uri: str, name: str, model_uri: str, run_id: str, dev: float, tags: dict[str, str]) -> tuple[str, bool]:
    """A new version of ``name`` with ``tags``; the ``champion`` alias moves to it only when its
    STS-B dev beats the current champion's. Returns (version, whether it became champion)."""
    from mlflow.exceptions import MlflowException

    c = store.client(uri)
    try:
        c.get_registered_model(name)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            raise RegistryUnavailable(" ".join(str(exc).split())[:200]) from None
        c.create_registered_model(name, description="Sentence encoders trained by the platform; "
                                                    "alias 'champion' = best STS-B dev so far.")
    version = c.create_model_version(name, model_uri, run_id=run_id,
                                     tags={**tags, "stsb_dev_spearman": f"{dev:.6f}"}).version
    _wait_ready(c, name, version)
    try:
        current = c.get_model_version_by_alias(name, CHAMPION)
        best = float(current.tags.get("stsb_dev_spearman", "-inf"))
    except MlflowException:
        best = float("-inf")
    promoted = dev > best
    if promoted:
        c.set_registered_model_alias(name, CHAMPION, version)
    return version, promoted


def _wait_ready(c, name: str, version: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while c.get_model_version(name, version).status == "PENDING_REGISTRATION" and time.monotonic() < deadline:
        time.sleep(0.5)
