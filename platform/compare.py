"""``python -m platform.compare A B [C ...]``: is a difference in STS scores evidence?

Each reference is an MLflow run (``runs:/RUN_ID``, or a run's or sweep's name), a registered or
logged model (``models:/...``) or a checkpoint path; the first is the one the others are
measured against. For each other one, per task and for the average: the difference (other minus
first), its 95 % confidence interval, a p-value against no difference, whether it is significant
after Holm's correction over the 7 tasks, and what it rests on
(``platform.evaluation.uncertainty``):

- two results with several seeds each: a claim about the recipes, from their seeds' scores (paired
  t-test where both ran the same seeds, else Welch's); with 3 or more seeds each whose final
  evaluations kept their per-pair similarities, beside it the interval over seeds and test pairs
  (``uncertainty.two_level``: the pairs STS-B shares with STS12-16 drawn jointly, STS12-16 within
  their subsets), the seeds' share of its variance, and Cohen's d;
- otherwise, a claim about two checkpoints (a run's best; of a run with seeds, its best seed by
  STS-B dev, said so): both checkpoints' similarities on the same test pairs (a run's, as its final
  evaluation logged them: nothing is encoded again; a path's or model's, encoded now), and a paired
  bootstrap over the pairs.
  It says nothing about the recipes: two seeds of one recipe often differ "significantly" so.

The two kinds of claim are printed as two tables and drawn with their own markers.

The table is printed and logged as a run of the ``comparisons`` experiment (CSV, Markdown and a
forest plot of the differences per task).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from methods.encoder import Encoder
from platform import checkpoint
from platform.console import command_parser, pyplot
from platform.data import SHORT_NAMES, STS_TASKS, load_sts
from platform.errors import UserError, cli_main
from platform.evaluate import reference as model_reference
from platform.evaluate import resolve_model
from platform.evaluation import significance, uncertainty
from platform.evaluation.sts import STSEvaluator
from platform.run.final_evaluation import PAIRS_ARTIFACT
from platform.tracking import store
from platform.tracking.names import (BEST_CHECKPOINT_TAG, BEST_SEED_TAG, WINNER_RUN_ID_TAG, MODEL_TAG, PARENT_TAG, SEED_TAG,
                                     SWEEP_TAG, pairs_at, sts_at, supervision_note)
from platform.tracking.recorder import Run

COMPARISONS_EXPERIMENT = "comparisons"
RECIPES, CHECKPOINTS = "recipes (over seeds)", "checkpoints (over test pairs)"  # the two kinds of claim
ROWS = [*STS_TASKS, "avg"]


@dataclasses.dataclass
class Result:
    """One side of a comparison: its label, backbone, each seed's scores (``seed -> {task: x100}``)
    and where its best checkpoint is (None: only its scores are known)."""

    label: str
    backbone: str
    seeds: dict[int, dict[str, float]]
    checkpoint: str | None
    seed: int = 0
    seed_runs: dict[int, str] = dataclasses.field(default_factory=dict)  # seed -> its MLflow run
    uri: str | None = None
    dims: int | None = None  # a Matryoshka prefix: the embeddings' first coordinates compared (None: all)
    scored_by: str | None = None  # the run whose final evaluation scored ``checkpoint`` (its best seed's)


def _scores(metrics: dict[str, float], dims: int | None = None) -> dict[str, float]:
    return {t: metrics[sts_at(t, dims)] for t in ROWS if sts_at(t, dims) in metrics}


DIM_SUFFIX = ":dim="  # REF:dim=M: that reference at its embeddings' first M coordinates


def split_dims(reference: str, default: int | None) -> tuple[str, int | None]:
    """``REF:dim=M`` -> (REF, M); a reference without the suffix has ``default`` (``--dim``)."""
    if DIM_SUFFIX not in reference:
        return reference, default
    ref, _, m = reference.rpartition(DIM_SUFFIX)
    if not m.isdigit() or int(m) < 1:
        raise UserError(f"{reference}: {DIM_SUFFIX}M takes a whole number of dimensions >= 1, got {m!r}")
    return ref, int(m)


def from_run(uri: str, run, label: str, dims: int | None = None) -> Result:
    """A run's result: a sweep's is its winning configuration's; a run with seeds, its seeds'; at
    a Matryoshka prefix ``dims``, the scores its final evaluation logged there (``sts_at``)."""
    client = store.client(uri)
    if run.data.tags.get(WINNER_RUN_ID_TAG) and run.data.tags.get(SWEEP_TAG) == "true":
        run = client.get_run(run.data.tags[WINNER_RUN_ID_TAG])
    children = [r for r in store.child_runs(uri, run.info.run_id, "attributes.status = 'FINISHED'") if SEED_TAG in r.data.tags]
    seeds = {int(r.data.tags[SEED_TAG]): _scores(r.data.metrics, dims) for r in children}
    runs = {int(r.data.tags[SEED_TAG]): r.info.run_id for r in children}
    if not seeds:
        seeds = {int(run.data.params.get("seed", 0)): _scores(run.data.metrics, dims)}
        runs = {int(run.data.params.get("seed", 0)): run.info.run_id}
    model = run.data.tags.get(MODEL_TAG) or run.data.params.get("model", "")
    label += supervision_note(run.data.tags)  # a teacher-assisted side is labelled as such in every table and plot
    best = run.data.tags.get(BEST_SEED_TAG)
    scored_by = runs.get(int(best)) if best else next(iter(runs.values())) if len(runs) == 1 else None
    return Result(label, model.rpartition("@")[0] or model, seeds, run.data.tags.get(BEST_CHECKPOINT_TAG),
                  int(run.data.params.get("seed", 0) or 0), runs, uri, dims, scored_by)


def resolve(reference: str, stack: contextlib.ExitStack, dims: int | None = None) -> Result:
    """Any accepted form of a reference (``REF:dim=M`` at a Matryoshka prefix, else at ``dims``), as a ``Result``."""
    reference, dims = split_dims(reference, dims)
    result = _resolve(reference, stack, dims)
    result.dims = dims
    if dims:
        result.label = f"{result.label} (first {dims} dims)"
    return result


def _resolve(reference: str, stack: contextlib.ExitStack, dims: int | None) -> Result:
    if reference.startswith("runs:/"):
        uri = store.tracking_uri()
        run_id = reference[len("runs:/"):].strip("/").split("/")[0]
        store.check_run(uri, run_id)
        return from_run(uri, store.client(uri).get_run(run_id), reference, dims)
    if reference.startswith("models:/") or Path(reference).exists():
        path, _ = model_reference(reference, stack)
        label = reference if reference.startswith("models:/") else "/".join(Path(reference).resolve().parts[-2:])
        return Result(label, _backbone_of(Path(path)), {}, path)
    uri = store.tracking_uri()
    runs = store.client(uri).search_runs([e.experiment_id for e in store.client(uri).search_experiments()],
                                         filter_string=f"attributes.run_name = {store.quoted(reference)} and attributes.status = 'FINISHED'",
                                         order_by=["attributes.start_time DESC"], max_results=10)
    runs = [r for r in runs if PARENT_TAG not in r.data.tags]
    if not runs:
        raise UserError(f"{reference!r} is no checkpoint path, runs:/ or models:/ reference, nor the name of a finished "
                        f"run or sweep in {store.redact(uri)}")
    return from_run(uri, runs[0], reference, dims)


def _backbone_of(path: Path) -> str:
    """A checkpoint's backbone: its training configuration's model, else unknown ("": not compared)."""
    for folder in (path, path.parent):
        if checkpoint.exists(str(folder)):
            model = checkpoint.read_state(folder).get("config", {}).get("model", "")
            return model.rpartition("@")[0] or model
    return ""


def check(results: list[Result]) -> None:
    """One clear line for what cannot be compared."""
    backbones = {r.backbone for r in results if r.backbone}
    if len(backbones) > 1:
        raise UserError(f"the references have different backbones ({', '.join(sorted(backbones))}): a difference "
                        "between them is the backbones' as much as the recipes'; compare runs of one backbone")
    for r in results:
        for seed, scores in r.seeds.items():
            missing = [t for t in ROWS if t not in scores]
            if missing and r.dims and len(missing) == len(ROWS):
                raise UserError(f"{r.label} (seed {seed}) has no scores at its first {r.dims} dimensions: its run "
                                f"did not train matryoshka_dims with {r.dims}; compare its checkpoint (a path, or "
                                "models:/) to score any prefix")
            if missing:
                raise UserError(f"{r.label} (seed {seed}) has no score for {', '.join(missing)}: the references must be "
                                "scored on the same 7 tasks (a run that finished its final evaluation)")


def by_seeds(first: Result, other: Result) -> dict[str, uncertainty.Interval]:
    return {t: uncertainty.across_seeds({s: v[t] for s, v in other.seeds.items()},
                                        {s: v[t] for s, v in first.seeds.items()}) for t in ROWS}


def similarities(checkpoint_path: str, dims: int | None = None) -> dict[str, np.ndarray]:
    """The cosine similarity of each test pair of the 7 tasks, for a checkpoint (at its embeddings'
    first ``dims`` coordinates)."""
    path, pooler = resolve_model(checkpoint_path, None)
    encoder = Encoder.from_pretrained(path, pooler=pooler)
    try:
        encoder.truncated(dims)
    except ValueError as exc:
        raise UserError(f"{checkpoint_path}: {exc}") from None
    evaluator = STSEvaluator(STS_TASKS)
    return evaluator.similarities(evaluator.encode(encoder, progress="embedding the 7 STS tasks"))


def logged_similarities(uri: str, run_id: str, dims: int | None = None) -> dict[str, np.ndarray] | None:
    """A run's per-pair similarities of the 7 tasks (at a Matryoshka prefix ``dims``), as its final
    evaluation logged them (``sts_pairs.npz``); None when it lacks them (a run from before they were
    kept, or a prefix it did not train)."""
    import mlflow

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=PAIRS_ARTIFACT, dst_path=tmp,
                                                       tracking_uri=uri)
        except Exception:  # noqa: BLE001 - not logged: the caller goes on without them
            return None
        with np.load(path) as found:
            out = {t: found[pairs_at(t, dims)] for t in STS_TASKS if pairs_at(t, dims) in found}
    return out if set(out) == set(STS_TASKS) else None


def seed_similarities(result: Result) -> list[dict[str, np.ndarray]] | None:
    """Each seed's per-pair similarities (``logged_similarities``); None when a seed's run lacks them."""
    if not result.uri or set(result.seed_runs) != set(result.seeds):
        return None
    out = [logged_similarities(result.uri, run_id, result.dims) for _, run_id in sorted(result.seed_runs.items())]
    return None if any(s is None for s in out) else out


def checkpoint_similarities(result: Result) -> dict[str, np.ndarray]:
    """The per-pair similarities of ``result``'s checkpoint: those its run's final evaluation logged
    (the checkpoint need not be reachable from here, and nothing is encoded again), else encoded now."""
    logged = logged_similarities(result.uri, result.scored_by, result.dims) if result.uri and result.scored_by else None
    return logged if logged is not None else similarities(result.checkpoint, result.dims)


def by_seeds_and_pairs(first: Result, other: Result, seed: int, resamples: int) -> dict[str, uncertainty.Interval] | None:
    """The interval over seeds and test pairs (``uncertainty.two_level``), where both sides have 3
    or more seeds with their per-pair similarities; else None."""
    if len(first.seeds) < 3 or len(other.seeds) < 3:
        return None
    a, b = seed_similarities(first), seed_similarities(other)
    if a is None or b is None:
        return None
    pairs = {t: load_sts(t) for t in STS_TASKS}
    return uncertainty.two_level(a, b, {t: pairs[t].scores for t in STS_TASKS}, uncertainty.PairDesign.of(pairs),
                                 seed, resamples)


def by_pairs(first: dict[str, np.ndarray], other: dict[str, np.ndarray], seed: int,
             resamples: int) -> dict[str, uncertainty.Interval]:
    """Each task's paired bootstrap; the average's from joint draws of all 7 tasks' pairs
    (``uncertainty.PairDesign``: STS-B's pairs that are STS12-16 pairs drawn as their twins,
    STS12-16 within their subsets), both checkpoints scored on each."""
    pairs = {t: load_sts(t) for t in STS_TASKS}
    gold = {t: pairs[t].scores for t in STS_TASKS}
    out = {t: uncertainty.paired_pairs(other[t], first[t], gold[t], seed + i, resamples) for i, t in enumerate(STS_TASKS)}
    m = uncertainty.PairDesign.of(pairs).draw(np.random.default_rng(seed), resamples)
    deltas = []
    for t in STS_TASKS:
        rho = uncertainty.ResampledSpearman(gold[t])
        deltas.append(rho(other[t], m[t]) - rho(first[t], m[t]))
    draws = np.mean(deltas, axis=0)
    mean = float(np.mean([out[t].estimate for t in STS_TASKS]))
    low, high = np.quantile(draws, [(1 - uncertainty.LEVEL) / 2, (1 + uncertainty.LEVEL) / 2])
    p = float(((np.abs(draws - mean) >= abs(mean)).sum() + 1) / (len(draws) + 1))
    out["avg"] = uncertainty.Interval(mean, float(low), float(high), sum(out[t].n for t in STS_TASKS), p,
                                      "paired bootstrap over pairs, the tasks' shared pairs drawn jointly", draws=draws)
    return out


def standing(result: Result, claim: str) -> str:
    """What stands for a side in a claim: its seeds, its checkpoint, or its best seed's checkpoint."""
    if claim == RECIPES:
        return f"{len(result.seeds)} seeds"
    if len(result.seeds) >= 2:
        return f"best of {len(result.seeds)} seeds by STS-B dev"
    return "its checkpoint"


