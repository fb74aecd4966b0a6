"""``python -m platform.report [--experiment NAME ...] [--out DIR] [--no-log]``: the methods side by side.

Reads one or more MLflow experiments (default: all of them) and writes, as Markdown, CSV and PNG,
one row per recipe: its best result (a training run, a run with seeds, or a sweep; the best by
STS-B dev, never by the test tasks), with the 7 STS tasks and their average (mean +- std where the
run has seeds), the transfer and clustering scores where ``platform.evaluate --log-to`` recorded
them, its wall time and GPU-hours. The papers' published numbers follow as reference rows where
a run's backbone is the one they report. The report is logged as a run of the ``reports``
experiment as well.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

from methods.published import BEST_OF, PUBLISHED, TASK_COLUMNS
from methods.recipe import NAMED
from platform import storage
from platform.config import smoke_reason
from platform.console import command_parser, markdown_table, pyplot
from platform.data import STS_TASKS
from platform.errors import UserError, cli_main, writable_dir
from platform.evaluation import significance, uncertainty
from platform.evaluation.sts import geometry_figure
from platform.run.final_evaluation import geometry_trajectories
from platform.tracking import store
from platform.tracking.names import (BEST, WINNER_RUN_ID_TAG, BEST_SEED_TAG, METHOD_TAG, MODEL_TAG,
                                     PARENT_TAG, PROFILE_TAG, RECIPE_TAG, SEEDS_TAG, SEED_TAG, STS_AVG, SWEEP_TAG, run_setting, sts,
                                     supervision_note, vs_backbone)
from platform.tracking.names import prefix_of, sts_at, trial_key
from platform.tracking.recorder import Run

REPORTS_EXPERIMENT = "reports"


def seed_scores(uri: str, run) -> dict[int, float]:
    """``seed -> 7-task average`` of a result's seeds (a sweep's: its winning trial's), by seed."""
    winner = run.data.tags.get(WINNER_RUN_ID_TAG)
    result = store.client(uri).get_run(winner) if winner else run
    return {int(leaf.data.tags.get(SEED_TAG, leaf.data.params.get("seed", i))): leaf.data.metrics[STS_AVG]
            for i, leaf in enumerate(leaf_runs(uri, result)) if STS_AVG in leaf.data.metrics}


def experiments(uri: str, names: list[str] | None = None) -> list:
    """The named experiments (all but MLflow's ``Default`` when none are named); an unknown name
    is a user error that lists the ones there are."""
    found = {e.name: e for e in store.client(uri).search_experiments()}
    if not names:
        return [e for n, e in sorted(found.items()) if n not in ("Default",)]
    missing = [n for n in names if n not in found]
    if missing:
        raise UserError(f"no MLflow experiment named {', '.join(map(repr, missing))} in {store.redact(uri)}; "
                        f"there are: {', '.join(sorted(found)) or 'none'}")
    return [found[n] for n in names]


def result_runs(uri: str, experiment_ids: list[str]) -> list:
    """Finished top-level runs (a training run, a run with seeds, a sweep) that hold a 7-task
    table: their nested seed and trial runs are parts of them, not results of their own."""
    runs = store.client(uri).search_runs(experiment_ids, filter_string="attributes.status = 'FINISHED'", max_results=5000)
    return [r for r in runs if PARENT_TAG not in r.data.tags and STS_AVG in result_metrics(r)]


def result_metrics(run) -> dict[str, float]:
    """A result's numbers under the trials' keys: a sweep's are its best trial's, ``best.*`` on its parent."""
    return {**run.data.metrics, **{trial_key(k): v for k, v in run.data.metrics.items() if trial_key(k)}}


def leaf_runs(uri: str, run) -> list:
    """The runs under ``run`` that trained (no runs nested under them), ``run`` itself if none:
    what its compute time is the sum of."""
    children = store.child_runs(uri, run.info.run_id)
    if not children:
        return [run]
    return [leaf for child in children for leaf in leaf_runs(uri, child)]


def log_report(uri: str, name: str, tags: dict[str, str], frame, files: list[Path]) -> str:
    """The report as its own run of the ``reports`` experiment: the table and its files."""
    run = Run.create(uri, REPORTS_EXPERIMENT, name, tags)
    with run.closing():
        run.log_table(frame, "report.json")
        for path in files:
            run.log_file(path)
        run.complete(None, needs_checkpoint=False)
    return run.id


