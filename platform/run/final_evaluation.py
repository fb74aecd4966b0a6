"""After training: the 7 STS tasks on a best checkpoint, beside the untouched backbone (its
scores cached once per backbone and pooler). Whatever loads weights runs as a Ray task on the
run's device (``on_device``); the driver reads the checkpoint's JSON, prints and logs."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from methods.encoder import Encoder
from methods.matryoshka import parse_dims
from platform import checkpoint, settings, storage
from platform.config import smoke_reason
from platform.data import SHORT_NAMES, STS_TASKS, data_dir, load_sts
from platform.storage import cache_root, cached, encoder_key, entry_key
from platform.evaluation.mteb_tasks import metric, mteb_model, tasks_of
from platform.evaluation.mteb_tasks import evaluate as evaluate_mteb
from platform.evaluation.sts import GEOMETRY, STSEvaluator, format_table, geometry_figure, with_mean
from platform.run.ray_env import started_here
from platform.tracking import recorder, store
from platform.tracking.names import (BASELINE_TAG, DEV_GEOMETRY, MTEB_BENCHMARK_TAG, pairs_at, prefix_of, sts, sts_at,
                                     vs_backbone)
from platform.tracking.recorder import Run


# ------------------------------------------------------------------------------------------------
# Where the model is loaded: a Ray task on the run's device (a GPU node under use_gpu), or this
# process when the run has no Ray. The driver reads JSON and the data files, never weights.


def on_device(fn: Callable[..., Any], *args: Any, device: dict[str, Any], alone: bool = False) -> Any:
    """``fn(*args)`` as a Ray task that asks for what the run's workers ask (a GPU each under
    ``use_gpu``, else ``cpus_per_worker`` CPUs), where the run is on Ray; else here. ``alone``:
    nothing else of the command runs (a run's or a sweep's end); a CPU task on the local instance
    the command started (nothing else is scheduled there) then asks for all its CPUs: on CPU the
    7 tasks' encoding is most of a run's end, and a worker's share gives it one thread. Torch runs
    as many threads as the task has CPUs (``_threads_of_the_task``)."""
    if device.get("runtime", "ray") != "ray" or not _ray_ready():
        return fn(*args)
    import ray

    gpu = bool(device.get("use_gpu"))
    cpus = float(device.get("cpus_per_worker", 1))
    if alone and not gpu and started_here():
        cpus = max(cpus, float(int(ray.cluster_resources().get("CPU", 0))))
    # "DEFAULT": not inside a Tune trial's placement group, which reserves no CPU or GPU.
    task = ray.remote(num_gpus=1 if gpu else 0, num_cpus=cpus, max_retries=0, scheduling_strategy="DEFAULT")
    return ray.get(task(_threads_of_the_task).remote(fn, *args))


def _threads_of_the_task(fn: Callable[..., Any], *args: Any) -> Any:
    """(task) ``fn(*args)`` with torch's threads at the task's ``OMP_NUM_THREADS``: Ray sets it
    for each task (its CPUs, at least 1) unless the user did, but torch reads it once, when a
    worker process first imports it, and Ray reuses worker processes between tasks."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(settings.number(settings.OMP_THREADS, 1))))
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(before)


def _ray_ready() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized()


def device_of(state: dict[str, Any]) -> dict[str, Any]:
    """The run's device settings, from its checkpoint's ``state.json``."""
    config = state.get("config", {})
    return {k: config[k] for k in ("runtime", "use_gpu", "cpus_per_worker") if k in config}


def sts_test_pairs() -> dict[str, dict[str, list]]:
    """The 7 STS tasks' test pairs, and STS-B dev's under ``DEV`` (the geometry's pairs), read
    here: a task on another node has no data folder."""
    root = data_dir()
    return {**{t: load_sts(t, root).plain() for t in STS_TASKS}, DEV: load_sts("STSBenchmark", root, split="dev").plain()}


DEV = "STSBenchmark-dev"