def table(first: Result, others: list[Result], seed: int, resamples: int):
    """One row per other reference and task: the difference, its interval, p, Holm's p, significance."""
    import pandas as pd

    rows, cache = [], {}
    for other in others:
        both = None
        if len(first.seeds) >= 2 and len(other.seeds) >= 2:
            found = by_seeds(first, other)
            both = by_seeds_and_pairs(first, other, seed, resamples)
        else:
            for r in (first, other):
                if r.checkpoint is None:
                    raise UserError(f"{r.label} has one seed and names no checkpoint: nothing to resample")
                if r.label not in cache:
                    cache[r.label] = checkpoint_similarities(r)
            found = by_pairs(cache[first.label], cache[other.label], seed, resamples)
        claim = RECIPES if len(first.seeds) >= 2 and len(other.seeds) >= 2 else CHECKPOINTS
        adjusted = uncertainty.holm({t: found[t].p for t in STS_TASKS})
        for task in ROWS:
            iv = found[task]
            rows.append({"reference": first.label, "other": other.label, "claim": claim,
                         "sides": f"{standing(other, claim)} against {standing(first, claim)}",
                         "task": SHORT_NAMES.get(task, task),
                         "delta": iv.estimate, "ci_low": iv.low, "ci_high": iv.high, "p": iv.p,
                         "p_holm": adjusted.get(task), "significant": significant(adjusted.get(task, iv.p)),
                         "n": iv.n, "method": iv.method, **extra(first, other, task, both)})
    return pd.DataFrame(rows)