def recipe_name(run) -> str:
    """A paper's name for its own recipe; the ingredients for a combination or a changed recipe;
    a teacher-assisted one says so (``[teacher-assisted (MODEL)]``), so that it is never read as
    one more unsupervised row."""
    method, recipe = run.data.tags.get(METHOD_TAG, "?"), run.data.tags.get(RECIPE_TAG, "")
    if method in NAMED:
        named = NAMED[method]
        own = {named.resolve(f).describe() for f in ("paper", "authors_code")}
        name = method if not recipe or recipe in own else f"{method}: {recipe}"
    else:
        name = recipe or method
    return name + supervision_note(run.data.tags)


def backbone(run) -> str:
    """The backbone's name: a local folder's last part, a hub model's name without its pinned revision."""
    model = run.data.tags.get(MODEL_TAG) or run.data.params.get("model", "?")
    if "/" in model and Path(model).exists():
        return Path(model).name
    return model.rpartition("@")[0] or model


def best_per_recipe(runs) -> list:
    """The result with the best STS-B dev for each recipe and backbone (ties: the newest)."""
    best: dict[tuple[str, str], object] = {}
    for run in runs:
        key = (recipe_name(run), backbone(run))
        dev = result_metrics(run).get(BEST, -math.inf)
        held = best.get(key)
        if held is None or (dev, run.info.start_time) > (result_metrics(held).get(BEST, -math.inf),
                                                         held.info.start_time):
            best[key] = run
    return sorted(best.values(), key=lambda r: (recipe_name(r), backbone(r)))


def row_of(uri: str, run) -> dict:
    """A result's numbers: means under the column names, spreads under ``<column> std``."""
    m = result_metrics(run)
    row = {"recipe": recipe_name(run), "backbone": backbone(run), "seeds": int(run.data.tags.get(SEEDS_TAG, 1)),
           "kind": "sweep" if run.data.tags.get(SWEEP_TAG) == "true" else "run"}
    for task, column in zip([*STS_TASKS, "avg"], TASK_COLUMNS):
        row[column] = m.get(sts(task))
        if sts(task) + "_std" in m:
            row[f"{column} std"] = m[sts(task) + "_std"]
    row["seed averages"] = seed_scores(uri, run)  # what the uncertainty sections resample
    if (row["recipe"], row["backbone"]) in BEST_OF:  # the paper's number is a maximum: so is this one
        per_seed = list(row["seed averages"].values())
        row["Avg. max"], row["max of seeds"] = (max(per_seed), len(per_seed)) if per_seed else (None, 0)
    row["smoke"] = smoke_reason(run.data.tags.get(PROFILE_TAG) or run.data.params.get("profile", ""),
                                run.data.tags.get(MODEL_TAG) or run.data.params.get("model", ""))
    # The untouched backbone with the same pooler, as the run's final evaluation scored it.
    row["baseline"] = {column: m[vs_backbone(task, "baseline")] for task, column in zip([*STS_TASKS, "avg"], TASK_COLUMNS)
                       if vs_backbone(task, "baseline") in m} or None
    row["STS-B dev"] = m.get(BEST)
    if BEST + "_std" in m:
        row["STS-B dev std"] = m[BEST + "_std"]
    for key in sorted(m):
        if key.startswith(("transfer_", "cluster_", "mteb_")):
            row[key] = m[key]
        elif prefix_of(key) and key == sts_at("avg", prefix_of(key)):  # a Matryoshka prefix's average, its seeds' spread
            row[key] = m[key]
            if key + "_std" in m:
                row[f"{key} std"] = m[key + "_std"]
    row["wall time (min)"] = _seconds(run) / 60
    row["GPU-hours"] = sum(_gpu_hours(leaf) for leaf in leaf_runs(uri, run))
    # A sweep's nodes (Ray's node table): what the cluster ran for it, and how much of the GPU time
    # it offered no training used (boot, idle timeout, evaluation, trials starting and stopping).
    row["node-hours"] = m.get("billed_node_hours", m.get("node_hours"))  # AWS's bill where recorded
    offered = m.get("gpu_hours_offered") or 0
    row["GPU idle share"] = max(0.0, 1 - row["GPU-hours"] / offered) if offered else None
    row["run_id"] = run.info.run_id
    row["experiment_id"] = run.info.experiment_id
    return row


