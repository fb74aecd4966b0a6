"""A tracking outage is survived: training never waits on MLflow. The server is stopped for ~30 s
mid-run and started again: the run trains to its end while it is away, and finishes with every
step's metrics once. A server that never comes back ends the run with one line, its checkpoints
resumable: once the server is back, ``--resume`` completes the history, each step once."""

from __future__ import annotations

import threading
import time

import pytest

from tests.helpers import runs_of, sets, start_cli, steps_of, wait_for
from tests.services import MlflowServer

pytestmark = pytest.mark.scenario

STEPS, EVAL = 30, 5


class Lines:
    """A running command's stdout and stderr, read as they come."""

    def __init__(self, proc):
        self.proc, self.out, self.err = proc, [], []
        for stream, into in ((proc.stdout, self.out), (proc.stderr, self.err)):
            threading.Thread(target=lambda s=stream, i=into: i.extend(iter(s.readline, "")), daemon=True).start()

    def has(self, text: str) -> bool:
        return any(text in line for line in self.out + self.err)


def _train(server, tiny_model, small_corpus, tmp_path, *extra, env=None):
    args = sets(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=STEPS, eval_steps=EVAL, log_steps=1,
                runtime="process", num_workers=1, final_eval="false", output_dir=tmp_path / "runs")
    return start_cli("train", "simcse", *args, *extra,
                     env={"MLFLOW_TRACKING_URI": server.uri, "PLATFORM_CACHE_DIR": str(tmp_path / "cache"), **(env or {})})


def _checkpointed(tmp_path) -> bool:
    return any((tmp_path / "runs").glob("*/checkpoint_*/metrics.json"))


def _complete(uri: str):
    c, runs = runs_of(uri, "simcse")
    run = runs[0]
    assert steps_of(c, run.info.run_id, "train_loss") == list(range(1, STEPS + 1))  # every step, once
    assert steps_of(c, run.info.run_id, "stsb_dev_spearman") == list(range(EVAL, STEPS + 1, EVAL))
    assert steps_of(c, run.info.run_id, "best_stsb_dev_spearman") == list(range(EVAL, STEPS + 1, EVAL))
    return run


def test_a_30_second_outage_mid_run_costs_nothing(tiny_model, small_corpus, tmp_path, _empty_mlflow_db):
    from tests.helpers import new_mlflow_db

    server = MlflowServer(tmp_path / "mlflow", new_mlflow_db(_empty_mlflow_db, tmp_path / "mlflow.db")).start()
    proc = _train(server, tiny_model, small_corpus, tmp_path)
    lines = Lines(proc)
    try:
        wait_for("the first checkpoint", lambda: _checkpointed(tmp_path), proc=proc)
        server.stop()
        stopped = time.monotonic()
        # Training goes on to its last step with the server away.
        wait_for("the last step", lambda: lines.has(f"step {STEPS}/{STEPS}"), timeout=120)
        time.sleep(max(0.0, 30 - (time.monotonic() - stopped)))
        assert proc.poll() is None  # the fit waits for its points, not failing
        server.start()
        assert proc.wait(timeout=180) == 0, "".join(lines.err)[-3000:]
        run = _complete(server.uri)
        assert run.info.status == "FINISHED" and run.data.tags["best_checkpoint"]
    finally:
        proc.kill()
        server.stop()


def test_a_server_that_never_comes_back_ends_the_run_resumably(tiny_model, small_corpus, tmp_path, _empty_mlflow_db):
    from tests.helpers import new_mlflow_db, run_cli

    server = MlflowServer(tmp_path / "mlflow", new_mlflow_db(_empty_mlflow_db, tmp_path / "mlflow.db")).start()
    # A short wait, and MLflow's client not retrying for minutes on the run's status at its end.
    env = {"PLATFORM_TRACKING_WAIT": "5", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    proc = _train(server, tiny_model, small_corpus, tmp_path, env=env)
    lines = Lines(proc)
    try:
        wait_for("the first checkpoint", lambda: _checkpointed(tmp_path), proc=proc)
        server.stop()
        assert proc.wait(timeout=180) == 2
        time.sleep(0.5)
        errors = [line for line in lines.err if line.startswith("error: ")]
        assert len(errors) == 1 and "took none of run" in errors[0] and "--resume" in errors[0], "".join(lines.err)
        assert "Traceback" not in "".join(lines.err)
        name = next((tmp_path / "runs").glob("simcse-*/checkpoint_*")).parent.name
        server.start()
        resumed = run_cli("train", "simcse", "--resume", name,
                          *sets(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=STEPS, eval_steps=EVAL,
                                log_steps=1, runtime="process", num_workers=1, final_eval="false",
                                output_dir=tmp_path / "runs"),
                          env={"MLFLOW_TRACKING_URI": server.uri, "PLATFORM_CACHE_DIR": str(tmp_path / "cache")})
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert _complete(server.uri).info.status == "FINISHED"
    finally:
        proc.kill()
        server.stop()
