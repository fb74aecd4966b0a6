"""The training loop without Ray: the same code a GPU box without Ray runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from platform.config import TrainConfig
from platform.run.loop import local_batches, train_loop_per_worker
from tests.helpers import ROOT


def test_plain_loop_trains_and_keeps_best_checkpoint(tiny_model, small_corpus, tmp_path):
    cfg = TrainConfig.build(
        "simcse", "local",
        {"model": str(tiny_model), "corpus": str(small_corpus), "batch_size": 16, "max_steps": 6,
         "eval_steps": 3, "num_workers": 1, "output_dir": str(tmp_path)},
    )
    out = train_loop_per_worker(cfg.flat())
    assert out["steps"] == 6 and out["best_step"] in (3, 6)
    from platform.checkpoint import best_under

    best = Path(best_under(str(tmp_path / "local"))[0])
    state = json.loads((best / "state.json").read_text())
    assert state["step"] == out["best_step"]
    assert abs(state["stsb_dev_spearman"] - out["best_stsb_dev_spearman"]) < 1e-9
    assert state["eval_pooler"] == "cls_before_pooler"
    assert (best / "model" / "model.safetensors").is_file()


def test_workers_split_each_global_batch():
    cfg = TrainConfig.build("simcse", "local", {"batch_size": 4, "num_workers": 2})
    sentences = {"sentence": [f"s{i}" for i in range(10)]}
    one = [list(b["sentence"]) for b in local_batches(sentences, cfg, 0, 1, epoch=0)]
    r0 = [list(b["sentence"]) for b in local_batches(sentences, cfg, 0, 2, epoch=0)]
    r1 = [list(b["sentence"]) for b in local_batches(sentences, cfg, 1, 2, epoch=0)]
    assert len(one) == 2  # drop_last
    assert [a + b for a, b in zip(r0, r1)] == one
    assert [list(b["sentence"]) for b in local_batches(sentences, cfg, 0, 1, epoch=1)] != one


def test_a_run_restored_at_its_end_reports_its_last_state_once(tiny_model, small_corpus, tmp_path, mlflow_uri):
    """A fit continued after it had trained to its end (``--resume`` of a trial cut just after its
    last step) evaluates and reports that state once: Tune expects a result from every trial. Its
    report carries the state's points again, and the run's writer sends each (key, step) once."""
    from platform.run.loop import WorkerContext
    from platform.tracking.recorder import Run
    from platform.tracking.writer import RunWriter, points_in
    from platform.tracking.store import client

    cfg = TrainConfig.build("simcse", "local", {"model": str(tiny_model), "corpus": str(small_corpus), "batch_size": 8,
                                                "max_steps": 4, "eval_steps": 2, "runtime": "process", "num_workers": 1})
    run = Run.create(mlflow_uri, "simcse", "fit", {})
    reports = []

    def context(writer):
        def take(metrics):
            reports.append(points_in(metrics))
            writer.log(run.id, reports[-1])
        return WorkerContext(cfg=cfg, run_id=run.id, run_dir=str(tmp_path / "fit"), on_report=take)

    first_writer = RunWriter(mlflow_uri)
    first = train_loop_per_worker(context(first_writer))
    assert first_writer.flush(60)
    again_writer = RunWriter(mlflow_uri)  # a new process: what MLflow holds is read before it sends
    again = train_loop_per_worker(context(again_writer))
    assert again_writer.flush(60)
    assert first["steps"] == again["steps"] == 4 and again["best_stsb_dev_spearman"] == first["best_stsb_dev_spearman"]
    assert len(reports) == 3 and {p[3] for p in reports[2] if p[0] == "stsb_dev_spearman"} == {2, 4}  # replayed
    history = client(mlflow_uri).get_metric_history(run.id, "stsb_dev_spearman")
    assert sorted(m.step for m in history) == [2, 4]
    states = [p for p in (tmp_path / "fit").glob("checkpoint_*") if (p / "train_state.pt").is_file()]
    assert max(json.loads((p / "state.json").read_text())["step"] for p in states) == 4


def test_the_checkpoint_policy_writes_the_state_when_due_the_model_when_improved():
    """``checkpoint_minutes`` apart, at an epoch's first evaluation and at the last step: the full
    state; between them the model when STS-B dev improved, nothing otherwise."""
    import time

    from platform.checkpoint import Kept, Policy

    policy = Policy(minutes=15)
    assert policy.kind(improved=True, epoch=0, last=False) == "model"
    assert policy.kind(improved=False, epoch=0, last=False) is None
    assert policy.kind(improved=False, epoch=1, last=False) == "state"  # a new epoch
    assert policy.kind(improved=False, epoch=0, last=True) == "state"
    policy.since = time.monotonic() - 15 * 60
    assert policy.kind(improved=False, epoch=0, last=False) == "state"
    policy.wrote_state(epoch=1)
    assert policy.kind(improved=False, epoch=1, last=False) is None
    assert Policy(minutes=0).kind(improved=False, epoch=0, last=False) == "state"

    kept = Kept()
    kept.wrote("m2", "model", improved=True)
    kept.wrote("s4", "state", improved=False)
    assert kept.names() == {"m2", "s4"}  # the best as of the state is m2
    kept.wrote("m5", "model", improved=True)
    assert kept.names() == {"m2", "s4", "m5"}  # a restart from s4 falls back to m2
    kept.wrote("s8", "state", improved=False)
    assert kept.names() == {"s8", "m5"}


def test_between_states_an_evaluation_writes_the_model_only_if_it_improves(tiny_model, small_corpus, tmp_path):
    """The process runtime under the paper profile's policy: what stays at the end is the last
    state and the best model, the best without the optimizer's state unless it is the last."""
    from platform.checkpoint import best_under

    cfg = TrainConfig.build("simcse", "local", {
        "model": str(tiny_model), "corpus": str(small_corpus), "batch_size": 16, "max_steps": 6, "eval_steps": 1,
        "num_workers": 1, "output_dir": str(tmp_path), "checkpoint_minutes": 60})
    out = train_loop_per_worker(cfg.flat())
    folders = {int(p.name.split("_")[1]): p for p in (tmp_path / "local").glob("checkpoint_*")}
    assert set(folders) == {6, out["best_step"]}
    assert (folders[6] / "train_state.pt").is_file()
    best, dev = best_under(str(tmp_path / "local"))
    assert Path(best) == folders[out["best_step"]] and (Path(best) / "model").is_dir()
    assert (Path(best) / "train_state.pt").is_file() == (out["best_step"] == 6)
    assert abs(dev - out["best_stsb_dev_spearman"]) < 1e-9