def _seconds(run) -> float:
    return ((run.info.end_time or run.info.start_time) - run.info.start_time) / 1000


def _gpu_hours(run) -> float:
    """Its run time times its GPU workers, from the ``run.*`` tags of where and how it ran."""
    if run.data.tags.get(run_setting("use_gpu")) not in ("True", "true", "1"):
        return 0.0
    return _seconds(run) / 3600 * int(run.data.tags.get(run_setting("num_workers")) or 1)


def reference_rows(frame) -> list[dict]:
    """The published rows for the (method, backbone) pairs present; SimCSE's as the baseline of any backbone."""
    present = set(zip(frame["recipe"], frame["backbone"]))
    backbones = {b for _, b in present}
    rows = []
    for method, model, label, scores, *_ in PUBLISHED:
        if model in backbones and ((method, model) in present or method == "simcse"):
            rows.append({"recipe": label, "backbone": model, **scores})
    return rows


def build(uri: str, names: list[str] | None):
    import pandas as pd

    chosen = experiments(uri, names)
    chosen = [e for e in chosen if e.name != REPORTS_EXPERIMENT]
    runs = result_runs(uri, [e.experiment_id for e in chosen]) if chosen else []
    if not runs:
        raise UserError(f"no finished run with a 7-task STS table in experiment(s) "
                        f"{', '.join(e.name for e in chosen) or '(none)'} of {store.redact(uri)}")
    frame = pd.DataFrame([row_of(uri, r) for r in best_per_recipe(runs)])
    return frame, [e.name for e in chosen]


def _cell(row: dict, column: str) -> str:
    value = row.get(column)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    std = row.get(f"{column} std")
    if std is not None and not (isinstance(std, float) and math.isnan(std)):
        return f"{value:.2f} ± {std:.2f}"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def markdown(frame, references: list[dict], experiments: list[str], published: bool = False,
             all_pairs: bool = False) -> str:
    extra = [c for c in frame.columns if c.startswith(("transfer_", "cluster_"))]
    maxima = "Avg. max" in frame.columns and frame["Avg. max"].notna().any()
    columns = ["recipe", "backbone", "seeds", *TASK_COLUMNS, *(["Avg. max"] if maxima else []), "STS-B dev", *extra,
               "wall time (min)", "GPU-hours", *(["node-hours", "GPU idle share"] if frame.get("node-hours") is not None
                                                  and frame["node-hours"].notna().any() else [])]
    lines = [f"# Side by side: {', '.join(experiments)}", "",
             "Spearman x100 of cosine similarities, SentEval 'all' setting; each recipe's best result by STS-B dev "
             "(mean ± std over seeds where it has several). Transfer: accuracy; clustering: K-means accuracy.", ""]
    rows, untouched = frame.to_dict("records"), {}
    for r in rows:  # each backbone untouched, once, under the rows trained from it
        if isinstance(r.get("baseline"), dict):
            untouched.setdefault(r["backbone"], {"recipe": "untouched backbone", "backbone": r["backbone"], **r["baseline"]})
    lines += markdown_table(columns, [[_cell(r, c) for c in columns] for r in [*rows, *untouched.values()]])
    smoke = sorted({f"{r['recipe']} ({r['backbone']}): {r['smoke']}" for r in rows if isinstance(r.get("smoke"), str)})
    if smoke:
        lines += ["", "**Smoke tests, not results**: " + "; ".join(smoke) + ". Their scores say the pipeline runs, "
                      "not what the method does: compare them with nothing published."]
    if references:
        lines += ["", "Published (reference; same backbone, the papers' full training):", "",
                  *markdown_table(["paper", "backbone", *TASK_COLUMNS],
                                  [[r["recipe"], r["backbone"], *(_cell(r, c) for c in TASK_COLUMNS)] for r in references])]
    else:
        lines += ["", f"No published reference rows: the papers report bert-base-uncased and roberta-base; these runs "
                      f"use {', '.join(sorted(set(frame['backbone'])))}."]
    if maxima:
        lines += ["", "Avg. max: the best seed's average, beside the mean (Avg.), for a recipe whose paper reports the "
                      "best of several seeds; compare it, not the mean, with that paper's row. " + " ".join(
                          f"{r['recipe']}: the best of {int(r['max of seeds'])} seed(s), the paper's of "
                          f"{BEST_OF[(r['recipe'], r['backbone'])]}." for r in frame.to_dict("records")
                          if r.get("Avg. max") == r.get("Avg. max") and r.get("Avg. max") is not None)]
    if "node-hours" in columns:
        lines += ["", "GPU-hours: the trials' training (run time x GPU workers). node-hours: every node of the cluster "
                      "while the sweep ran, the head included: on a cluster `platform.cluster up` made, each "
                      "instance from its launch to its stop (what AWS bills, boot included), else Ray's node table "
                      "(raylet start to end). GPU idle share: the GPU time the nodes offered that no training used."]
    lines += against_simcse(frame)
    if published:
        lines += against_published(frame)
    if all_pairs:
        lines += significance_section(frame)
    lines += matryoshka_section(frame)
    lines += mteb_section(frame)
    lines += ["", "Runs: " + ", ".join(f"{r['recipe']} = `{r['run_id']}`" for r in frame.to_dict("records")), ""]
    return "\n".join(lines)


