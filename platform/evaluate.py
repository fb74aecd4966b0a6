"""``python -m platform.evaluate MODEL [--pooler P] [--tasks ...] [--benchmark NAME] [--json OUT]``.

MODEL is a Hugging Face model name or directory, a training checkpoint (its ``model/`` folder and
recorded evaluation pooler are used), a sentence-transformers folder, the alias ``minilm``, an
MLflow run (``runs:/RUN_ID``: its best checkpoint; the scores are logged on it) or a registered or
logged model (``models:/NAME/VERSION``, ``models:/m-...``).
Prints the SentEval STS table (Spearman x100 of cosine similarities) and optionally writes JSON;
``--benchmark`` (an MTEB benchmark) and ``mteb:NAME`` tasks run through the ``mteb`` package with
the same encoder (``platform.evaluation.mteb_tasks``); ``--log-to RUN_ID`` records transfer,
clustering and MTEB scores on a training run for ``platform.report`` (with ``--dim M``, the STS table
at that prefix too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

from methods.encoder import POOLERS, PROMPT_FILE, Encoder
from platform.config import TrainConfig
from platform.console import command_parser
from platform.data import STS_TASKS
from platform.errors import UserError, cli_main
from platform.evaluation.clustering import CLUSTER_SETS, PAPER_SETS, embed, kmeans_accuracy, load_labelled, protocol
from platform.evaluation.classifier import CLASSIFIERS
from platform.evaluation.embedding_cache import EmbeddingStore
from platform.evaluation.mteb_tasks import metric, mteb_model, tasks_of
from platform.evaluation.mteb_tasks import evaluate as evaluate_mteb
from platform.evaluation.sts import STSEvaluator, format_table, with_mean
from platform.evaluation.transfer import TRANSFER_TASKS, evaluate_transfer, task_sentences
from platform import checkpoint, storage
from platform.storage import cache_root
from platform.run.final_evaluation import beside_table, cached_baseline, trained_prefixes
from platform.tracking import recorder, store
from platform.tracking.names import (BEST_CHECKPOINT_TAG, MTEB_BENCHMARK_TAG, SUPERVISION_TAG, at_prefix, sts_at,
                                     supervision_note)
from platform.tracking.recorder import Run

CLUSTER_TASKS = [f"cluster:{name}" for name in CLUSTER_SETS]
TASK_GROUPS = {"sts": list(STS_TASKS), "clustering": ["cluster:TREC"],
               "clustering-paper": [f"cluster:{name}" for name in PAPER_SETS], "transfer": list(TRANSFER_TASKS)}


def resolve_model(model: str, pooler: str | None) -> tuple[str, str]:
    """(path or name to load, pooler) for any of the accepted MODEL forms."""
    path = Path(model)
    if checkpoint.exists(str(path)):
        state = checkpoint.read_state(path)
        return str(checkpoint.model_dir(path)), pooler or state["eval_pooler"]
    if (path / "modules.json").is_file():  # sentence-transformers folder: the transformer is its first module
        modules = json.loads((path / "modules.json").read_text())
        first = path / modules[0].get("path", "")
        pooling = next((path / m["path"] for m in modules if m.get("type", "").endswith("Pooling")), None)
        default = "avg"
        if pooling is not None and (pooling / "config.json").is_file():
            mode = json.loads((pooling / "config.json").read_text()).get("pooling_mode", "mean")
            mode = mode[0] if isinstance(mode, list) else mode
            default = {"cls": "cls_before_pooler", "mean": "avg"}.get(mode, "avg")
            if any(m.get("type", "").endswith("Dense") for m in modules) and mode == "cls":
                default = "cls"
        return str(first), pooler or default
    if path.exists() and not (path / "config.json").is_file():
        raise UserError(f"{model} is not a model directory (no config.json), checkpoint or sentence-transformers folder")
    if (path / PROMPT_FILE).is_file():  # a prompt recipe's export embeds at its template's [MASK]
        return model, pooler or "mask"
    return model, pooler or "cls_before_pooler"


MTEB_PREFIX = "mteb:"


def expand_tasks(tasks: list[str]) -> list[str]:
    out: list[str] = []
    for t in (x for item in tasks for x in item.split(",") if x):
        if t.startswith(MTEB_PREFIX):  # checked against mteb's names when the model is loaded
            out += [t] if t not in out else []
            continue
        for name in TASK_GROUPS.get(t.lower(), [t]):
            if name not in STS_TASKS and name not in CLUSTER_TASKS and name not in TRANSFER_TASKS:
                choices = [*TASK_GROUPS, *STS_TASKS, *CLUSTER_TASKS, *TRANSFER_TASKS, "mteb:<MTEB task>"]
                raise UserError(f"unknown task {t!r}; choose from {', '.join(choices)}")
            if name not in out:
                out.append(name)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = command_parser("python -m platform.evaluate", __doc__, "python -m platform.evaluate runs/una-20261124-101500/best --tasks sts transfer")
    p.add_argument("model")
    p.add_argument("--pooler", choices=POOLERS, default=None, help="default: the checkpoint's, else cls_before_pooler")
    p.add_argument("--tasks", nargs="+", default=None,
                   help="task names, or the groups 'sts' (default without --benchmark), 'transfer' (SentEval), "
                        "'clustering' (K-means on TREC, offline) and 'clustering-paper' (VaSCL's eight sets: python -m "
                        "platform.data fetch clustering); mteb:NAME is an MTEB task (mteb:STS12,mteb:ArguAna)")
    p.add_argument("--benchmark", default=None, metavar="NAME",
                   help="an MTEB benchmark, e.g. 'MTEB(eng, v2)' or NanoBEIR; its STS tasks run from the local "
                        "SentEval files, the rest need the Hugging Face hub")
    p.add_argument("--json", dest="json_out", default=None, help="write the scores to this JSON file")
    p.add_argument("--log-to", default=None, metavar="RUN_ID",
                   help="record the transfer, clustering and MTEB scores on this MLflow run (as transfer_<task>, "
                        "cluster_<set>, mteb_<task>; with --dim M under dim<M>/, the STS table too), where "
                        "platform.report and compare find them")
    p.add_argument("--dim", type=int, default=None, metavar="M",
                   help="evaluate the first M coordinates of each embedding, renormalised (a Matryoshka prefix), on "
                        "every task; a checkpoint trained with matryoshka_dims shows the STS table at each of them "
                        "without it")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--transfer-limit", type=int, default=None, help="transfer tasks on a slice of N training sentences")
    p.add_argument("--transfer-classifier", choices=CLASSIFIERS, default="pytorch",
                   help="SentEval's 'test' setting: its PyTorch logistic regression (default, as SimCSE and AugCSE "
                        "report) or scikit-learn's LogisticRegression with SentEval's C grids")
    p.add_argument("--transfer-jobs", type=int, default=None,
                   help="processes fitting scikit-learn's classifiers in parallel (default: one per CPU; same result); "
                        "the PyTorch classifier's fits run as one batched program")
    args = p.parse_args(argv)
    args.tasks = args.tasks if args.tasks is not None else ([] if args.benchmark else ["sts"])
    for option, value in (("--batch-size", args.batch_size), ("--transfer-jobs", args.transfer_jobs),
                          ("--transfer-limit", args.transfer_limit), ("--dim", args.dim)):
        if value is not None and value < 1:
            raise UserError(f"{option} must be >= 1, got {value}")
    return args


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        args.model, run_id = reference(args.model, stack)
        args.log_to = args.log_to or run_id
        return evaluate(args)


def reference(model: str, stack: contextlib.ExitStack) -> tuple[str, str | None]:
    """``(what resolve_model takes, the run to log on)`` for MLflow references: ``runs:/RUN_ID``
    (the run's best checkpoint, copied here when it is a URI) and ``models:/...`` (downloaded);
    other forms unchanged."""
    if not model.startswith(("runs:/", "models:/")):
        return model, None
    from mlflow.exceptions import MlflowException

    uri = store.tracking_uri()
    try:
        if model.startswith("runs:/"):
            run_id = model[len("runs:/"):].strip("/").split("/")[0]
            best = store.client(uri).get_run(run_id).data.tags.get(BEST_CHECKPOINT_TAG)
            if not best:
                raise UserError(f"MLflow run {run_id} names no best checkpoint (tag best_checkpoint): it has not evaluated")
            return str(stack.enter_context(storage.local_copy(best))), run_id
        import mlflow.artifacts

        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="model-")))
        path = Path(mlflow.artifacts.download_artifacts(artifact_uri=model, dst_path=str(folder), tracking_uri=uri))
    except MlflowException as exc:
        raise UserError(f"{model}: {str(exc).splitlines()[0][:300]}") from None
    found = [p.parent for p in sorted(path.rglob("modules.json"))]
    if not found:
        raise UserError(f"{model} holds no sentence-transformers model (no modules.json)")
    return str(found[0]), None


def evaluate(args) -> int:
    tasks = expand_tasks(args.tasks)
    if args.log_to:
        store.check_run(store.tracking_uri(), args.log_to)  # before minutes of evaluation
    sts_tasks = [t for t in tasks if t in STS_TASKS]
    cluster_sets = {t.split(":", 1)[1]: load_labelled(t.split(":", 1)[1]) for t in tasks if t in CLUSTER_TASKS}
    evaluator = STSEvaluator(sts_tasks, batch_size=args.batch_size) if sts_tasks else None  # data errors first
    mteb_names = [t[len(MTEB_PREFIX):] for t in tasks if t.startswith(MTEB_PREFIX)]
    mteb_tasks = tasks_of(args.benchmark, mteb_names) if args.benchmark or mteb_names else []  # refusals first
    name, pooler = resolve_model(args.model, args.pooler)
    encoder = Encoder.from_pretrained(name, pooler=pooler)
    try:
        encoder.truncated(args.dim)
    except ValueError as exc:
        raise UserError(f"--dim {args.dim}: {exc}") from None
    what = f" (its first {args.dim} dimensions)" if encoder.truncate_dim else ""
    supervision = supervision_of(args.model)
    transfer_tasks = [t for t in tasks if t in TRANSFER_TASKS]
    embeddings = EmbeddingStore(encoder, pooler, batch_size=args.batch_size)
    if transfer_tasks:  # every task's sentences encoded at once: what several tasks share, once
        wanted = [s for t in transfer_tasks for s in task_sentences(t, limit=args.transfer_limit)]
        embeddings.embed(wanted, progress=f"encoding {len(set(wanted))} sentences")
        print(f"embeddings: {len(set(wanted))} distinct sentences, {embeddings.encoded} encoded now, the rest from "
              f"{embeddings.folder}", flush=True)
    scores: dict[str, float] = {}
    if evaluator is not None:
        import torch

        emb = torch.from_numpy(embeddings.embed(evaluator.sentences, progress="STS"))
        scores.update(with_mean(evaluator.score(emb)))
        label = supervision_note({SUPERVISION_TAG: supervision}) if supervision != "unknown" else ""
        print(f"{args.model}{what} (pooler {pooler}){label}: Spearman x100, "
              "cosine, SentEval 'all' setting", file=sys.stdout)
        print(format_table(scores))
        if not what:
            print_beside_backbone(args.model, pooler, scores)
            scores.update(print_prefixes(args.model, evaluator, emb))
    for task in transfer_tasks:
        acc = evaluate_transfer(task, embeddings.embed, limit=args.transfer_limit, classifier=args.transfer_classifier,
                                jobs=args.transfer_jobs)
        scores[task] = acc
        print(f"transfer {task}: accuracy {acc:.2f} (SentEval protocol, {args.transfer_classifier} logistic "
              f"regression on frozen embeddings)", flush=True)
    for set_name, (texts, labels) in cluster_sets.items():
        result = kmeans_accuracy(embed(encoder, texts, set_name, args.batch_size), labels)
        scores[f"cluster:{set_name}"] = result["accuracy"]
        print(f"clustering {set_name} ({len(texts)} sentences, {labels.max() + 1} classes): K-means accuracy "
              f"{result['accuracy']:.2f} +- {result['std']:.2f} (Hungarian matching, 10 seeds of 10 restarts; "
              f"{protocol(set_name).describe()})")
    mteb_scores, mteb_folder = run_mteb(args, encoder, pooler, mteb_tasks) if mteb_tasks else ({}, None)
    scores.update({f"{MTEB_PREFIX}{k}": v for k, v in mteb_scores.items()})
    if args.json_out:
        storage.write_json(args.json_out, {"model": args.model, "pooler": pooler, "supervision": supervision, "scores": scores})
    if args.log_to:
        log_scores(args.log_to, scores, mteb_folder, args.benchmark, encoder.truncate_dim)
    return 0


def supervision_of(model: str) -> str:
    """A training checkpoint's ``unsupervised`` or ``teacher-assisted (MODEL)`` (its recipe's, from its
    configuration); ``unknown`` for any other model, or a configuration this code cannot read."""
    if not checkpoint.exists(str(model)):
        return "unknown"
    try:
        return TrainConfig.from_flat(checkpoint.read_state(Path(model)).get("config", {})).build_recipe().supervision
    except Exception:  # noqa: BLE001 - an older run's keys: the label is not known, the scores still are
        return "unknown"


def print_prefixes(model: str, evaluator: STSEvaluator, emb) -> dict[str, float]:
    """A checkpoint trained with Matryoshka prefixes: the STS table at each (``dim<M>/<task>``),
    from the whole vectors' embeddings cut."""
    if not checkpoint.exists(str(model)):
        return {}
    out = {}
    for dims in (d for d in trained_prefixes(checkpoint.read_state(Path(model))) if d < emb.shape[1]):
        at = with_mean(evaluator.score(emb[:, :dims]))
        print(f"its first {dims} dimensions (Matryoshka):\n{format_table(at)}")
        out.update({at_prefix(task, dims): v for task, v in at.items()})
    return out