def extra(first: Result, other: Result, task: str, both: dict[str, uncertainty.Interval] | None) -> dict:
    """A recipe row's interval over seeds and pairs, the seeds' share of its variance, and Cohen's
    d over the seeds (None where they do not apply)."""
    if both is None:
        return {"sp_low": None, "sp_high": None, "seed_share": None, "cohens_d": None}
    d = significance.cohens_d([v[task] for v in other.seeds.values()], [v[task] for v in first.seeds.values()])
    return {"sp_low": both[task].low, "sp_high": both[task].high, "seed_share": both[task].seed_share, "cohens_d": d}


def significant(p: float | None) -> bool:
    """p below ALPHA; a p of exactly 0 is (a resampling p that no resample reached), a missing one is not."""
    return p is not None and bool(p < uncertainty.ALPHA)


def markdown(frame, first: Result) -> str:
    lines = [f"# Against {first.label}", "",
             "Difference (other minus reference) of Spearman x100, its 95 % confidence interval and p-value against "
             "no difference; significant: Holm-adjusted p < 0.05 over the 7 tasks (the average: its own p, not "
             "adjusted). A difference whose interval holds 0 is not evidence of one."]
    about = {RECIPES: "what each recipe gives over its seeds: evidence about the recipes.",
             CHECKPOINTS: "two checkpoints over the same test pairs: nothing about the recipes (two seeds of one "
                          "recipe often differ so)."}
    for claim in (RECIPES, CHECKPOINTS):
        part = frame[frame["claim"] == claim].to_dict("records") if len(frame) else []
        if not part:
            continue
        pairs = claim == RECIPES and any(_given(r.get("sp_low")) for r in part)
        lines += ["", f"## Claims about {claim}", "", f"Each row compares {about[claim]}", ""]
        if pairs:
            lines += ["Over seeds and pairs: the interval that also counts the test pairs drawn (the pairs STS-B shares "
                      "with STS12-16 drawn jointly, STS12-16 within their subsets); seed share: the seeds' part of its "
                      "variance; d: Cohen's d over the seeds.", ""]
        head = "| other | task | Δ | 95 % CI | p | p (Holm) | significant | n |"
        head += " over seeds and pairs | seed share | d |" if pairs else ""
        lines += [head + " what stands for each side | method |", "|---" * (head.count("|") + 1) + "|"]
        for r in part:
            holm = "" if r["p_holm"] is None or (isinstance(r["p_holm"], float) and math.isnan(r["p_holm"])) \
                else f"{r['p_holm']:.3f}"
            line = (f"| {r['other']} | {r['task']} | {r['delta']:+.2f} | [{r['ci_low']:+.2f}, {r['ci_high']:+.2f}] | "
                    f"{r['p']:.3f} | {holm} | {'yes' if r['significant'] else 'no'} | {r['n']} |")
            if pairs:
                line += (f" [{r['sp_low']:+.2f}, {r['sp_high']:+.2f}] | {r['seed_share']:.2f} | {r['cohens_d']:+.2f} |"
                         if _given(r.get("sp_low")) else " | | |")
            lines.append(line + f" {r['sides']} | {r['method']} |")
    return "\n".join(lines) + "\n"


