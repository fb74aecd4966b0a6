"""``python -m platform.train METHOD [--profile P] [--set key=value ...]``: one tracked run.

The driver validates everything it can before Ray starts (configuration, data, backbone, MLflow),
builds the Ray Data pipeline (corpus -> the method's augmentation), fits a Ray Train
``TorchTrainer`` around ``train_loop_per_worker``, then evaluates the best checkpoint (by STS-B
dev) on the 7 STS tasks and logs everything to one MLflow run.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from methods.base import Method, method_class
from methods.encoder import Encoder, load_tokenizer
from platform.config import TrainConfig, available_profiles, parse_sets
from platform.data import STS_TASKS, DataError, data_dir, load_sts, read_corpus, resolve_corpus
from platform.errors import UserError, cli_main
from platform.loop import CHECKPOINT_MODEL, DEV_METRIC, read_checkpoint_state, train_loop_per_worker
from platform import tracking
from platform.cache import prepared_state


# ------------------------------------------------------------------------------------------------
# Checks that run before any Ray work


def preflight(cfg: TrainConfig, final_eval: bool, check_state: bool = True) -> list[str]:
    """Validate data, corpus and backbone; return the corpus sentences (read once, here)."""
    root = data_dir()
    load_sts("STSBenchmark", root, split="dev")
    if final_eval:
        for task in STS_TASKS:
            load_sts(task, root)
    corpus = resolve_corpus(cfg.corpus)
    cfg.corpus = str(corpus)  # absolute: workers run in a copy of the repository
    sentences = read_corpus(corpus, limit=cfg.max_sentences or None)
    if len(sentences) < cfg.batch_size:
        raise DataError(f"corpus {corpus} has {len(sentences)} sentences, fewer than one batch of {cfg.batch_size}")
    load_tokenizer(cfg.model)
    # Corpus statistics once, here: errors surface before Ray, and trials find them cached.
    method = method_class(cfg.method)(cfg.params)
    state = prepared_state(method, sentences)
    if check_state:
        method.check_state(state)
    return sentences


def build_dataset(method: Method, sentences: list[str], cfg: TrainConfig):
    """The Ray Data pipeline feeding the workers: corpus rows -> the method's CPU augmentation."""
    import pyarrow as pa
    import ray.data

    state = prepared_state(method, sentences)
    method.check_state(state)
    ds = ray.data.from_arrow(pa.table({"sentence": sentences}))
    if type(method).augment is not Method.augment:
        ds = ds.map_batches(
            method.augment, fn_kwargs={"state": state}, batch_format="numpy", batch_size=1024, num_cpus=cfg.augment_cpus
        )
    return ds


# ------------------------------------------------------------------------------------------------
# One training run on Ray Train