def _seeds_of(row: dict) -> dict[int, float]:
    found = row.get("seed averages")
    return found if isinstance(found, dict) else {}


def against_simcse(frame) -> list[str]:
    """Under the table: each recipe's 7-task average against the SimCSE row of its backbone, the
    difference with its 95 % interval and p over their seeds (``uncertainty.across_seeds``)."""
    rows = frame.to_dict("records")
    baselines = {r["backbone"]: r for r in rows if r["recipe"] == "simcse"}
    lines = []
    for row in rows:
        base = baselines.get(row["backbone"])
        if base is None or row is base:
            continue
        a, b = _seeds_of(row), _seeds_of(base)
        if len(a) < 2 or len(b) < 2:
            lines.append(f"- {row['recipe']} ({row['backbone']}): {row['Avg.'] - base['Avg.']:+.2f} against SimCSE, "
                         f"no interval: {min(len(a), len(b))} seed on one side (train both with --seeds N, N >= 2)")
            continue
        iv = uncertainty.across_seeds(a, b)
        verdict = "a difference" if iv.p < uncertainty.ALPHA else "not evidence of a difference"
        lines.append(f"- {row['recipe']} ({row['backbone']}): {iv.estimate:+.2f} [{iv.low:+.2f}, {iv.high:+.2f}] against "
                     f"SimCSE, p = {iv.p:.3f} ({iv.method}, {len(a)} and {len(b)} seeds): {verdict}")
    if not lines:
        return []
    return ["", "Against SimCSE on the same backbone (the 7-task average; 95 % interval and p over the seeds):", "",
            *lines]


