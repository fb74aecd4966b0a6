"""The end of a sweep, for a researcher: every trial in one table (its searched parameters, best
STS-B dev, steps, status), printed and logged on the sweep's parent run as an MLflow table and a
CSV, with plots logged as PNG images: each parameter against the dev score (trials coloured by
the steps they trained), and Optuna's parameter-importance plot (fANOVA) with its n. Also how
well each ASHA rung's score predicts the final best (``rung_table``, read by the
benchmark case asha-rungs). And the sweep's descriptions in MLflow's UI: each trial's, the
winner's and the parent's; and the winner itself (``finish_sweep``): its numbers on the parent,
its checkpoint evaluated beside the backbone, exported and registered.
"""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path

import time

from platform import checkpoint, cluster_aws, settings
from platform.console import as_number, format_frame, markdown_table, pyplot, short
from platform.data import SHORT_NAMES, STS_TASKS
from platform.errors import UserError, one_line
from platform.run import final_evaluation, ray_env, unit
from platform.run.loop import total_steps
from platform.space import SearchSpace
from platform.tracking import store
from platform.checkpoint import exists as checkpoint_exists
from platform.tracking.names import (BEST, BEST_CHECKPOINT_TAG, BEST_PREFIX, DEV_METRIC, NOTE_TAG, REGISTERED_MODEL_TAG,
                                     RESUMED_FINISHED, STEP, STOPPED_BY_SCHEDULER_TAG, STS_AVG, TRIAL_ID_TAG, WINNER,
                                     WINNER_RUN_ID_TAG, sts, vs_backbone, winner_key)
from platform.tracking import recorder
from platform.tracking.recorder import Run


# A trial's status in the words of its MLflow run and of the console's trial lines.
FINISHED, STOPPED_EARLY, FAILED = "FINISHED", "FINISHED (stopped early)", "FAILED"


def trial_table(results, spec: SearchSpace, total_steps: int):
    """One row per trial of Tune's results, best first."""
    import pandas as pd

    rows = []
    for result in results:
        metrics = result.metrics or {}
        config = getattr(result, "config", None) or {}
        step = metrics.get(STEP)
        if result.error is not None:
            status = FAILED
        elif metrics.get(RESUMED_FINISHED) or (step is not None and step >= total_steps):
            status = FINISHED
        else:
            status = STOPPED_EARLY  # by the scheduler (ASHA), or never reported
        row = {"trial_id": metrics.get("trial_id", ""), **{k: config.get(k) for k in spec.space},
               spec.score: metrics.get(spec.score), "steps": step, "status": status}
        if any(spec.score + "_std" in (r.metrics or {}) for r in results):  # a sweep with seeds: the mean's spread
            row[spec.score + "_std"] = metrics.get(spec.score + "_std")
            row["seeds"] = metrics.get("seeds")
        rows.append(row)
    frame = pd.DataFrame(rows)
    if len(frame):
        frame = frame.sort_values(spec.score, ascending=spec.mode == "min", na_position="last")
    return frame.reset_index(drop=True)


def _study(frame, spec: SearchSpace):
    """An Optuna study holding the trials with a score (their searched values and best dev score)."""
    import optuna

    dists = {name: _distribution(kind, args) for name, (kind, args) in spec.space.items()}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize" if spec.mode == "max" else "minimize")
    for row in frame.dropna(subset=[spec.score]).to_dict("records"):
        params = {k: row[k] for k in spec.space}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=float(row[spec.score])))
    return study


def _distribution(kind: str, args: list):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if kind in ("choice", "grid"):
        return CategoricalDistribution(list(args))
    if kind == "randint":
        return IntDistribution(int(args[0]), int(args[1]))
    return FloatDistribution(float(args[0]), float(args[1]), log=kind == "loguniform")


BUDGET_MARKERS = {FINISHED: "o", STOPPED_EARLY: "x", FAILED: "X"}


def _budget_groups(done):
    """Trials grouped by the steps they trained (their budget), most steps first: an ASHA-stopped
    trial's best score is not comparable with a full one's, so each budget is drawn apart."""
    steps = done["steps"].fillna(0).astype(int)
    return [(int(n), done[steps == n]) for n in sorted(set(steps), reverse=True)]


