"""A Matryoshka run end to end (the process runtime, a real MLflow store): ``train`` with
``matryoshka_dims`` logs the STS table at every trained prefix beside the whole vector's, each equal
to cutting and renormalising the checkpoint's embeddings by hand; ``evaluate`` shows them and
scores any prefix (``--dim``); ``compare`` measures a prefix against the whole (``REF:dim=M``);
bad input in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from scipy.stats import spearmanr

from platform.data import STS_TASKS
from tests.helpers import assert_user_error, run_main, sets

pytestmark = pytest.mark.e2e
PREFIXES = (16, 8)


@pytest.fixture(scope="module")
def trained(tiny_model, small_corpus, tmp_path_factory, _empty_mlflow_db):
    from tests.helpers import new_mlflow_db

    out = tmp_path_factory.mktemp("matryoshka")
    uri = new_mlflow_db(_empty_mlflow_db, out / "mlflow.db")
    env = {"MLFLOW_TRACKING_URI": uri}
    proc = run_main("train", "simcse", "--seeds", "2", *sets(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=4,
                                             eval_steps=2, runtime="process", num_workers=1, output_dir=out / "runs",
                                             lr=1e-3, pooler="avg", matryoshka_dims="32,16,8"), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    c = MlflowClient(uri)
    found = c.search_runs([c.get_experiment_by_name("simcse").experiment_id])
    (run,) = [r for r in found if "seed" not in r.data.tags]
    seeds = {int(r.data.tags["seed"]): r for r in found if "seed" in r.data.tags}
    return {"proc": proc, "run": run, "best": seeds[int(run.data.tags["best_seed"])], "seeds": seeds, "env": env,
            "client": c, "out": out}


def _cut_by_hand(checkpoint: str, sts_tests) -> dict[int, dict[str, np.ndarray]]:
    """At each prefix, each task's pair cosines from the checkpoint's whole embeddings cut to it and
    L2-normalised here (the distinct sentences embedded in one call, as the evaluation does)."""
    from methods.encoder import Encoder
    from platform import checkpoint as ckpt

    state = ckpt.read_state(checkpoint)
    encoder = Encoder.from_pretrained(str(ckpt.model_dir(checkpoint)), pooler=state["eval_pooler"])
    sentences = list(dict.fromkeys(s for task in STS_TASKS for s in sts_tests[task].sent1 + sts_tests[task].sent2))
    row = {s: i for i, s in enumerate(sentences)}
    whole = encoder.encode(sentences).numpy().astype(np.float64)
    out = {}
    for dims in PREFIXES:
        cut = whole[:, :dims] / np.linalg.norm(whole[:, :dims], axis=1, keepdims=True)
        out[dims] = {t: (cut[[row[s] for s in sts_tests[t].sent1]] * cut[[row[s] for s in sts_tests[t].sent2]]).sum(1)
                     for t in STS_TASKS}
    return out


def test_the_final_evaluation_scores_every_trained_prefix_as_cut_by_hand(trained, sts_tests):
    """The checkpoint's scoring (``score_checkpoint``, here) at each prefix: each pair's similarity is
    the cosine of the embeddings cut and renormalised by hand, each score the Spearman of those with
    the gold scores, and the run logged the same table and kept the similarities."""
    from platform.run.final_evaluation import score_checkpoint, sts_test_pairs

    metrics, best = trained["best"].data.metrics, trained["best"].data.tags["best_checkpoint"]
    cut = _cut_by_hand(best, sts_tests)
    scored, similarities = score_checkpoint(best, sts_test_pairs())
    for dims in PREFIXES:
        for task in STS_TASKS:
            sims = similarities[f"{task}_dim{dims}"]
            assert np.abs(sims - cut[dims][task]).max() < 1e-12, (dims, task)
            rho = 100 * spearmanr(sims, sts_tests[task].scores).statistic
            assert scored[f"dim{dims}/sts_{task}"] == pytest.approx(rho, abs=1e-9)
            assert metrics[f"dim{dims}/sts_{task}"] == pytest.approx(scored[f"dim{dims}/sts_{task}"], abs=1e-6)
        assert scored[f"dim{dims}/sts_avg"] == pytest.approx(np.mean([scored[f"dim{dims}/sts_{t}"] for t in STS_TASKS]))
        assert f"the first {dims} dimensions of its embedding (Matryoshka)" in trained["proc"].stdout
    assert "dim32/sts_avg" not in metrics  # the whole vector is the run's own table
    # The configuration's run: each prefix's mean and spread over its seeds.
    means = trained["run"].data.metrics
    for dims in PREFIXES:
        at = [r.data.metrics[f"dim{dims}/sts_avg"] for r in trained["seeds"].values()]
        assert means[f"dim{dims}/sts_avg"] == pytest.approx(np.mean(at))
        assert means[f"dim{dims}/sts_avg_std"] == pytest.approx(np.std(at, ddof=1))
    pairs = trained["client"].download_artifacts(trained["best"].info.run_id, "sts_pairs.npz", str(trained["out"]))
    with np.load(pairs) as found:
        assert {f"STS12_dim{d}" for d in PREFIXES} | set(STS_TASKS) <= set(found.files)


def test_evaluate_shows_the_prefixes_and_scores_any_one(trained, tmp_path):
    metrics, best = trained["best"].data.metrics, trained["run"].data.tags["best_checkpoint"]
    shown = run_main("evaluate", best, env=trained["env"])
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "its first 16 dimensions (Matryoshka):" in shown.stdout and "its first 8 dimensions" in shown.stdout
    at = run_main("evaluate", best, "--dim", "8", "--json", str(tmp_path / "at8.json"), env=trained["env"])
    assert at.returncode == 0, at.stderr[-3000:]
    scores = json.loads((tmp_path / "at8.json").read_text())["scores"]
    assert scores["avg"] == pytest.approx(metrics["dim8/sts_avg"], abs=1e-3)
    assert "(its first 8 dimensions)" in at.stdout
    assert json.loads((tmp_path / "at8.json").read_text())["supervision"] == "unsupervised"
    # Logged on the run: the STS table at a prefix it was not trained at; a trained one is left as its
    # final evaluation logged it.
    seed = trained["best"].info.run_id
    for dims in (4, 8):
        logged = run_main("evaluate", best, "--dim", str(dims), "--log-to", seed, "--json", str(tmp_path / f"{dims}.json"),
                          env=trained["env"])
        assert logged.returncode == 0, logged.stderr[-3000:]
    client = MlflowClient(trained["env"]["MLFLOW_TRACKING_URI"])
    at4 = json.loads((tmp_path / "4.json").read_text())["scores"]
    assert {t: client.get_run(seed).data.metrics[f"dim4/sts_{t}"] for t in [*STS_TASKS, "avg"]} == pytest.approx(
        {t: at4[t] for t in [*STS_TASKS, "avg"]}, abs=1e-9)
    assert [m.value for m in client.get_metric_history(seed, "dim8/sts_avg")] == [metrics["dim8/sts_avg"]]
    assert_user_error(run_main("evaluate", best, "--dim", "64", env=trained["env"]), "--dim 64", "the embedding has 32")
    assert_user_error(run_main("evaluate", best, "--dim", "0", env=trained["env"]), "--dim must be >= 1")


def test_compare_measures_a_prefix_against_the_whole_vector(trained, tmp_path):
    """Over the run's two seeds (paired by seed, from the scores each logged at the prefix), and as one
    checkpoint embedded at the prefix against itself whole (over the test pairs)."""
    import pandas as pd

    ref = f"runs:/{trained['run'].info.run_id}"
    proc = run_main("compare", ref, f"{ref}:dim=8", "--no-log", "--out", str(tmp_path), env=trained["env"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    avg = pd.read_csv(tmp_path / "comparison.csv").set_index("task").loc["avg"]
    means = trained["run"].data.metrics
    assert avg["other"].endswith("(first 8 dims)") and avg["n"] == 2
    assert avg["delta"] == pytest.approx(means["dim8/sts_avg"] - means["sts_avg"])
    best = trained["run"].data.tags["best_checkpoint"]
    one = run_main("compare", best, f"{best}:dim=8", "--resamples", "200", "--no-log", "--out", str(tmp_path),
                   env=trained["env"])
    assert one.returncode == 0, one.stderr[-3000:]
    avg = pd.read_csv(tmp_path / "comparison.csv").set_index("task").loc["avg"]
    seed = trained["best"].data.metrics
    assert avg["delta"] == pytest.approx(seed["dim8/sts_avg"] - seed["sts_avg"], abs=1e-2)  # embedded again here
    assert_user_error(run_main("compare", ref, f"{ref}:dim=x", "--no-log", env=trained["env"]), ":dim=M takes a whole")


def test_the_report_shows_each_prefixs_average_beside_the_whole_vectors(trained):
    metrics = trained["run"].data.metrics
    proc = run_main("report", "--experiment", "simcse", "--no-log", env=trained["env"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    section = proc.stdout.split("Matryoshka prefixes", 1)[1]
    assert "| whole | 16 dims | 8 dims |" in section, section[:1500]
    cells = [f"{metrics[k]:.2f} ± {metrics[k + '_std']:.2f}" for k in ("sts_avg", "dim16/sts_avg", "dim8/sts_avg")]
    assert "| " + " | ".join(cells) + " |" in section, section[:1500]


def test_a_prefix_beyond_the_backbone_is_refused_before_training(tiny_model, small_corpus, tmp_path, mlflow_uri):
    proc = run_main("train", "simcse", *sets(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=2,
                                             runtime="process", num_workers=1, output_dir=tmp_path / "runs",
                                             pooler="avg", matryoshka_dims="64,8"), env={"MLFLOW_TRACKING_URI": mlflow_uri})
    assert_user_error(proc, "beyond the 32 dimensions")
    refused = run_main("train", "simcse", *sets(model=tiny_model, corpus=small_corpus, matryoshka_dims="16,8"),
                       env={"MLFLOW_TRACKING_URI": mlflow_uri})
    assert_user_error(refused, "mlp_only_train=true")


def test_evaluate_labels_a_teacher_assisted_checkpoint(tmp_path):
    """The label comes from the checkpoint's recipe (its configuration), as the run's tag does."""
    from platform.config import TrainConfig
    from platform.evaluate import supervision_of

    cfg = TrainConfig.build("simcse", "local", {"pooler": "avg"})
    for extra, want in (({}, "unsupervised"), ({"aux": "rank_distill"}, "teacher-assisted (minilm)")):
        folder = tmp_path / (extra.get("aux") or "plain")
        (folder / "model").mkdir(parents=True)
        (folder / "state.json").write_text(json.dumps({"eval_pooler": "avg", "step": 1,
                                                       "config": {**cfg.flat(), **extra}}))
        assert supervision_of(str(folder)) == want
    assert supervision_of(str(tmp_path)) == "unknown"