def run_mteb(args, encoder: Encoder, pooler: str, tasks: list) -> tuple[dict[str, float], Path]:
    """The MTEB tasks on ``encoder``, named by the model's lineage: a checkpoint's folder, else the
    model's name, with the digest of its weights, tokenizer, pooler and prompt as its revision."""
    label = Path(args.model).name if checkpoint.exists(str(args.model)) else str(args.model)
    model = mteb_model(encoder, pooler, label, batch_size=args.batch_size)
    folder = cache_root() / "mteb" / model.mteb_model_meta.revision
    what = f"MTEB {args.benchmark}: " if args.benchmark else "MTEB: "
    dims = f", its first {encoder.truncate_dim} dimensions" if encoder.truncate_dim else ""
    print(f"{what}{len(tasks)} task(s) through mteb, model platform/{label} (pooler {pooler}{dims})", flush=True)
    scores = evaluate_mteb(model, tasks, folder)
    width = max(len(t) for t in scores)
    print("\n".join(f"{task:<{width}}  {value:6.2f}" for task, value in scores.items()))
    print(f"mean over {len(scores) - 1} task(s); each task's result: {folder}/<task>.json", flush=True)
    return scores, folder


def print_beside_backbone(model: str, pooler: str, scores: dict[str, float]) -> None:
    """A training checkpoint's scores beside its untouched backbone's (same pooler), when a run
    cached those on this machine; the 7 tasks all scored, else nothing."""
    if not checkpoint.exists(str(model)) or set(STS_TASKS) - set(scores):
        return
    state = checkpoint.read_state(Path(model))
    baseline = cached_baseline(state.get("config", {}).get("model", ""), pooler, state.get("eval_prompt"))
    backbone = state.get("config", {}).get("model", "")
    if baseline is None:
        print(f"(no cached scores of the untouched backbone {backbone} with pooler {pooler} on this machine: "
              "a run's final evaluation caches them)")
        return
    print(f"against the untouched backbone (pooler {pooler}, from the cache):")
    print("\n".join(beside_table(backbone, baseline, scores)))