def params_figure(frame, spec: SearchSpace):
    """One panel per searched parameter against the best dev score, every panel with its own tick
    labels; trials coloured by the steps they trained, marked by how they ended."""
    plt = pyplot()
    import numpy as np
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    done = frame.dropna(subset=[spec.score])
    names = list(spec.space)
    cols = min(2, len(names))  # a grid, readable in MLflow's preview pane, never a strip
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.4 * rows + 1.2), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    groups = _budget_groups(done)
    colours = plt.get_cmap("viridis")([i / max(len(groups) - 1, 1) for i in range(len(groups))])
    for ax, name in zip(axes.flat, names):
        kind, args = spec.space[name]
        labels = [str(v) for v in args] if kind in ("choice", "grid") else None
        for colour, (_, group) in zip(colours, groups):
            x = np.array([labels.index(str(v)) if str(v) in labels else -1 for v in group[name]] if labels
                         else group[name].astype(float))
            for status, marker in BUDGET_MARKERS.items():
                mask = (group["status"] == status).to_numpy()
                if mask.any():
                    ax.scatter(x[mask], group[spec.score][mask], color=colour, marker=marker, s=36)
        if labels:  # the space's values in their order, as categories
            ax.set_xticks(range(len(labels)), labels)
        elif kind == "loguniform":
            ax.set_xscale("log")
            ax.set_xlim(float(args[0]) / 1.15, float(args[1]) * 1.15)
            # A range inside one decade has no major tick: ticks at 1, 2 and 5 of each decade.
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0e}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(name)
        ax.set_ylabel(spec.score)
        ax.grid(alpha=0.3)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=c, marker="o", linestyle="", label=f"{steps} steps") for c, (steps, _) in zip(colours, groups)]
    handles += [Line2D([], [], color="grey", marker=m, linestyle="", label=s.lower())
                for s, m in BUDGET_MARKERS.items() if (done["status"] == s).any()]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 3), fontsize=8, frameon=False)
    fig.suptitle(f"{len(done)} trials: each searched parameter\nagainst {spec.score} (colour: steps trained)", fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


MIN_IMPORTANCE_TRIALS = 10  # fANOVA's forest on fewer trials ranks noise


def importance_figure(frame, spec: SearchSpace):
    """Optuna's parameter-importance plot (fANOVA) over the trials with a score, titled with how
    many there were and at which budgets; None with fewer than ``MIN_IMPORTANCE_TRIALS`` trials
    or fewer than two parameters."""
    import warnings

    pyplot()  # Optuna draws with matplotlib
    from optuna.importance import FanovaImportanceEvaluator
    from optuna.visualization.matplotlib import plot_param_importances

    done = frame.dropna(subset=[spec.score])
    if len(done) < MIN_IMPORTANCE_TRIALS or len(spec.space) < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's matplotlib plots are marked experimental
        # fANOVA's forest seeded by the sweep's seed: unseeded, the same trials show other importances.
        ax = plot_param_importances(_study(frame, spec), evaluator=FanovaImportanceEvaluator(seed=spec.seed),
                                    target_name=spec.score)
    budgets = ", ".join(f"{len(g)} at {steps} steps" for steps, g in _budget_groups(done))
    ax.set_title("", loc="left")  # Optuna's own title, replaced by one that says what the bars rest on
    ax.set_title(f"fANOVA importance for {spec.score}\nn = {len(done)} trials ({budgets})", fontsize=10)
    if ax.get_legend() is not None:  # off the bars: the bars carry their own values
        ax.get_legend().remove()
    fig = ax.get_figure()
    fig.set_size_inches(6, 0.6 * len(spec.space) + 1.8)
    fig.tight_layout()
    return fig


def plots(frame, spec: SearchSpace, folder: Path) -> list[Path]:
    """``params_vs_<metric>.png`` (one panel per parameter) and, where it can be computed,
    ``param_importance.png``."""
    import matplotlib.pyplot as plt

    out = []
    figures = {f"params_vs_{spec.metric}.png": params_figure(frame, spec)
               if len(spec.space) and len(frame.dropna(subset=[spec.score])) else None,
               "param_importance.png": importance_figure(frame, spec)}
    for name, fig in figures.items():
        if fig is not None:
            out.append(folder / name)
            fig.savefig(out[-1], dpi=100)
            plt.close(fig)
    return out


def summarise(parent: Run, results, spec: SearchSpace, total_steps: int) -> list[str]:
    """The trials' table printed and logged with its plots; returns what the plots leave out."""
    frame = trial_table(results, spec, total_steps)
    print(f"\nsweep: {len(frame)} trials\n{format_frame(frame)}", flush=True)
    parent.log_table(frame, "sweep_summary.json")
    notes = []
    scored = len(frame.dropna(subset=[spec.score])) if len(frame) else 0
    if len(spec.space) >= 2 and scored < MIN_IMPORTANCE_TRIALS:
        notes.append(f"Parameter importance not computed: {scored} trial(s) with a score, fANOVA needs "
                     f"{MIN_IMPORTANCE_TRIALS} or more to mean something.")
        print(f"note: {notes[-1]}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "sweep_summary.csv"
        frame.to_csv(csv, index=False)
        parent.log_file(csv)
        for image in plots(frame, spec, Path(tmp)):
            parent.log_file(image, "plots")
    final_evaluation.log_geometry(parent, "Trials' alignment and uniformity on STS-B dev (numbers: steps)")
    return notes


def grid_frame(runs, param: str, key: str | None = None):
    """A sensitivity grid as the papers print it (UNA Tables C4-C6, AugCSE Table 7): one row per
    value of ``param`` (its trial's best checkpoint; the MLflow param ``key``, default ``param``),
    the 7 STS tasks and their mean as columns."""
    key = key or param
    import pandas as pd


    rows = []
    for run in runs:
        if key not in run.data.params or sts(STS_TASKS[0]) not in run.data.metrics:
            continue
        value = as_number(run.data.params[key])
        row = {param: value, **{SHORT_NAMES[t]: run.data.metrics.get(sts(t)) for t in STS_TASKS}}
        row["Avg."] = run.data.metrics.get(STS_AVG)
        if STS_AVG + "_std" in run.data.metrics:  # a grid with seeds: each value's mean, and its spread
            row["Avg. std"] = run.data.metrics[STS_AVG + "_std"]
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame.sort_values(param).reset_index(drop=True) if len(frame) else frame


def grid_plot(frame, param: str, path: Path) -> Path:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7.5, 4))
    x = list(range(len(frame)))
    for column in [c for c in frame.columns[1:] if not c.startswith("Avg.")]:
        ax.plot(x, frame[column], marker="o", linewidth=1, alpha=0.6, label=column)
    if "Avg. std" in frame:
        ax.errorbar(x, frame["Avg."], yerr=frame["Avg. std"], marker="o", linewidth=2.5, color="black", capsize=3,
                    label="Avg. (mean +- std over seeds)")
    else:
        ax.plot(x, frame["Avg."], marker="o", linewidth=2.5, color="black", label="Avg.")
    ax.set_xticks(x, [str(v) for v in frame[param]])
    ax.set_xlabel(param)
    ax.set_ylabel("Spearman x100")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title(f"STS at every value of {param}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def grid_table(parent: Run, param: str, key: str | None = None) -> None:
    """The grid's table printed, and logged on the parent run (MLflow table, CSV, Markdown) with its plot."""
    frame = grid_frame(store.child_runs(parent.uri, parent.id), param, key)
    if not len(frame):
        print(f"note: no trial of the {param} grid has a 7-task table", flush=True)
        return
    print(f"\n{param} grid (best checkpoint of each value):\n{format_frame(frame)}", flush=True)
    parent.log_table(frame, f"grid_{param}.json")
    with tempfile.TemporaryDirectory() as tmp:
        csv, md = Path(tmp) / f"grid_{param}.csv", Path(tmp) / f"grid_{param}.md"
        frame.to_csv(csv, index=False)
        cells = [[f"{v:.2f}" if isinstance(v, float) else str(v) for v in row] for row in frame.itertuples(index=False)]
        md.write_text("\n".join(markdown_table([str(c) for c in frame.columns], cells)) + "\n", encoding="utf-8")
        for path in (csv, md):
            parent.log_file(path)
        parent.log_file(grid_plot(frame, param, Path(tmp) / f"grid_{param}.png"), "plots")


def view_key(parent_id: str) -> str:
    """The name of a sweep's saved view of its trials (``store.save_runs_view``)."""
    return f"sweep-{parent_id}"


def closing_block(uri: str, experiment: str | None, parent: Run, best: Run, result, won: dict, registered: str,
                  metric: str) -> None:
    """What the user needs after a sweep, in one place."""
    dev, n = result.dev, len(result.fits)
    spread = f" +- {dev[BEST + '_std']:.2f} over {n} seeds" if n > 1 else ""
    values = textwrap.wrap(", ".join(f"{k}={short(v)}" for k, v in won.items()), width=100 - 16,
                           break_long_words=False, break_on_hyphens=False) or ["(none searched)"]
    lines = ["", "=" * 72, "sweep finished", f"  best trial:   {best.name}",
             *(f"  {'values:' if i == 0 else '':<14}{chunk}" for i, chunk in enumerate(values)),
             f"  {metric}: {dev[BEST]:.2f}{spread}"]
    if result.scores:
        std = f" +- {result.scores['avg_std']:.2f}" if "avg_std" in result.scores else ""
        lines.append(f"  STS avg:      {result.scores.get('avg', float('nan')):.2f}{std} (table above, against the backbone)")
    lines += [f"  checkpoint:   {result.checkpoint}",
              f"  model:        {('models:/' + registered) if '/' in registered else 'not registered'}",
              f"  trials:       sweep_summary.csv and plots/ in MLflow run {parent.id} (artifacts)",
              f"  MLflow:       {store.redact(uri)}, experiment {experiment!r}, run {parent.name}",
              # The trials' view (searched values and dev score, best first), not the experiment's
              # default table, which shows the parent's one collapsed row.
              f"  browse it:    {store.ui_command(uri, route=store.view_route(parent.experiment_id, view_key(parent.id)))}",
              "=" * 72]
    print("\n".join(lines), flush=True)


def rung_table(histories: dict[str, list[float]], grace: int, factor: float) -> list[tuple[int, int, float, bool]]:
    """(rung in evaluations, trials, Spearman of best-so-far vs final best, leader == winner) per
    rung below the trials' length; ``histories``: each trial's dev scores in evaluation order."""
    from scipy.stats import spearmanr

    length = min(len(h) for h in histories.values())
    final = {t: max(h) for t, h in histories.items()}
    winner = max(final, key=final.get)
    rows, rung = [], grace
    while rung < length:
        at = {t: max(h[:rung]) for t, h in histories.items()}
        rho = spearmanr([at[t] for t in histories], [final[t] for t in histories]).statistic
        rows.append((rung, len(histories), float(rho), max(at, key=at.get) == winner))
        rung = int(round(rung * factor))
    return rows


# ------------------------------------------------------------------------------------------------
# The sweep's descriptions in MLflow's UI (Markdown)


def best_backbone(location: str) -> str:
    return checkpoint.read_state_at(location).get("config", {}).get("model", "?")


def trial_note(uri: str, run, searched: list[str], status: str | None = None, stopped: bool | None = None,
               points: list | None = None) -> str:
    """A trial run's description (Markdown in MLflow's UI): its searched values, its best STS-B dev
    and at which step, the steps it trained, and how it ended (``status``, ``stopped`` by the
    scheduler: as it ends; default: as the run says). ``points``: every point the run holds, as
    its writer sent them (default: read from MLflow)."""
    params = run.data.params
    values = ", ".join(f"`{k}={short(params[key])}`" for k in searched
                       for key in (k, *[p for p in params if p.endswith(f".{k}")]) if key in params)
    if points is None:
        c = store.client(uri)
        points = [(m.key, m.value, m.timestamp, m.step) for key in (DEV_METRIC, "train_loss")
                  for m in c.get_metric_history(run.info.run_id, key)]
    dev: dict[int, float] = {}
    for p in points:  # each step once, the first sent: what the run holds
        if p[0] == DEV_METRIC:
            dev.setdefault(int(p[3]), p[1])
    trained = max((int(p[3]) for p in points if p[0] == "train_loss"), default=0)
    status = status or run.info.status
    ended = {"FINISHED": "finished", "FAILED": "failed", "KILLED": "interrupted (resumable with --resume)"}.get(
        status, status.lower())
    if (run.data.tags.get(STOPPED_BY_SCHEDULER_TAG) == "true" if stopped is None else stopped):
        ended = "stopped early by the scheduler (ASHA); its best checkpoint is kept"
    lines = [f"**Trial {run.data.tags.get(TRIAL_ID_TAG, '')}** of a sweep: {values or 'no searched value'}."]
    if dev:
        step, value = max(dev.items(), key=lambda m: (m[1], -m[0]))
        lines.append(f"**Best STS-B dev** (Spearman x100): {value:.2f} at step {step}, {len(dev)} evaluation(s).")
    lines.append(f"**Trained:** {trained} steps. **Ended:** {ended}.")
    return "\n\n".join(lines)


def winner_note(uri: str, parent: Run, best: Run, registered: str, result, baseline, searched: list[str]) -> str:
    """The winning trial's description: its own note, then the 7 tasks against the backbone, the
    sweep it won and the line that loads it."""
    info = best.info()
    lines = [trial_note(uri, info, searched),
             f"**Won the sweep** [{parent.name or parent.id}]({store.ui_route(f'#/experiments/{parent.experiment_id}/runs/{parent.id}')})."]
    if baseline and result.scores:
        lines.append("**STS, 7 tasks** against the untouched backbone:\n\n"
                     + final_evaluation.beside_block(best_backbone(result.checkpoint), baseline, result.scores))
    if "/" in registered:
        name, version = registered.split("/", 1)
        lines.append(f"**Load it** in a new Python session: `{store.load_code(uri, f'models:/{name}/{version}')}`")
    return "\n\n".join(lines)


def sweep_note(uri: str, parent: Run, best: Run, won: dict, registered: str, result, baseline, notes: list[str]) -> str:
    """The parent run's description (Markdown in MLflow's UI): the winner and by how much, the
    comparison with the backbone, where the trials and the model are, how to load it."""
    experiment = parent.experiment_id
    dev = result.dev
    spread = f" ± {dev[BEST + '_std']:.2f} over {len(result.fits)} seeds" if BEST + "_std" in dev else ""
    view = store.ui_route(store.view_route(experiment, view_key(parent.id)))
    lines = [f"**Best trial:** [{best.name}]({store.ui_route(f'#/experiments/{experiment}/runs/{best.id}')}) with "
             + (", ".join(f"`{k}={short(v)}`" for k, v in won.items()) or "no searched value") + ".",
             # Second: MLflow's UI folds a description after its first few lines.
             f"**Trials:** [the view of this sweep's trials]({view}) (searched values and {DEV_METRIC}, best first); "
             "`sweep_summary.csv` and `plots/` in the artifacts.",
             f"**STS-B dev** (Spearman x100): {dev[BEST]:.2f}{spread}."]
    if baseline and result.scores:
        backbone = best_backbone(result.checkpoint)
        delta = result.scores["avg"] - baseline["avg"]
        lines.append(f"**STS, 7 tasks (avg):** {result.scores['avg']:.2f}, {delta:+.2f} against the untouched "
                     f"backbone `{backbone}` ({baseline['avg']:.2f}):")
        lines.append(final_evaluation.beside_block(backbone, baseline, result.scores))
    if "/" in registered:
        name, version = registered.split("/", 1)
        lines.append(f"**Registered:** [{name} version {version}]({store.ui_route(f'#/models/{name}/versions/{version}')}); load it in "
                     f"a new Python session with `{store.load_code(uri, f'models:/{name}/{version}')}`.")
    lines += [f"*{note}*" for note in notes]
    return "\n\n".join(lines)


# ------------------------------------------------------------------------------------------------
# The winner



def ranked_trials(uri: str, parent: str, metric: str, mode: str) -> list:
    """FINISHED trial runs with a score and a best checkpoint that exists in storage, best first."""
    order = "DESC" if mode == "max" else "ASC"
    runs = store.child_runs(uri, parent, "attributes.status = 'FINISHED'", order_by=[f"metrics.{BEST_PREFIX}{metric} {order}"])
    return [r for r in runs if BEST_PREFIX + metric in r.data.metrics and checkpoint_exists(r.data.tags.get(BEST_CHECKPOINT_TAG))]


def finish_sweep(sweep, parent: Run, spec: SearchSpace, results) -> str:
    """The trials' table and plots, the grid's table, and the best trial: its numbers on the
    parent (``best.*`` keys, never the trials' own), its checkpoint evaluated beside the backbone,
    exported and registered. Returns that checkpoint."""
    notes = summarise(parent, results, spec, total_steps(sweep.base, len(sweep.sentences)))
    if sweep.grid and sweep.base.final_eval:
        grid_table(parent, sweep.grid, sweep.base.param_key(sweep.grid))
    ranked = ranked_trials(sweep.uri, sweep.parent, spec.metric, spec.mode)
    if not ranked:
        raise UserError("no trial produced a checkpoint; see the trials' errors above")
    best = Run(sweep.uri, ranked[0].info.run_id, ranked[0].info.run_name)
    result = unit.read_result(best)
    step = checkpoint.read_state_at(result.checkpoint)["step"]
    won = {k: ranked[0].data.params.get(sweep.base.param_key(k)) for k in spec.space}
    recorder.name_best(parent, result.checkpoint, {WINNER_RUN_ID_TAG: best.id, **{WINNER + k: v for k, v in won.items()}})
    wall, cpu = time.perf_counter(), time.process_time()
    unit.finalize(best, result, "full" if sweep.base.final_eval else "none", searched=won)
    baseline = result.baseline
    if sweep.base.final_eval:  # the weights were loaded on the run's device, not here
        print(f"the end of the sweep (7 STS tasks, baseline, export, registry): {time.perf_counter() - wall:.1f} s, "
              f"{time.process_time() - cpu:.1f} s of it the driver's CPU", flush=True)
    # At the best checkpoint's step, each once: the winner's numbers, and the comparison with the backbone.
    numbers = {winner_key(k): v for k, v in {**result.dev, **{sts(k): v for k, v in (result.scores or {}).items()}}.items()}
    if baseline:
        tasks = [t for t in (*STS_TASKS, "avg") if t in baseline and t in result.scores]
        numbers.update({vs_backbone(t, "baseline"): baseline[t] for t in tasks})
        numbers.update({vs_backbone(t, "delta"): result.scores[t] - baseline[t] for t in tasks})
        parent.log_text(final_evaluation.beside_block(best_backbone(result.checkpoint), baseline, result.scores),
                        "sts_vs_backbone.md")
    recorder.log_results(parent, numbers, step)
    # What the sweep's nodes cost (the report sets it beside the trials' training GPU-hours).
    try:
        since = parent.info().info.start_time / 1000
        recorder.log_results(parent, ray_env.node_hours(since))
        if settings.get(settings.CLUSTER):  # on a cluster up made: what AWS bills its instances
            recorder.log_results(parent, cluster_aws.billed_hours(settings.get(settings.CLUSTER), since))
    except Exception as exc:  # noqa: BLE001 - an account of costs never fails the sweep that it accounts
        print(f"note: the sweep's node-hours were not recorded ({one_line(exc, 160)})", flush=True)
    registered = best.info().data.tags.get(REGISTERED_MODEL_TAG, "")
    parent.set_tags({REGISTERED_MODEL_TAG: registered,
                     NOTE_TAG: sweep_note(sweep.uri, parent, best, won, registered, result, baseline, notes)})
    best.set_tags({NOTE_TAG: winner_note(sweep.uri, parent, best, registered, result, baseline, list(spec.space))})
    closing_block(sweep.uri, sweep.experiment, parent, best, result, won, registered, spec.metric)
    return result.checkpoint