def sts_with_geometry(encoder: Encoder, pairs: dict, progress: str) -> dict[str, float]:
    """The 7 tasks, their mean, and STS-B dev's alignment and uniformity (``pairs[DEV]``, when
    given): an untouched backbone's, which no training evaluated."""
    tasks = {t: p for t, p in pairs.items() if t != DEV}
    scores = with_mean(STSEvaluator.from_pairs(tasks)(encoder, progress=progress))
    if DEV in pairs:
        dev = STSEvaluator.from_pairs({"STSBenchmark": pairs[DEV]})
        scores.update(dev.geometry(dev.encode(encoder)))
    return scores


def _on_its_device(encoder: Encoder) -> Encoder:
    import torch

    return encoder.to("cuda") if torch.cuda.is_available() else encoder


def trained_prefixes(state: dict[str, Any]) -> tuple[int, ...]:
    """The Matryoshka prefixes a checkpoint trained, shorter than its whole vector, largest first
    (its configuration's ``matryoshka_dims``)."""
    return tuple(sorted(parse_dims(state.get("config", {}).get("matryoshka_dims", "")), reverse=True))


def score_checkpoint(location: str, pairs: dict) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """(task) The 7 STS tasks and their mean on the checkpoint at ``location``, and each task's
    per-pair cosine similarities (``pairs_at``); a Matryoshka checkpoint's also at each prefix it
    trained (``sts_at``: the same embeddings cut, cosine renormalising them)."""
    with storage.local_copy(location) as folder:
        state = checkpoint.read_state(folder)
        encoder = _on_its_device(Encoder.from_pretrained(str(checkpoint.model_dir(folder)), pooler=state["eval_pooler"]))
        tasks = {t: p for t, p in pairs.items() if t != DEV}
        evaluator = STSEvaluator.from_pairs(tasks)
        emb = evaluator.encode(encoder, progress=f"STS, {len(STS_TASKS)} tasks")
        scores = with_mean(evaluator.score(emb))
        # Its geometry is its STS-B dev evaluation's, kept in its state: no second encoding of dev.
        scores.update({k: state[DEV_GEOMETRY[k]] for k in GEOMETRY if DEV_GEOMETRY[k] in state})
        similarities = evaluator.similarities(emb)
        for dims in (d for d in trained_prefixes(state) if d < emb.shape[1]):
            scores.update({sts_at(t, dims): v for t, v in with_mean(evaluator.score(emb[:, :dims])).items()})
            similarities.update({pairs_at(t, dims): v for t, v in evaluator.similarities(emb[:, :dims]).items()})
        return scores, similarities


def score_backbone(backbone: str, pooler: str, pairs: dict, known: dict[str, dict],
                   prompt: dict | None = None) -> tuple[str, dict[str, float]]:
    """(task) The untouched backbone's key in the cache (its weights, tokenizer, pooler and device)
    and its 7-task scores: the cached ones in ``known`` (by entry name), or evaluated now. ``prompt``:
    the trained model's template (a prompt recipe's backbone is measured in it, as PromptBERT's is)."""
    encoder = _on_its_device(Encoder.from_pretrained(backbone, pooler=pooler, prompt=prompt))
    digest = encoder_key(encoder, pooler)
    found = known.get(entry_key(BASELINE, digest, baseline_params(pooler)))
    if found is not None:
        return digest, found
    return digest, sts_with_geometry(encoder, pairs, f"baseline STS, {len(STS_TASKS)} tasks")


# ------------------------------------------------------------------------------------------------
# The driver's side