def test_pruning_empties_what_is_not_kept_up_to_the_committed_step(tmp_path):
    """A folder Ray Train lists stays, emptied, with a note; a newer one (still uploading) is left
    alone; ``whole`` removes the folders too."""
    from platform.checkpoint import prune

    for name in ("checkpoint_00000001_a", "checkpoint_00000002_b", "checkpoint_00000003_c"):
        (tmp_path / name / "model").mkdir(parents=True)
        (tmp_path / name / "state.json").write_text("{}")
    prune(str(tmp_path), {"checkpoint_00000001_a"}, up_to=2)
    assert (tmp_path / "checkpoint_00000001_a" / "model").is_dir()
    assert sorted(p.name for p in (tmp_path / "checkpoint_00000002_b").iterdir()) == ["PRUNED"]
    assert (tmp_path / "checkpoint_00000003_c" / "state.json").is_file()
    prune(str(tmp_path), {"checkpoint_00000003_c"}, whole=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_00000003_c"]


def test_a_trials_workers_keep_the_best_the_scheduler_stopped_it_on_while_they_go_on(tmp_path):
    """Tune stops a trial on a report, and its driver names the best checkpoint up to that report
    at once, while the trial's workers go on until Ray ends them: they commit the next, better
    evaluation and prune. The best the driver named is still in storage after that commit;
    a fit outside Tune keeps only its best."""
    from platform.checkpoint import Kept, best_under, exists, prune

    def fit(behind: bool, folder: Path) -> str:
        kept = Kept(behind=behind)
        for step, dev in ((2, 40.0), (4, 41.0)):  # the scheduler decides on step 2; the workers commit step 4
            name = f"checkpoint_{step:08d}_x"
            (folder / name / "model").mkdir(parents=True)
            (folder / name / "state.json").write_text(json.dumps({"step": step, "stsb_dev_spearman": dev}))
            kept.wrote(name, "model", improved=True)
            if step == 2:
                named = best_under(str(folder), up_to=2).checkpoint  # the driver's choice, as the stop comes
            prune(str(folder), kept.names() | {name}, up_to=step)  # the workers' commit of step 4
        return named

    assert exists(fit(True, tmp_path / "trial"))
    assert not exists(fit(False, tmp_path / "fit"))
    kept = Kept(behind=True)
    for name in ("m2", "m4", "m6"):
        kept.wrote(name, "model", improved=True)
    assert kept.names() == {"m4", "m6"}  # one best behind, no more


def test_a_step_reads_from_the_device_only_when_it_logs_or_evaluates(tiny_model, small_corpus, tmp_path, monkeypatch):
    """The step gets tensors and keeps its numbers on the device: over 8 steps that log every 4th
    and evaluate at the 8th, the project's code reads values back to Python twice (steps 4 and 8,
    one transfer each), never in the other steps. Reads are counted by their caller, so torch's
    own bookkeeping on CPU tensors (AdamW's step counter) is not counted; the evaluation's reads are
    left out. Removing ``to_host``'s batching (a read per metric) fails this test."""
    import sys
    import threading

    import torch

    import platform.run.loop as loop
    from methods.recipe import Recipe

    roots = tuple(str(ROOT / d) for d in ("platform", "methods"))
    state = {"training": False, "evaluating": False, "reads": []}
    main = threading.main_thread()

    def counted(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if (state["training"] and not state["evaluating"] and threading.current_thread() is main
                    and caller.startswith(roots)):
                state["reads"].append((name, caller, sys._getframe(1).f_lineno))
            return original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, read)

    for name in ("item", "tolist", "__float__", "__int__", "__bool__", "numpy", "cpu"):
        counted(name)
    original_loss, original_eval = Recipe.loss, loop.evaluate_and_report

    def loss(self, *args, **kwargs):
        state["training"] = True
        return original_loss(self, *args, **kwargs)

    def evaluate(*args, **kwargs):
        state["evaluating"] = True
        try:
            return original_eval(*args, **kwargs)
        finally:
            state["evaluating"] = False

    monkeypatch.setattr(Recipe, "loss", loss)
    monkeypatch.setattr(loop, "evaluate_and_report", evaluate)
    cfg = TrainConfig.build("augcse", "local", {
        "model": str(tiny_model), "corpus": str(small_corpus), "batch_size": 8, "max_steps": 8, "eval_steps": 8,
        "log_steps": 4, "num_workers": 1, "output_dir": str(tmp_path), "augmentations": "random_swap,random_delete"})
    assert train_loop_per_worker(cfg.flat())["steps"] == 8
    assert len(state["reads"]) == 2, state["reads"]


def test_each_paper_trains_in_its_authors_precision():
    """SimCSE and SAN: the HF Trainer's --fp16 (autocast and a loss scaler) in their authors'
    scripts; UNA and VaSCL: fp32 (no autocast in their code); AugCSE: fp32 (its STS-B script,
    run_train_exp.py, passes no --fp16). The local profile's CPU steps: fp32."""
    want = {"simcse": "fp16", "san": "fp16", "augcse": "fp32", "una": "fp32", "vascl": "fp32"}
    assert {m: TrainConfig.build(m, "paper").precision for m in want} == want
    assert "una" in TrainConfig.build("una", "paper").sources["precision"]
    assert "run_train_exp.py" in TrainConfig.build("augcse", "paper").sources["precision"]
    assert {TrainConfig.build(m, "local").precision for m in want} == {"fp32"}


def test_a_state_keeps_the_loss_scale_and_a_restart_takes_it_back(tmp_path):
    """fp16's loss scale (and its growth count) is part of the resumable state, as the optimizer's
    moments are: a restart that began again at 65536 would skip steps the run did not skip."""
    import torch

    from platform import checkpoint

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    scaler.scale(model(torch.ones(1, 3)).sum() * float("inf")).backward()  # an overflow: the scale halves
    scaler.step(optimizer)
    scaler.update()
    assert scaler.get_scale() == 2.0**15
    checkpoint.save_train_state(tmp_path, model, optimizer, schedule, checkpoint.Position(step=1), scaler=scaler)
    fresh = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    checkpoint.load_train_state(tmp_path, 0, model, optimizer, schedule, fresh)
    assert fresh.state_dict() == scaler.state_dict() and fresh.get_scale() == 2.0**15


def test_fp16_on_a_gpu_trains_with_a_loss_scaler_and_resumes_with_its_scale(tiny_model, small_corpus, tmp_path):
    """The paper profile's fp16 on a GPU (skipped without one): the step under fp16 autocast with a
    loss scaler, finite losses, the scale in every resumable state, and --resume continuing from it."""
    import math

    import pytest
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from platform.run import loop

    autocast, scaler = loop.mixed_precision("fp16", torch.device("cuda"))
    assert scaler.is_enabled() and autocast.fast_dtype == torch.float16
    base = {"model": str(tiny_model), "corpus": str(small_corpus), "batch_size": 16, "eval_steps": 3,
            "num_workers": 1, "use_gpu": True, "precision": "fp16", "checkpoint_minutes": 0, "output_dir": str(tmp_path)}
    first = train_loop_per_worker(TrainConfig.build("simcse", "local", {**base, "max_steps": 3}).flat())
    state = torch.load(next((tmp_path / "local").glob("*/train_state.pt")), weights_only=True)
    assert first["steps"] == 3 and state["scaler"]["scale"] > 0
    skipped = round(math.log2(2.0**16 / state["scaler"]["scale"]))  # each overflow halves the scale
    assert state["scheduler"]["last_epoch"] == 3 - skipped  # a skipped step leaves the schedule where it was
    again = train_loop_per_worker(TrainConfig.build("simcse", "local", {**base, "max_steps": 6}).flat())
    assert again["steps"] == 6 and again["best_stsb_dev_spearman"] == again["best_stsb_dev_spearman"]  # not NaN


def test_a_fit_that_lost_its_workers_says_so_in_a_line_and_a_workers_own_error_keeps_its_traceback():
    """Ray Train's ``WorkerGroupError`` as it reaches the driver: for workers whose processes died
    (each a failed health check on a dead actor) one line naming the rank and Ray's exit detail;
    for a worker that raised, nothing (the traceback is the report)."""
    import ray.exceptions
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    from ray.train import WorkerGroupError
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback, WorkerHealthCheckFailedError

    from platform.run.fit import workers_lost

    died = ray.exceptions.ActorDiedError(ActorDiedErrorContext(  # as a SIGKILLed Train worker's reads
        class_name="RayTrainWorker", actor_id=bytes(16), pid=3170, error_message=(
            "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
            "detail: Worker unexpectedly exits with a connection error code 2. End of file. Some common causes ...")))
    lost = {rank: WorkerHealthCheckFailedError("A worker health check failed.", died) for rank in (1, 0)}
    assert workers_lost(WorkerGroupError("two died", lost)) == (
        "rank 0's process died: Worker unexpectedly exits with a connection error code 2")
    raised = UserExceptionWithTraceback(ValueError("a bug"), "Traceback ...\nValueError: a bug")
    assert workers_lost(WorkerGroupError("one raised", {0: raised})) is None
    assert workers_lost(WorkerGroupError("mixed", {0: lost[0], 1: raised})) is None


@pytest.mark.e2e
def test_train_in_the_process_runtime_needs_no_ray(tiny_model, small_corpus, tmp_path, mlflow_uri):
    """``runtime=process`` is for a box without Ray: the whole ``train`` command, final evaluation
    included, runs in an interpreter where ``import ray`` fails; the Ray runtime there is one
    error line naming the process runtime."""
    import subprocess
    import sys

    from tests.helpers import ROOT, assert_user_error, runs_of, sets

    program = ("import sys; sys.modules['ray'] = None; from platform import train; code = train.main(sys.argv[1:]); "
               "assert not [m for m in sys.modules if m.split('.')[0] == 'ray' and sys.modules[m] is not None]; "
               "sys.exit(code)")

    def train_without_ray(**values) -> subprocess.CompletedProcess:
        args = sets(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=2, output_dir=tmp_path / "runs",
                    **values)
        return subprocess.run([sys.executable, "-c", program, "simcse", *args], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri}, timeout=600)

    proc = train_without_ray(eval_steps=2, num_workers=1, runtime="process")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "STS" in proc.stdout and "best stsb_dev_spearman=" in proc.stdout, proc.stdout[-3000:]
    # The Ray runtime there: one line that says what to do, before any run is created.
    proc = train_without_ray()
    assert_user_error(proc, "Ray is not installed", "--set runtime=process")
    assert len(runs_of(mlflow_uri)[1]) == 1  # the process runtime's run alone