def significance_section(frame, seed: int = 0) -> list[str]:
    """``--significance``: the recipes with 3 or more seeds on one backbone, all against all on the
    7-task average: Almost Stochastic Order's ε_min matrix, each pair's difference with its t-interval,
    p, Holm's p over every pair, Cohen's d, each recipe's rank with its bootstrap interval, and the
    seeds a 0.5-point difference needs at the seeds' spread."""
    lines = ["", "Significance across recipes (--significance; the 7-task average, recipes with 3 or more seeds):"]
    for backbone in sorted(set(frame["backbone"])):
        scores = {r["recipe"]: _seeds_of(r) for r in frame.to_dict("records")
                  if r["backbone"] == backbone and len(_seeds_of(r)) >= 3}
        if len(scores) < 2:
            lines += ["", f"- {backbone}: fewer than two recipes with 3 or more seeds (train each with --seeds 3 or more)"]
            continue
        names = list(scores)
        values = {n: list(scores[n].values()) for n in names}
        eps = significance.aso_matrix(values, seed=seed)
        lines += ["", f"{backbone}: Almost Stochastic Order, ε_min of the row over the column (below 0.5: the row is "
                      "almost stochastically better; 95 % confidence, Bonferroni over the pairs):", "",
                  *markdown_table(["ε_min", *names], [[a, *(f"{eps[i, j]:.2f}" for j in range(len(names)))]
                                                      for i, a in enumerate(names)])]
        pairs = {f"{a} − {b}": uncertainty.across_seeds(scores[a], scores[b])
                 for i, a in enumerate(names) for b in names[i + 1:]}
        adjusted = uncertainty.holm({k: iv.p for k, iv in pairs.items()})
        rows = [[k, f"{iv.estimate:+.2f}", f"[{iv.low:+.2f}, {iv.high:+.2f}]", f"{iv.p:.3f}", f"{adjusted[k]:.3f}",
                 f"{significance.cohens_d(values[k.split(' − ')[0]], values[k.split(' − ')[1]]):+.2f}"]
                for k, iv in pairs.items()]
        lines += ["", "Each pair (paired by seed where both ran the same seeds, else Welch), Holm over every pair:", "",
                  *markdown_table(["pair", "Δ", "95 % CI", "p", "p (Holm)", "Cohen's d"], rows)]
        ranks = significance.rank_intervals(values, seed=seed)
        sd = float(np.sqrt(np.mean([np.var(v, ddof=1) for v in values.values()])))
        lines += ["", "Ranks by mean, with their 95 % bootstrap interval over the seeds: " + ", ".join(
                      f"{n} {r} [{lo}-{hi}]" for n, (r, lo, hi) in sorted(ranks.items(), key=lambda x: x[1][0])) + ".",
                  f"Power: with σ = {sd:.2f} (the seeds' pooled standard deviation), detecting Δ = 0.5 at α = .05 "
                  f"with power 0.8 needs {uncertainty.seeds_needed(sd, 0.5) if sd > 0 else 2} seeds per recipe."]
    return lines


def against_published(frame, seed: int = 0) -> list[str]:
    """For each row with a published average: whether it lies inside the 95 % prediction interval of
    what a faithful reproduction gives (``uncertainty.reproduction_interval``): one run from our seeds,
    or the best of k runs where the paper reports its best of k seeds; a paper's mean ± sd over n
    seeds is checked with Welch's test instead. Wrong for a faithful reproduction 5 % of the time."""
    lines = []
    for row in frame.to_dict("records"):
        for ref in PUBLISHED:
            if (ref.recipe, ref.backbone) != (row["recipe"], row["backbone"]) or "Avg." not in ref.scores:
                continue
            seeds = list(_seeds_of(row).values())
            published, head = ref.scores["Avg."], f"- {row['recipe']} ({row['backbone']}) against {ref.label}"
            if ref.sd and ref.n_seeds and len(seeds) >= 2:
                p = uncertainty.summary_p(seeds, published, ref.sd, ref.n_seeds)
                lines.append(f"{head}: {published:.2f} ± {ref.sd:.2f} over {ref.n_seeds} seeds published, our "
                             f"{len(seeds)} seeds' mean {sum(seeds) / len(seeds):.2f}: Welch's p = {p:.3f} "
                             f"({'consistent' if p >= uncertainty.ALPHA else 'different'})")
                continue
            iv = uncertainty.reproduction_interval(seeds, ref.best_of or 1, seed)
            if iv.low != iv.low:  # NaN: fewer than 3 seeds
                lines.append(f"{head}: {published:.2f} published, {iv.estimate:.2f} here: {iv.method} (--seeds 3)")
                continue
            lines.append(f"{head}: {published:.2f} published is {'inside' if iv.covers(published) else 'outside'} "
                         f"[{iv.low:.2f}, {iv.high:.2f}], the 95 % {iv.method} from our {len(seeds)} seeds "
                         f"(mean {iv.estimate:.2f})")
    return ["", "Published averages against our seeds (--against published; a faithful reproduction is called "
            "outside 5 % of the time):", "", *(lines or ["- no row here has a published average on its backbone"])]