def evaluate_sts(run: Run, location: str, quiet: bool = False, alone: bool = False) -> dict[str, float]:
    """The 7 STS tasks and their mean on the checkpoint at ``location`` (a folder or a URI), on
    the run's device (``alone``: as ``on_device`` says), logged on ``run`` as ``sts_<task>`` at the
    checkpoint's step; printed unless ``quiet``."""
    state = checkpoint.read_state_at(location)
    scores, similarities = on_device(score_checkpoint, location, sts_test_pairs(), device=device_of(state), alone=alone)
    prefixes = {k: v for k, v in scores.items() if prefix_of(k)}
    scores = {k: v for k, v in scores.items() if k not in prefixes}
    if not quiet:
        print(format_table(scores), flush=True)
    for dims in trained_prefixes(state):  # what a Matryoshka run is for: shown whatever ``quiet`` says
        at = {t: prefixes[sts_at(t, dims)] for t in [*STS_TASKS, "avg"] if sts_at(t, dims) in prefixes}
        if at:
            print(f"{run.info().info.run_name}, the first {dims} dimensions of its embedding (Matryoshka):\n"
                  f"{format_table(at)}", flush=True)
    recorder.log_results(run, {**{sts(k): v for k, v in scores.items()}, **prefixes}, state["step"])
    log_pair_similarities(run, similarities)
    return scores


PAIRS_ARTIFACT = "sts_pairs.npz"  # each task's per-pair cosine similarities: the evidence over seeds and pairs


def log_pair_similarities(run: Run, similarities: dict[str, np.ndarray]) -> None:
    """The run's per-pair similarities (float64, as scored: about 150 kB for the 7 tasks) as
    ``sts_pairs.npz``, what ``platform.compare`` resamples seeds and pairs from."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / PAIRS_ARTIFACT
        np.savez_compressed(path, **{t: np.asarray(v, np.float64) for t, v in similarities.items()})
        run.log_file(path)


BASELINE = "baseline_sts"


def baseline_params(pooler: str) -> dict[str, str]:
    """A baseline cache entry's parameters: the pooler, and what its scores hold (STS-B dev's geometry too)."""
    return {"pooler": pooler, "holds": "sts+geometry"}


def cached_baselines() -> dict[str, dict[str, float]]:
    """Every untouched backbone's scores cached on this machine, by cache entry name."""
    return {p.name: json.loads((p / "scores.json").read_text())
            for p in cache_root().glob(f"{BASELINE}-*") if (p / "COMPLETE").is_file() and (p / "scores.json").is_file()}


def baseline_sts(backbone: str, pooler: str, device: dict[str, Any] | None = None, alone: bool = False,
                 prompt: dict | None = None) -> dict[str, float]:
    """The 7 STS tasks and their mean of the untouched ``backbone`` with ``pooler``: what a trained
    model is measured against. A cache entry keyed by the backbone's weights, tokenizer and the
    pooler (``platform.storage``), so each backbone is evaluated once; on ``device`` (the
    run's), where the weights are loaded (``alone``: as ``on_device`` says)."""
    known = cached_baselines()
    digest, scores = on_device(score_backbone, backbone, pooler, sts_test_pairs(), known, prompt, device=device or {},
                               alone=alone)
    if entry_key(BASELINE, digest, baseline_params(pooler)) not in known:
        print(f"evaluated the untouched backbone {backbone} (pooler {pooler}) once, as the baseline", flush=True)
        cached(BASELINE, digest, baseline_params(pooler), lambda folder: (folder / "scores.json").write_text(json.dumps(scores)))
    return scores