def log_scores(run_id: str, scores: dict[str, float], mteb_folder: Path | None = None,
               benchmark: str | None = None, dims: int | None = None) -> None:
    """The transfer, clustering and MTEB scores on an MLflow run (``transfer_<task>``,
    ``cluster_<set>``, ``mteb_<task>`` and ``mteb_mean``; at a Matryoshka prefix ``dim<M>/...``),
    MTEB's per-task results as the artifacts ``mteb/<task>.json`` (``dim<M>/mteb/``), and the
    benchmark's name as the tag ``mteb_benchmark``. At a prefix, the STS table too
    (``dim<M>/sts_<task>``, which ``compare REF:dim=M`` reads) unless the run's own final
    evaluation scored it (a trained prefix); the whole vector's is the final evaluation's."""
    logged = {at_prefix(metric_name(k), dims): v for k, v in scores.items()
              if k in TRANSFER_TASKS or k.startswith(("cluster:", MTEB_PREFIX))}
    run = Run(store.tracking_uri(), run_id)
    if dims:
        held = run.info().data.metrics
        logged.update({sts_at(k, dims): v for k, v in scores.items()
                       if k in (*STS_TASKS, "avg") and sts_at(k, dims) not in held})
    recorder.log_results(run, logged)
    if mteb_folder is not None:
        for result in sorted(mteb_folder.glob("*.json")):
            run.log_file(result, at_prefix("mteb", dims))
        run.set_tags({MTEB_BENCHMARK_TAG: benchmark or "tasks"})
    print(f"logged {', '.join(logged) or 'nothing (no transfer, clustering or MTEB task)'} to MLflow run {run_id}")


def metric_name(key: str) -> str:
    """A score's MLflow metric: ``transfer_<task>``, ``cluster_<set>``, ``mteb_<task>`` (characters
    MLflow does not take in a name become ``_``)."""
    if key.startswith(MTEB_PREFIX):
        return metric(key[len(MTEB_PREFIX):])
    return key.replace(":", "_") if key.startswith("cluster:") else f"transfer_{key}"


if __name__ == "__main__":
    raise SystemExit(main())