def matryoshka_section(frame) -> list[str]:
    """The 7-task average at each Matryoshka prefix the runs trained (``dim<m>/sts_avg``), beside the
    whole vector's, for the runs that have them."""
    prefixes = sorted((c for c in frame.columns if prefix_of(c) and c == sts_at("avg", prefix_of(c))), key=prefix_of,
                      reverse=True)
    scored = [r for r in frame.to_dict("records") if any(r.get(c) == r.get(c) and r.get(c) is not None for c in prefixes)]
    if not scored:
        return []
    columns = ["recipe", "backbone", "Avg.", *prefixes]
    lines = ["", "Matryoshka prefixes (the 7-task average of each run's embeddings cut to their first m coordinates, "
                 "renormalised; Avg.: the whole vector):", ""]
    return lines + markdown_table(["recipe", "backbone", "whole", *(f"{prefix_of(c)} dims" for c in prefixes)],
                                  [[_cell(r, c) for c in columns] for r in scored])


def mteb_section(frame) -> list[str]:
    """The runs' MTEB scores (``platform.evaluate --benchmark ... --log-to RUN``) beside the STS
    table: each task's main score x100 and their mean, for the runs that have them."""
    tasks = sorted(c for c in frame.columns if c.startswith("mteb_") and c != "mteb_mean")
    if not tasks or not frame[tasks].notna().any().any():
        return []
    columns = ["recipe", "backbone", *tasks, *(["mteb_mean"] if "mteb_mean" in frame.columns else [])]
    lines = ["", "MTEB (the `mteb` package: each task's main score x100, cosine Spearman for STS; mean over the "
                 "tasks run; SICK-R is its whole 9,927-pair set, not SentEval's test split):", ""]
    scored = [r for r in frame.to_dict("records") if any(r.get(t) == r.get(t) and r.get(t) is not None for t in tasks)]
    return lines + markdown_table([c.removeprefix("mteb_") for c in columns], [[_cell(r, c) for c in columns] for r in scored])


def latex(frame, references: list[dict]) -> str:
    """The table as a LaTeX ``tabular`` (booktabs), the papers' layout: one row per recipe, the 7
    tasks and their average; published reference rows below a rule."""
    def esc(text: str) -> str:
        return "".join("\\" + ch if ch in "&%$#_{}" else ch for ch in str(text))

    def cell(row, column) -> str:
        return esc(_cell(row, column)).replace("±", "$\\pm$")

    header = ["Model", *TASK_COLUMNS]
    lines = ["% python -m platform.report --latex; needs \\usepackage{booktabs}",
             "\\begin{tabular}{l" + "c" * len(TASK_COLUMNS) + "}", "\\toprule",
             " & ".join(esc(h) for h in header) + " \\\\", "\\midrule"]
    for row in frame.to_dict("records"):
        name = f"{row['recipe']} ({row['backbone']})"
        lines.append(" & ".join([esc(name), *(cell(row, c) for c in TASK_COLUMNS)]) + " \\\\")
    if references:
        lines.append("\\midrule")
        for ref in references:
            lines.append(" & ".join([esc(f"{ref['recipe']} ({ref['backbone']}, published)"),
                                     *(cell(ref, c) for c in TASK_COLUMNS)]) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", ""]
    return "\n".join(lines)


def plot(frame, path: Path) -> Path:
    """Grouped bars: the 7 tasks and their average for each recipe, with the seeds' std as error bars."""
    plt = pyplot()
    import numpy as np

    n = len(frame)
    width = 0.8 / max(n, 1)
    x = np.arange(len(TASK_COLUMNS))
    fig, ax = plt.subplots(figsize=(max(8.0, 1.1 * len(TASK_COLUMNS) + 0.4 * n), 4.5))
    labels, low = [], math.inf
    for i, row in enumerate(frame.to_dict("records")):
        values = [row.get(c) if row.get(c) is not None else np.nan for c in TASK_COLUMNS]
        errors = [row.get(f"{c} std") if f"{c} std" in row and row.get(f"{c} std") == row.get(f"{c} std") else 0.0
                  for c in TASK_COLUMNS]
        labels.append(f"{row['recipe']} ({row['backbone']}" + (f", {row['seeds']} seeds)" if row["seeds"] > 1 else ")"))
        low = min([low, *(v for v in values if v == v)])
        ax.bar(x + (i - (n - 1) / 2) * width, values, width, yerr=errors, capsize=2, label=labels[-1])
    if low < math.inf:  # differences of a point or two must be visible: the axis starts below the lowest bar
        ax.set_ylim(bottom=max(0.0, 5 * math.floor((low - 5) / 5)))
    ax.set_xticks(x, TASK_COLUMNS)
    ax.set_ylabel("Spearman x100")
    ax.set_title("STS, each recipe's best result by STS-B dev")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1),
              ncol=1 if max(map(len, labels), default=0) > 45 else min(n, 3))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def geometry_plot(uri: str, frame, path: Path) -> Path | None:
    """SimCSE's Fig. 2 of the reported results: each row's best seed (a sweep's winner) over its evaluations."""
    trajectories = {}
    client = store.client(uri)
    for row in frame.to_dict("records"):
        run = client.get_run(row["run_id"])
        result = client.get_run(run.data.tags[WINNER_RUN_ID_TAG]) if run.data.tags.get(WINNER_RUN_ID_TAG) else run
        found = geometry_trajectories(uri, result.info.run_id)
        best = result.data.tags.get(BEST_SEED_TAG)
        name = next((n for n in found if best and n.endswith(f"seed{best}")), next(iter(found), None))
        if name:
            trajectories[f"{row['recipe']} ({row['backbone']})"] = found[name]
    return geometry_figure(trajectories, path, "Alignment and uniformity on STS-B dev, each result's best seed") \
        if trajectories else None