def _given(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def forest(frame, path: Path, first: Result) -> Path:
    """A forest plot: each task's difference with its interval, one colour per other reference, 0 marked."""
    plt = pyplot()

    others = list(dict.fromkeys(frame["other"]))
    tasks = list(dict.fromkeys(frame["task"]))
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(tasks) * max(1, len(others)) + 1.6), dpi=120)
    step = 0.7 / max(len(others), 1)
    for k, other in enumerate(others):
        part = frame[frame["other"] == other]
        y = [len(tasks) - 1 - tasks.index(t) + (k - (len(others) - 1) / 2) * step for t in part["task"]]
        recipes = part["claim"].iloc[0] == RECIPES  # filled circles: recipes; open squares: checkpoints
        ax.errorbar(part["delta"], y, xerr=[part["delta"] - part["ci_low"], part["ci_high"] - part["delta"]],
                    fmt="o" if recipes else "s", mfc=None if recipes else "none", capsize=3,
                    label=f"{other}: {'recipes, over seeds' if recipes else 'checkpoints, over test pairs'}")
        for yy, (_, r) in zip(y, part.iterrows()):
            if r["significant"]:
                ax.annotate("*", (r["ci_high"], yy), textcoords="offset points", xytext=(4, -4))
    ax.axvline(0, color="grey", linewidth=1, linestyle="--")
    ax.set_yticks(range(len(tasks)), list(reversed(tasks)))
    ax.set_xlabel("difference in Spearman x100  (95 % CI; * significant after Holm)")
    ax.set_title("\n".join(textwrap.wrap(f"Each task's difference against {first.label}", 70)), fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.4 / len(tasks)), ncol=1)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def log_comparison(uri: str, frame, files: list[Path], references: list[str]) -> str:
    run = Run.create(uri, COMPARISONS_EXPERIMENT, f"compare-{time.strftime('%Y%m%d-%H%M%S')}",
                     {"references": " | ".join(references)})
    with run.closing():
        run.log_params({f"reference_{i}": r for i, r in enumerate(references)})
        run.log_table(frame, "comparison.json")
        for path in files:
            run.log_file(path)
        run.complete(None, needs_checkpoint=False)
    return run.id


