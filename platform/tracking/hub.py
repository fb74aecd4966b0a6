"""``--push-to-hub REPO``: a finished run's logged model (the sentence-transformers folder with its
model card) uploaded to a Hugging Face Hub model repository, which ``SentenceTransformer(REPO)``
then loads. Access is checked before anything trains (a token, not offline, a valid name); the
upload runs after the run has FINISHED, so a failed upload loses nothing: the model stays in MLflow.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from platform import settings
from platform.errors import UserError, one_line
from platform.tracking import store
from platform.tracking.names import EXPORT_TAG, GIT_COMMIT_TAG, HUB_COMMIT_TAG, HUB_REPO_TAG, LOGGED_MODEL_TAG, RECIPE_TAG

ST_FOLDER = "model.sentence_transformer"  # where MLflow's sentence_transformers flavor keeps the model


class HubError(UserError):
    """The upload failed after the run finished: one line, what is kept, exit 2."""


def check_access(repo: str, final_eval: bool) -> None:
    """Refuse, before any run starts, a push that cannot happen: no export to push (``final_eval``
    off), an invalid repository name, Hugging Face's offline mode, or no token."""
    from huggingface_hub import get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not final_eval:
        raise UserError("--push-to-hub needs final_eval=true: the model is pushed from its export")

    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        raise UserError(f"--push-to-hub {repo}: not a repository name ({str(exc).splitlines()[0]}); "
                        "give NAMESPACE/NAME, e.g. your-user/una-bert-base") from None
    if "/" not in repo:
        raise UserError(f"--push-to-hub {repo}: give NAMESPACE/NAME (your user or organisation, then the model)")
    if (settings.get(settings.HF_OFFLINE[0]) or "").upper() in ("1", "ON", "YES", "TRUE"):  # as huggingface_hub reads it
        raise UserError(f"--push-to-hub {repo}: HF_HUB_OFFLINE is set; unset it to push")
    if not get_token():
        raise UserError(f"--push-to-hub {repo}: no Hugging Face token; run `hf auth login` or set HF_TOKEN "
                        "(a token with write access)")


def model_folder(uri: str, run_id: str, dst: Path) -> Path:
    """The run's logged sentence-transformers model, downloaded under ``dst``: the folder that goes up."""
    import mlflow.artifacts

    run = store.client(uri).get_run(run_id)
    logged = run.data.tags.get(LOGGED_MODEL_TAG)
    if not logged:
        why = run.data.tags.get(EXPORT_TAG, "it logged no model")
        raise HubError(f"--push-to-hub: run {run.info.run_name} has no sentence-transformers model to push ({why})")
    folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=logged, dst_path=str(dst), tracking_uri=uri))
    return folder / ST_FOLDER


def push(uri: str, run_id: str, repo: str) -> str:
    """Upload the run's logged model to ``repo`` (created if it does not exist); tags the run with
    the repository and commit. Returns the repository's URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    run = store.client(uri).get_run(run_id)
    print(f"pushing the model of run {run.info.run_name} to the Hugging Face Hub: {repo} ...", flush=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = model_folder(uri, run_id, Path(tmp))
            api = HfApi()
            url = api.create_repo(repo, repo_type="model", exist_ok=True)
            commit = api.upload_folder(repo_id=repo, folder_path=str(folder), repo_type="model",
                                       commit_message=f"{run.info.run_name}: {run.data.tags.get(RECIPE_TAG, '')}".strip(),
                                       commit_description=f"MLflow run {run_id}, git commit {run.data.tags.get(GIT_COMMIT_TAG, '')}")
    except (HfHubHTTPError, OSError) as exc:
        raise HubError(f"--push-to-hub {repo}: the upload failed ({one_line(exc, 200)}); the model "
                       f"stays in MLflow as {run.data.tags.get(LOGGED_MODEL_TAG)}") from None
    store.client(uri).set_tag(run_id, HUB_REPO_TAG, str(url))
    store.client(uri).set_tag(run_id, HUB_COMMIT_TAG, commit.oid)
    print(f"  pushed: {url} (commit {commit.oid[:10]}); load it: SentenceTransformer({repo!r})", flush=True)
    return str(url)
