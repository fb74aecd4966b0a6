"""The Model Registry, against a real MLflow server process: a run's best checkpoint becomes a
version of ``<recipe>-encoder`` (sentence_transformers flavor), the ``champion`` alias moves only
when STS-B dev improves, and the champion loads and embeds as the project's encoder does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tests.helpers import run_main

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def registered(mlflow_server, tiny_model, small_corpus, tmp_path_factory):
    """One ``train`` run to the end: its best checkpoint exported, logged and registered."""
    from mlflow.tracking import MlflowClient

    tmp = tmp_path_factory.mktemp("registered")
    proc = run_main("train", "simcse", *[a for kv in (
        f"model={tiny_model}", f"corpus={small_corpus}", "batch_size=8", "max_steps=4", "eval_steps=2",
        "runtime=process", "num_workers=1", f"output_dir={tmp / 'runs'}") for a in ("--set", kv)],
        env={"MLFLOW_TRACKING_URI": mlflow_server})
    assert proc.returncode == 0, proc.stderr[-3000:]
    c = MlflowClient(mlflow_server)
    champion = c.get_model_version_by_alias("simcse-encoder", "champion")
    run = c.get_run(champion.run_id)
    fresh = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return SimpleNamespace(proc=proc, client=c, champion=champion, run=run, uri=mlflow_server, tmp=tmp, fresh=fresh,
                           model_uri=run.data.tags["logged_model"], sentences=["A man is playing a guitar.",
                                                                                "Two dogs run through a field of grass."])


def _our_embeddings(r) -> np.ndarray:
    """The best checkpoint's embeddings of ``r.sentences`` as the project's encoder gives them."""
    from methods.encoder import Encoder
    from platform import checkpoint

    best = r.run.data.tags["best_checkpoint"]
    pooler = checkpoint.read_state(best)["eval_pooler"]
    return Encoder.from_pretrained(str(checkpoint.model_dir(best)), pooler=pooler).encode(r.sentences).numpy()


def _card(r) -> str:
    import mlflow

    folder = mlflow.artifacts.download_artifacts(r.model_uri, dst_path=str(r.tmp / "logged"), tracking_uri=r.uri)
    return open(f"{folder}/model.sentence_transformer/README.md").read()


def test_a_run_registers_its_encoder_as_the_first_champion_with_its_scores(registered):
    r = registered
    assert "registered simcse-encoder version 1" in r.proc.stdout and "now the champion" in r.proc.stdout
    assert r.champion.version == "1" and r.run.data.tags["registered_model"] == "simcse-encoder/1"
    # The run's link opens MLflow's UI in its model-training mode; MLflow's own "View run" lines are off.
    assert (f"browse it: open {r.uri}/#/experiments/{r.run.info.experiment_id}/runs/{r.run.info.run_id}"
            "?workflowType=machine_learning in a browser") in r.proc.stdout
    assert "View run" not in r.proc.stdout + r.proc.stderr
    dev = float(r.champion.tags["stsb_dev_spearman"])
    assert dev == pytest.approx(r.run.data.metrics["best_stsb_dev_spearman"], abs=1e-4)
    assert r.champion.tags["git_commit"] == r.run.data.tags["git_commit"] != "unknown"
    assert r.champion.tags["recipe"].startswith("positives=dropout")
    assert {f"sts_{t}" for t in ("STS12", "STSBenchmark", "SICKRelatedness", "avg")} <= set(r.champion.tags)


def test_the_printed_load_line_loads_the_model_in_a_new_session(registered):
    """The load line the console prints loads the model in a new Python session from the repository
    root, whose MLflow would look in ./mlflow.db: the line names the store."""
    from tests.helpers import ROOT

    r = registered
    (code,) = re.findall(r'load it: python -c "(.+?)"', r.proc.stdout)
    loaded = subprocess.run([sys.executable, "-c", code + "; print(model.encode(['a cat']).shape)"], cwd=ROOT,
                            env=r.fresh, capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0 and "(1, 32)" in loaded.stdout, loaded.stderr[-2000:]
    assert not (ROOT / "mlflow.db").exists()  # nothing looked in MLflow's default store
    description = r.client.get_model_version("simcse-encoder", "1").description
    assert f"mlflow.set_tracking_uri({r.uri!r})" in description


def test_the_readmes_serve_line_answers_invocations(registered):
    _serve_as_the_readme_writes_it(registered.uri, registered.fresh)


def test_the_champion_embeds_as_the_encoder_and_names_what_serving_it_needs(registered):
    import mlflow

    r = registered
    mlflow.set_tracking_uri(r.uri)
    model = mlflow.sentence_transformers.load_model("models:/simcse-encoder@champion")
    np.testing.assert_allclose(model.encode(r.sentences), _our_embeddings(r), rtol=1e-4, atol=1e-5)
    # What it needs to be served elsewhere: the flavor's packages, pinned, and MLflow.
    reqs = mlflow.artifacts.download_artifacts("models:/simcse-encoder@champion/requirements.txt",
                                               dst_path=str(r.tmp / "reqs"))
    names = {line.split("==")[0] for line in open(reqs).read().split()}
    assert names == {"mlflow", "sentence-transformers", "transformers", "torch"}, names


def test_the_model_is_stored_once_as_the_runs_logged_model(registered):
    r = registered
    assert r.champion.source == r.model_uri and r.model_uri.startswith("models:/m-")
    assert [o.model_id for o in r.run.outputs.model_outputs] == [r.model_uri[len("models:/"):]]
    # Beside the model, only the run's files: its scores, their per-pair similarities (the evidence over
    # seeds and pairs), its configuration and SimCSE's Fig. 2 of it.
    assert {a.path for a in r.client.list_artifacts(r.run.info.run_id)} == {"sts_results.json", "sts_pairs.npz",
                                                                            "config.json", "plots"}
    assert {a.path for a in r.client.list_artifacts(r.run.info.run_id, "plots")} == {"plots/geometry.png"}


def test_the_run_the_card_and_the_console_set_the_model_beside_its_backbone(registered, tiny_model, small_corpus):
    """Against the untouched backbone (same pooler): on the console, on the run, in the model card."""
    from platform import checkpoint
    from platform.run.final_evaluation import baseline_sts

    r = registered
    assert "against the untouched backbone" in r.proc.stdout and "difference" in r.proc.stdout
    m = r.run.data.metrics
    assert m["vs_backbone/delta_sts_avg"] == pytest.approx(m["sts_avg"] - m["vs_backbone/baseline_sts_avg"], abs=1e-6)
    pooler = checkpoint.read_state(r.run.data.tags["best_checkpoint"])["eval_pooler"]
    assert baseline_sts(str(tiny_model), pooler)["avg"] == pytest.approx(m["vs_backbone/baseline_sts_avg"], abs=1e-9)
    assert r.run.data.tags["smoke"] == r.champion.tags["smoke"] == "true" and "smoke test" in r.proc.stdout
    card = _card(r)
    mlmodel = open(next((r.tmp / "logged").rglob("MLmodel"))).read()
    assert f"source_model_name: {tiny_model}" in mlmodel and "/tmp" not in mlmodel.replace(str(tiny_model), "")
    read = len(small_corpus.read_text().splitlines())  # 256 lines, under the local profile's max_sentences (2048)
    for field in (f"base_model: {tiny_model}", f"corpus: `{small_corpus.name} sha256:", f" ({read} sentences)`",
                  "`max_steps`: `4`", "| difference |",
                  "Gao et al. (2021), SimCSE", r.run.data.tags["git_commit"], "Smoke test, not a result"):
        assert field in card, field


def test_push_to_hub_uploads_the_loadable_folder_with_its_card(registered):
    from sentence_transformers import SentenceTransformer

    from platform.tracking import hub

    r = registered
    upload = hub.model_folder(r.uri, r.run.info.run_id, r.tmp / "hub")
    assert (upload / "README.md").read_text() == _card(r) and (upload / "modules.json").is_file()
    np.testing.assert_allclose(SentenceTransformer(str(upload), device="cpu").encode(r.sentences), _our_embeddings(r),
                               rtol=1e-4, atol=1e-5)


def test_the_champion_alias_moves_only_to_a_better_version_of_its_lineage(registered):
    """Like with like: a worse version of the same lineage does not take the alias; a better one does."""
    from platform.tracking import model_registry as registry

    r = registered
    c, champion, dev = r.client, r.champion, float(r.champion.tags["stsb_dev_spearman"])
    same = {k: champion.tags[k] for k in ("backbone", "profile", "corpus", "smoke")}
    worse, verdict = registry.register_encoder(r.uri, "simcse-encoder", r.model_uri, champion.run_id, dev - 1, same)
    assert verdict == f"better STS-B dev: {dev:.2f}"
    assert c.get_model_version_by_alias("simcse-encoder", "champion").version == "1"
    better, verdict = registry.register_encoder(r.uri, "simcse-encoder", r.model_uri, champion.run_id, dev + 1, same)
    assert verdict is True and c.get_model_version_by_alias("simcse-encoder", "champion").version == str(better)
    assert str(worse) == "2" and str(better) == "3"
    assert c.get_model_version_by_alias("simcse-encoder", registry.lineage_alias(same)).version == "3"


def test_a_corpus_is_named_by_the_lines_read_not_the_limit():
    """The lineage's corpus: the same lines read give the same label whatever ``max_sentences``
    allowed (a limit above the file's length reads the whole file), the number read in it."""
    from platform.run.export import corpus_identity

    digest = "ab" * 32
    whole = corpus_identity({"corpus": "/data/small.txt", "max_sentences": 0}, digest, "256")
    assert whole == "small.txt sha256:abababababababab (256 sentences)"
    assert corpus_identity({"corpus": "/elsewhere/small.txt", "max_sentences": 2048}, digest, "256") == whole
    assert corpus_identity({"corpus": "small.txt", "max_sentences": 100}, "cd" * 32, "100").endswith("(100 sentences)")


def test_a_smoke_model_never_takes_a_real_backbones_champion(mlflow_server, tiny_model):
    """Versions of the packaged sentence-tuned backbone (smoke) and of a plain BERT (here a tiny
    random one, trained with the paper profile) of one registered model: the smoke version's far
    better STS-B dev never moves the champion; a real version displaces a smoke champion; two real
    lineages are not ranked against each other; each lineage keeps its own best alias."""
    from mlflow.tracking import MlflowClient

    from platform.tracking import model_registry as registry

    c = MlflowClient(mlflow_server)
    run_id = c.create_run(c.create_experiment("like-with-like")).info.run_id
    source = f"runs:/{run_id}/model"
    name = "una-encoder"
    smoke = registry.lineage("minilm", "local", "wiki1m_for_simcse.first11914.txt.gz (first 11914 sentences)")
    real = registry.lineage(str(tiny_model), "paper", "wiki1m_for_simcse.txt")
    other = registry.lineage("roberta-base", "paper", "wiki1m_for_simcse.txt")
    assert smoke["smoke"] == "true" and real["smoke"] == "false" and "sentence-tuned" in smoke["smoke_note"]

    def champion():
        return c.get_model_version_by_alias(name, registry.CHAMPION).version

    v1, verdict = registry.register_encoder(mlflow_server, name, source, run_id, 83.34, smoke)
    assert verdict is True and champion() == v1  # the first version is the champion
    v2, verdict = registry.register_encoder(mlflow_server, name, source, run_id, 20.0, real)
    assert verdict is True and champion() == v2  # a real backbone's model displaces a smoke champion
    v3, verdict = registry.register_encoder(mlflow_server, name, source, run_id, 90.0, smoke)
    assert champion() == v2 and "never displaces" in verdict
    v4, verdict = registry.register_encoder(mlflow_server, name, source, run_id, 95.0, other)
    assert champion() == v2 and "another lineage" in verdict
    v5, verdict = registry.register_encoder(mlflow_server, name, source, run_id, 21.0, real)
    assert verdict is True and champion() == v5
    best = {alias: c.get_model_version_by_alias(name, registry.lineage_alias(tags)).version
            for alias, tags in (("smoke", smoke), ("real", real), ("other", other))}
    assert best == {"smoke": v3, "real": v5, "other": v4}


def test_registration_reaches_the_platforms_default_store(tiny_model, tmp_path, monkeypatch):
    """Without MLFLOW_TRACKING_URI the platform's store is its own default (a SQLite file under the
    repository), not MLflow's (./mlflow.db): the registry, resolving the logged model inside MLflow,
    must look in the same store (the README's main job failed at registration otherwise)."""
    import mlflow.tracking._tracking_service.utils as tracking_utils

    from platform.run.export import export_sentence_transformers
    from platform.tracking import model_registry as registry
    from platform.tracking.recorder import Run

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(tracking_utils, "_tracking_uri", None)  # as in a new process
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    run = Run.create(uri, "simcse", "default-store", {})
    st_dir = export_sentence_transformers(tiny_model, tmp_path / "st", "cls")
    model_uri = registry.log_encoder_model(uri, run.id, st_dir, str(tiny_model), 4)
    version, verdict = registry.register_encoder(uri, "simcse-encoder", model_uri, run.id, 50.0, {})
    assert str(version) == "1" and verdict is True
    assert not (tmp_path / "mlflow.db").exists()


def test_registered_names():
    from platform.tracking.model_registry import registered_name

    assert registered_name("una", "positives=dropout negatives=una loss=infonce aux=none") == "una-encoder"
    assert registered_name("recipe", "positives=dropout negatives=una,san loss=hince aux=vascl") == \
        "recipe-negatives-una-san-loss-hince-aux-vascl-encoder"


def _serve_as_the_readme_writes_it(uri: str, env: dict) -> None:
    """The README's ``mlflow models serve`` line with its store named, from the repository root:
    ``/invocations`` embeds a sentence at the model's width."""
    import json
    import re
    import subprocess
    import time
    import urllib.request

    from platform.run.ray_env import free_port
    from tests.helpers import ROOT, kill_group

    line = next(x for x in (ROOT / "README.md").read_text().splitlines() if "mlflow models serve" in x)
    command = re.sub(r"#.*", "", line).strip().replace("sqlite:///$PWD/mlruns/mlflow.db", uri)
    command = command.replace("una-encoder", "simcse-encoder").replace("--port 5001", f"--port {free_port()}")
    port = int(re.search(r"--port (\d+)", command).group(1))
    proc = subprocess.Popen(["bash", "-c", command], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:] if proc.poll() else "no answer"
                time.sleep(1)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=json.dumps({"inputs": ["a cat"]}).encode(),
                                         headers={"Content-Type": "application/json"})
        answer = json.loads(urllib.request.urlopen(request, timeout=60).read())
        assert len(answer["predictions"]) == 1 and len(answer["predictions"][0]) == 32, answer
    finally:
        kill_group(proc)  # the server's workers with it
        proc.wait(timeout=30)