def parse_args(argv=None):
    p = command_parser("python -m platform.compare", __doc__, "python -m platform.compare runs:/RUN_A runs:/RUN_B")
    p.add_argument("references", nargs="+", metavar="REF",
                   help="runs:/RUN_ID, a run's or sweep's name, models:/..., or a checkpoint path; the first is the reference")
    p.add_argument("--dim", type=int, default=None, metavar="M",
                   help="compare the references at their embeddings' first M coordinates (a Matryoshka prefix); one "
                        "reference at its own: REF:dim=M (runs:/A runs:/A:dim=128 measures the prefix against the whole)")
    p.add_argument("--seed", type=int, default=None, help="the resampling's seed (default: the first run's seed, else 0)")
    p.add_argument("--resamples", type=int, default=uncertainty.RESAMPLES, help="bootstrap resamples")
    p.add_argument("--out", type=Path, default=None, help="also write comparison.csv, .md and forest.png to this folder")
    p.add_argument("--no-log", action="store_true", help=f"do not log the comparison to the {COMPARISONS_EXPERIMENT!r} experiment")
    return p.parse_args(argv)


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)
    if len(args.references) < 2:
        raise UserError("compare needs at least two references: the first, then what is measured against it")
    if args.resamples < 100:
        raise UserError(f"--resamples must be at least 100 for a 95 % interval, got {args.resamples}")
    with contextlib.ExitStack() as stack:
        results = [resolve(r, stack, args.dim) for r in args.references]
        check(results)
        first = results[0]
        seed = first.seed if args.seed is None else args.seed
        frame = table(first, results[1:], seed, args.resamples)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "comparison.md").write_text(markdown(frame, first), encoding="utf-8")
        frame.to_csv(folder / "comparison.csv", index=False)
        forest(frame, folder / "forest.png", first)
        files = [folder / n for n in ("comparison.md", "comparison.csv", "forest.png")]
        print((folder / "comparison.md").read_text(encoding="utf-8"))
        if args.out:
            out = args.out.expanduser().resolve()
            out.mkdir(parents=True, exist_ok=True)
            for f in files:
                shutil.copyfile(f, out / f.name)
            print(f"written: {', '.join(str(out / f.name) for f in files)}")
        if not args.no_log:
            uri = store.tracking_uri()
            store.check_reachable(uri)
            run_id = log_comparison(uri, frame, files, args.references)
            print(f"MLflow: {store.redact(uri)} (experiment {COMPARISONS_EXPERIMENT!r}, run {run_id})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