def parse_args(argv=None) -> argparse.Namespace:
    p = command_parser("python -m platform.report", __doc__, "python -m platform.report --experiment simcse --experiment una --latex")
    p.add_argument("--experiment", dest="experiments", action="append", metavar="NAME",
                   help="an MLflow experiment to read (repeatable; default: all)")
    p.add_argument("--out", type=Path, default=Path("report"),
                   help="folder for report.md, report.csv, report.png (a new or empty one, or an earlier report's)")
    p.add_argument("--latex", action="store_true", help="also write report.tex (a booktabs tabular of the table)")
    p.add_argument("--against", choices=["published"], default=None,
                   help="published: say for each row whether its paper's average lies in the 95 %% prediction interval of "
                        "a reproduction from our seeds (one run, or the best of k where the paper reports its best)")
    p.add_argument("--significance", action="store_true",
                   help="add the recipes with 3 or more seeds all against all: Almost Stochastic Order, Holm over every "
                        "pair, Cohen's d, rank intervals and the seeds a 0.5-point difference needs")
    p.add_argument("--no-log", action="store_true", help=f"do not log the report to the {REPORTS_EXPERIMENT!r} experiment")
    return p.parse_args(argv)


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)
    uri = store.tracking_uri()
    store.check_reachable(uri)
    out = args.out.expanduser().resolve()
    storage.check_replaceable(out, "choose a new or empty folder for --out")
    writable_dir(out.parent, "report folder")
    frame, names = build(uri, args.experiments)
    references = reference_rows(frame)
    tmp = storage.staging(out)
    try:
        (tmp / "report.md").write_text(markdown(frame, references, names, args.against == "published", args.significance), encoding="utf-8")
        frame.drop(columns=["baseline", "seed averages"], errors="ignore").to_csv(tmp / "report.csv", index=False)
        plot(frame, tmp / "report.png")
        geometry_plot(uri, frame, tmp / "geometry.png")
        if args.latex:
            (tmp / "report.tex").write_text(latex(frame, references), encoding="utf-8")
    except BaseException:
        storage.discard(tmp)
        raise
    storage.install(tmp, out, "platform.report", "choose a new or empty folder for --out")
    files = [out / "report.md", out / "report.csv", out / "report.png", *([out / "geometry.png"] if (out / "geometry.png").is_file() else []),
             *([out / "report.tex"] if args.latex else [])]
    print(files[0].read_text(encoding="utf-8"))
    print(f"written: {', '.join(str(f) for f in files)}")
    if not args.no_log:
        run_id = log_report(uri, f"report-{time.strftime('%Y%m%d-%H%M%S')}", {"experiments": ",".join(names)},
                            frame, files)
        print(f"MLflow: {store.redact(uri)} (experiment {REPORTS_EXPERIMENT!r}, run {run_id})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