def against_baseline(run: Run, location: str, scores: dict[str, float], quiet: bool = False,
                     alone: bool = False) -> dict[str, float]:
    """The trained model's table beside its backbone's (same pooler) and the difference, printed
    (unless ``quiet``) and logged on ``run`` (``vs_backbone/baseline_sts_<task>``, ``vs_backbone/delta_sts_<task>``: their own section of MLflow's charts, after the training curves); returns the baseline."""
    state = checkpoint.read_state_at(location)
    config = state.get("config", {})
    backbone, pooler = config.get("model", ""), state["eval_pooler"]
    baseline = baseline_sts(backbone, pooler, device_of(state), alone, state.get("eval_prompt"))
    tasks = [t for t in (*STS_TASKS, "avg", *GEOMETRY) if t in scores and t in baseline]
    lines = beside_table(backbone, baseline, scores)
    why = smoke_reason(config.get("profile", ""), backbone)
    if not quiet:
        print(f"STS (Spearman x100, pooler {pooler}), against the untouched backbone:", flush=True)
        print("\n".join(lines), flush=True)
        if all(k in scores and k in baseline for k in GEOMETRY):
            print("STS-B dev geometry (Wang & Isola's alignment and uniformity; lower is better for both):", flush=True)
            print("\n".join(beside_table(backbone, baseline, scores, GEOMETRY)), flush=True)
        if why:
            print(f"note: a smoke test, not a result ({why})", flush=True)
    recorder.log_results(run, {**{vs_backbone(t, "baseline"): baseline[t] for t in tasks},
                               **{vs_backbone(t, "delta"): scores[t] - baseline[t] for t in tasks}}, state["step"])
    run.set_tags({BASELINE_TAG: f"{backbone} (pooler {pooler}) STS avg {baseline['avg']:.2f}"} if "avg" in baseline else {})
    return baseline


def beside_table(backbone: str, baseline: dict[str, float], scores: dict[str, float],
                 columns: tuple[str, ...] = (*STS_TASKS, "avg")) -> list[str]:
    """The lines of a model's 7-task table under its untouched backbone's, and the difference
    (``columns``: STS_TASKS and their average, or ``GEOMETRY``)."""
    tasks = [t for t in columns if t in scores and t in baseline]
    names = [SHORT_NAMES.get(t, t) for t in tasks]
    width = max(14, len(backbone.split("/")[-1]) + 2)
    digits = {t: 4 if t in GEOMETRY else 2 for t in tasks}
    rows = [("", names), (backbone.split("/")[-1][: width], [f"{baseline[t]:.{digits[t]}f}" for t in tasks]),
            ("trained", [f"{scores[t]:.{digits[t]}f}" + (f" +- {scores[t + '_std']:.{digits[t]}f}" if t + "_std" in scores else "")
                         for t in tasks]),
            ("difference", [f"{scores[t] - baseline[t]:+.{digits[t]}f}" for t in tasks])]
    cols = [max(len(r[1][i]) for r in rows) for i in range(len(tasks))]
    lines = [f"{label:<{width}}| " + " | ".join(v.rjust(w) for v, w in zip(values, cols)) for label, values in rows]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def beside_block(backbone: str, baseline: dict[str, float], scores: dict[str, float]) -> str:
    """``beside_table`` as a Markdown code block (MLflow's descriptions, the registry version):
    the registry page renders Markdown tables with no cell spacing, a code block is aligned anywhere."""
    return "```text\n" + "\n".join(beside_table(backbone, baseline, scores)) + "\n```\n"


def cached_baseline(backbone: str, pooler: str, prompt: dict | None = None) -> dict[str, float] | None:
    """The untouched backbone's 7-task scores with ``pooler`` when a run has cached them on this
    machine (this device), else None: nothing is evaluated, and a backbone that cannot be loaded
    here (a hub model offline) has none."""
    known = cached_baselines()
    if not known or not backbone:
        return None
    try:
        encoder = _on_its_device(Encoder.from_pretrained(backbone, pooler=pooler, prompt=prompt))
    except Exception:  # noqa: BLE001  (not here, not loadable offline: no baseline to show)
        return None
    return known.get(entry_key(BASELINE, encoder_key(encoder, pooler), baseline_params(pooler)))


# ------------------------------------------------------------------------------------------------
# MTEB on the best checkpoint (``final_benchmark``)