def fit(
    cfg: TrainConfig,
    sentences: list[str],
    *,
    uri: str | None,
    run_id: str | None,
    storage: Path,
    name: str,
    tune_callback: bool = False,
) -> dict[str, Any]:
    """Fit a TorchTrainer; return the best dev score and the persisted best checkpoint path."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    method = method_class(cfg.method)(cfg.params)
    loop_config = {
        **cfg.flat(),
        "_ray": True,
        "_num_sentences": len(sentences),
        "_mlflow_uri": uri,
        "_mlflow_run_id": run_id,
    }
    resources = {"CPU": cfg.cpus_per_worker}
    if cfg.use_gpu:
        resources["GPU"] = 1
    callbacks = []
    if tune_callback:
        from ray.tune.integration.ray_train import TuneReportCallback

        callbacks.append(TuneReportCallback())
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(
            num_workers=cfg.num_workers, use_gpu=cfg.use_gpu, resources_per_worker=resources
        ),
        torch_config=TorchConfig(backend="nccl" if cfg.use_gpu else "gloo"),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=str(storage),
            # Rank 0 reports a checkpoint only when STS-B dev improves, so the one kept is the best.
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1),
            callbacks=callbacks,
        ),
        datasets={"train": build_dataset(method, sentences, cfg)},
    )
    result = trainer.fit()
    checkpoint = result.checkpoint
    return {
        "best_" + DEV_METRIC: (result.metrics or {}).get("best_" + DEV_METRIC),
        "best_checkpoint": checkpoint.path if checkpoint is not None else None,
        "checkpoint": checkpoint,
        "metrics": dict(result.metrics or {}),
    }


def finalize(uri: str, run_id: str, checkpoint_dir: str | Path, log_to: list[str] | None = None) -> dict[str, float]:
    """Evaluate a checkpoint on the 7 STS tasks; log the table and the model in both formats."""
    from platform.export import ExportUnsupported, export_sentence_transformers
    from platform.sts import STSEvaluator, format_table, with_mean

    checkpoint_dir = Path(checkpoint_dir)
    state = read_checkpoint_state(checkpoint_dir)
    pooler = state["eval_pooler"]
    encoder = Encoder.from_pretrained(str(checkpoint_dir / CHECKPOINT_MODEL), pooler=pooler)
    scores = with_mean(STSEvaluator()(encoder))
    print(format_table(scores), flush=True)
    c = tracking.client(uri)
    for target in [run_id, *(log_to or [])]:
        tracking.log_metrics(uri, target, {f"sts_{k}": v for k, v in scores.items()}, state["step"])
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "sts_results.json"
        results.write_text(
            json.dumps({"scores": scores, "pooler": pooler, "step": state["step"], DEV_METRIC: state[DEV_METRIC]}, indent=2)
        )
        c.log_artifact(run_id, str(results))
        c.log_artifacts(run_id, str(checkpoint_dir / CHECKPOINT_MODEL), "best_checkpoint/hf")
        try:
            st_dir = export_sentence_transformers(checkpoint_dir / CHECKPOINT_MODEL, Path(tmp) / "st", pooler)
            c.log_artifacts(run_id, str(st_dir), "best_checkpoint/sentence-transformers")
        except ExportUnsupported as exc:
            c.set_tag(run_id, "sentence_transformers_export", f"skipped: {exc}")
    c.set_tag(run_id, "best_step", str(state["step"]))
    return scores


def run_tags(cfg: TrainConfig) -> dict[str, str]:
    return {"method": cfg.method, "profile": cfg.profile, "model": cfg.model}


def resolve_storage(cfg: TrainConfig) -> Path:
    storage = Path(cfg.output_dir).expanduser().resolve()
    try:
        storage.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"output_dir {storage}: cannot create it ({exc.strerror})") from None
    probe = storage / ".write-test"
    try:
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"output_dir {storage} is not writable ({exc.strerror})") from None
    return storage


# ------------------------------------------------------------------------------------------------
# CLI


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m platform.train", description=__doc__.splitlines()[0])
    p.add_argument("method")
    p.add_argument("--profile", default="local", help=f"one of {', '.join(available_profiles())}")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE", help="override a config value")
    return p.parse_args(argv)


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = TrainConfig.build(args.method, args.profile, parse_sets(args.sets))
    sentences = preflight(cfg, cfg.final_eval)
    storage = resolve_storage(cfg)
    uri = tracking.tracking_uri()
    tracking.check_reachable(uri)

    from platform.ray_env import init_ray

    name = f"{cfg.method}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_id = tracking.start_run(uri, cfg.method, name, run_tags(cfg))
    status = "FAILED"
    try:
        tracking.log_params(uri, run_id, cfg.flat())
        init_ray()
        out = fit(cfg, sentences, uri=uri, run_id=run_id, storage=storage, name=name)
        if out["checkpoint"] is None:
            raise UserError("training finished without a checkpoint (no STS-B dev evaluation ran)")
        with out["checkpoint"].as_directory() as ckpt:
            tracking.client(uri).set_tag(run_id, "best_checkpoint", out["best_checkpoint"])
            if cfg.final_eval:
                finalize(uri, run_id, ckpt)
        status = "FINISHED"
        print(f"run {run_id}: best {DEV_METRIC}={out['best_' + DEV_METRIC]:.2f}, checkpoint {out['best_checkpoint']}")
        print(f"MLflow: {uri} (experiment {cfg.method!r}, run {run_id})")
        return 0
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        tracking.end_run(uri, run_id, status)


if __name__ == "__main__":
    raise SystemExit(main())