def benchmark_tasks(spec: str, announce: bool = False) -> list:
    """``final_benchmark``'s tasks: a benchmark mteb names, else comma-separated task names; an
    unknown or unreachable one refused in one line. ``announce``: print what it will embed."""
    import mteb

    names = {b.name for b in mteb.get_benchmarks()}
    tasks = tasks_of(spec, []) if spec in names else tasks_of(None, [t.strip() for t in spec.split(",") if t.strip()])
    if announce:
        texts = chars = 0
        for task in tasks:
            stats = task.metadata.descriptive_stats or {}
            for split in task.metadata.eval_splits:
                texts += (stats.get(split) or {}).get("num_samples", 0) or 0
                chars += (stats.get(split) or {}).get("number_of_characters", 0) or 0
        print(f"final_benchmark {spec}: {len(tasks)} MTEB task(s) after the STS tasks, {texts:,} texts and "
              f"{chars / 1e6:,.0f} M characters to embed (MTEB(eng, v2): an estimated half hour to an hour of one GPU "
              "for bert-base)", flush=True)
    return tasks


def score_benchmark(location: str, spec: str) -> tuple[dict[str, float], dict[str, str]]:
    """(task) MTEB on the checkpoint at ``location``: the scores, and each task's result JSON by file name."""
    with storage.local_copy(location) as folder, tempfile.TemporaryDirectory() as out:
        state = checkpoint.read_state(folder)
        encoder = _on_its_device(Encoder.from_pretrained(str(checkpoint.model_dir(folder)), pooler=state["eval_pooler"]))
        model = mteb_model(encoder, state["eval_pooler"], Path(location).name)
        scores = evaluate_mteb(model, benchmark_tasks(spec), Path(out))
        return scores, {p.name: p.read_text() for p in Path(out).glob("*.json")}


def evaluate_benchmark(run: Run, location: str, alone: bool = True) -> dict[str, float] | None:
    """``final_benchmark`` (the checkpoint's configuration) on the checkpoint at ``location``, on the
    run's device: printed, logged on ``run`` (``mteb_<task>``, ``mteb_mean``, the results as
    ``mteb/<task>.json``, the tag ``mteb_benchmark``). None when the configuration names none."""
    state = checkpoint.read_state_at(location)
    spec = state.get("config", {}).get("final_benchmark")
    if not spec:
        return None
    print(f"MTEB {spec} on the best checkpoint ...", flush=True)
    scores, results = on_device(score_benchmark, location, spec, device=device_of(state), alone=alone)
    print("\n".join(f"  {task:<24} {value:6.2f}" for task, value in scores.items()), flush=True)
    recorder.log_results(run, {metric(k): v for k, v in scores.items()}, state["step"])
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in results.items():
            (Path(tmp) / name).write_text(text)
        run.log_folder(Path(tmp), "mteb")
    run.set_tags({MTEB_BENCHMARK_TAG: spec})
    return scores


# ------------------------------------------------------------------------------------------------
# The geometry of what a run trained, drawn


def geometry_trajectories(uri: str, run_id: str) -> dict[str, list[tuple[int, float, float]]]:
    """``name -> [(step, alignment, uniformity), ...]`` of each run under ``run_id`` that trained
    (its seeds' or trials' runs; itself when none is nested), from their STS-B dev evaluations."""
    client = store.client(uri)

    def leaves(rid: str) -> list:
        children = store.child_runs(uri, rid)
        return [leaf for child in children for leaf in leaves(child.info.run_id)] if children else [client.get_run(rid)]

    out = {}
    for run in leaves(run_id):
        history = {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, name)}
                   for key, name in DEV_GEOMETRY.items()}
        points = [(step, a, history["uniformity"][step]) for step, a in sorted(history["alignment"].items())
                  if step in history["uniformity"]]
        if points:
            out[run.info.run_name or run.info.run_id[:8]] = points
    return out


def log_geometry(run: Run, title: str = "") -> Path | None:
    """SimCSE's Fig. 2 of what ``run`` trained (``geometry_trajectories``), logged as ``plots/geometry.png``."""
    trajectories = geometry_trajectories(run.uri, run.id)
    if not trajectories:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = geometry_figure(trajectories, Path(tmp) / "geometry.png", title)
        run.log_file(path, "plots")
    return path
