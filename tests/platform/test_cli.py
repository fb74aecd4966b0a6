"""Each CLI as a user runs it: real Ray, real MLflow store, tiny random BERT. (``train`` end to end
on a Ray cluster: tests/platform/run/test_reliability.py.)"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.helpers import assert_user_error, run_cli, run_main, runs_of


def _train_args(tiny_model, small_corpus, tmp_path, *extra):
    sets = {
        "model": tiny_model, "corpus": small_corpus, "batch_size": 8, "max_steps": 4, "eval_steps": 2,
        "log_steps": 1, "output_dir": tmp_path / "runs",
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return [*args, *extra]


def test_a_command_that_hangs_fails_its_test_with_where_it_waits(tmp_path):
    """The suite's guard against a hung command (``run_cli``'s timeout): the test fails with the
    stacks the command prints on SIGUSR2 (``cli_main``) and what it printed, and the command ends
    as on SIGTERM. The hang is real: ``--config`` is a pipe that nobody writes."""
    fifo = tmp_path / "experiment.yaml"
    os.mkfifo(fifo)
    with pytest.raises(AssertionError) as failed:
        run_cli("train", "simcse", "--config", str(fifo), timeout=12)
    text = str(failed.value)
    assert "still ran after 12 s" in text
    assert "load_config_file" in text and "Current thread" in text  # where its main thread waited
    assert text.rstrip().endswith("interrupted")  # then SIGTERM stopped it as Ctrl-C does


def test_evaluate_cli_table_and_json(tiny_model, tmp_path):
    proc = run_main("evaluate", str(tiny_model), "--pooler", "avg", "--tasks", "STS12", "STSBenchmark", "--json", str(tmp_path / "o.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "STS12" in proc.stdout and "STS-B" in proc.stdout
    data = json.loads((tmp_path / "o.json").read_text())
    assert set(data["scores"]) == {"STS12", "STSBenchmark"} and data["pooler"] == "avg"


# ------------------------------------------------------------------------------------------------
# Bad input: one line on stderr, exit code 2, and no MLflow run left RUNNING


def _bad_corpus(tmp_path, kind):
    p = tmp_path / f"{kind}.txt"
    p.write_bytes({"empty": b"", "binary": b"\x00\x01\x02\x03", "undecodable": b"fine\n\xff\xfe bad\n"}[kind])
    return p


@pytest.mark.parametrize(
    "args,needles",
    [
        (["nomethod"], ["unknown method 'nomethod'"]),
        (["simcse", "--profile", "huge"], ["unknown profile 'huge'"]),
        (["simcse", "--set", "learnrate=1"], ["unknown key 'learnrate'"]),
        (["simcse", "--set", "lr=abc"], ["lr='abc' is not a valid float"]),
        (["simcse", "--set", "temperature=-0.1"], ["temperature must be > 0"]),
        (["simcse", "--set", "lr=0"], ["lr must be > 0"]),
        (["simcse", "--set", "batch_size=1", "--set", "num_workers=1"], ["batch_size must be >= 2"]),
        (["simcse", "--set", "corpus=/nonexistent/corpus.txt"], ["corpus '/nonexistent/corpus.txt' not found"]),
        (["simcse", "--set", "model=/nonexistent/model"], ["neither a local model directory", "minilm"]),
    ],
)
def test_train_bad_input(args, needles, tmp_path, mlflow_uri, monkeypatch, capsys):
    """In this process, through ``main(argv)`` as ``python -m`` calls it (nine interpreter starts
    cost ~30 s); the subprocess path of the same handler is covered by ``test_train_bad_corpus``."""
    from platform.train import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert_user_error(subprocess.CompletedProcess(args, exit_info.value.code, "", err), *needles)
    assert all(r.info.status != "RUNNING" for r in runs_of(mlflow_uri)[1])


@pytest.mark.e2e
@pytest.mark.parametrize("kind,needle", [("empty", "no sentences"), ("binary", "binary"), ("undecodable", "line 2")])
def test_train_bad_corpus(kind, needle, tmp_path, mlflow_uri):
    proc = run_cli("train", "simcse", "--set", f"corpus={_bad_corpus(tmp_path, kind)}", env={"MLFLOW_TRACKING_URI": mlflow_uri})
    assert_user_error(proc, needle)


@pytest.mark.e2e
def test_data_dir_missing_or_incomplete(tmp_path, mlflow_uri):
    proc = run_cli("train", "simcse", env={"PLATFORM_DATA_DIR": str(tmp_path / "nowhere"), "MLFLOW_TRACKING_URI": mlflow_uri})
    assert_user_error(proc, "does not exist", "SentEval layout")
    (tmp_path / "partial" / "downstream").mkdir(parents=True)
    proc = run_cli("evaluate", "minilm", env={"PLATFORM_DATA_DIR": str(tmp_path / "partial")})
    assert_user_error(proc, "STS.input.MSRpar.txt", "expected SentEval layout")


@pytest.mark.e2e
def test_unreachable_tracking_uri_fails_before_ray(tiny_model, small_corpus, tmp_path):
    proc = run_cli(
        "train", "simcse", *_train_args(tiny_model, small_corpus, tmp_path),
        env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"},
    )
    assert_user_error(proc, "unreachable", "MLFLOW_TRACKING_URI")
    assert "ray" not in proc.stderr.lower().replace("error:", "")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_the_preflight_tells_a_slow_server_from_one_that_is_down():
    """A server that answers ``/health`` is up: its search may take longer than the preflight's
    connection wait (CI: a loaded head's MLflow took 6 s, and a resume was refused as "unreachable").
    One that does not answer ``/health`` within the wait is unreachable, in one line."""
    import http.server
    import threading
    import time

    from platform.errors import UserError
    from platform.tracking.store import check_reachable

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if not self.path.startswith("/health"):
                time.sleep(2.0)  # the search: a busy database
            elif self.server.down:
                time.sleep(3.0)
            body = b"{}"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.down = False
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        started = time.monotonic()
        check_reachable(uri, timeout=1.0)
        assert time.monotonic() - started >= 2.0
        server.down = True
        with pytest.raises(UserError, match="is unreachable .*timed out"):
            check_reachable(uri, timeout=1.0)
    finally:
        server.shutdown()
        server.server_close()


def test_a_cluster_address_that_is_not_one_is_one_line_before_ray(tiny_model, small_corpus, tmp_path, mlflow_uri, cli):
    """(One that nothing answers at is a row of the bad-input table (docs/failures.md).)"""
    env = {"MLFLOW_TRACKING_URI": mlflow_uri, "RAY_ADDRESS": "headnode"}
    proc = cli("tune", "simcse", *_train_args(tiny_model, small_corpus, tmp_path), env=env)
    assert_user_error(proc, "RAY_ADDRESS='headnode' is not host:port")
    assert runs_of(mlflow_uri)[1] == []


@pytest.mark.e2e
def test_a_ray_that_cannot_start_is_one_line(tiny_model, small_corpus, tmp_path, mlflow_uri):
    """Here Ray's socket paths under a long temp folder exceed the 107 bytes AF_UNIX allows."""
    deep = tmp_path / ("x" * 110)
    deep.mkdir()
    proc = run_cli("train", "simcse", *_train_args(tiny_model, small_corpus, tmp_path),
                   env={"MLFLOW_TRACKING_URI": mlflow_uri, "RAY_TMPDIR": str(deep)})
    assert_user_error(proc, "Ray failed starting a local Ray", "AF_UNIX path length")
    assert runs_of(mlflow_uri)[1] == []


def test_tune_bad_space_and_samples(tmp_path, mlflow_uri, cli):
    space = tmp_path / "space.yaml"
    space.write_text("space:\n  lr: {loguniform: [0, 1]}\n")
    assert_user_error(cli("tune", "simcse", "--space", str(space), env={"MLFLOW_TRACKING_URI": mlflow_uri}), "loguniform")
    space.write_text("space:\n  nonsense: {choice: [1, 2]}\n")
    assert_user_error(cli("tune", "simcse", "--space", str(space), env={"MLFLOW_TRACKING_URI": mlflow_uri}), "unknown key 'nonsense'")
    space.write_text("scheduler: {type: hyperband}\nspace:\n  lr: {loguniform: [1.0e-5, 1.0e-4]}\n")
    assert_user_error(cli("tune", "simcse", "--space", str(space), env={"MLFLOW_TRACKING_URI": mlflow_uri}), "scheduler")
    assert runs_of(mlflow_uri)[1] == []  # rejected before any MLflow run exists
    space.write_text("spaces: {}\n")
    assert_user_error(cli("tune", "simcse", "--space", str(space)), "unknown key(s) spaces")
    assert_user_error(cli("tune", "simcse", "--num-samples", "0"), "--num-samples must be between 1 and 10000, got 0")


def test_evaluate_bad_input(tmp_path, cli):
    assert_user_error(cli("evaluate", "minilm", "--tasks", "STS99"), "unknown task 'STS99'")
    notckpt = tmp_path / "notckpt"
    notckpt.mkdir()
    (notckpt / "state.json").write_text("{}")
    assert_user_error(cli("evaluate", str(notckpt)), "is not a checkpoint")
    proc = run_cli("evaluate", "minilm", "--pooler", "maxpool")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


@pytest.mark.e2e
def test_credentials_in_the_tracking_uri_are_masked(tiny_model, small_corpus, tmp_path):
    from platform.tracking.store import redact

    assert redact("https://alice:s3cr3t@mlflow.example:5000") == "https://***@mlflow.example:5000"
    assert redact("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    proc = run_cli("train", "simcse", *_train_args(tiny_model, small_corpus, tmp_path),
                   env={"MLFLOW_TRACKING_URI": "http://alice:s3cr3t@127.0.0.1:9"})
    assert_user_error(proc, "carries a password", "MLFLOW_TRACKING_PASSWORD", "http://***@127.0.0.1:9")
    assert "s3cr3t" not in proc.stderr + proc.stdout


def test_the_end_of_a_sweep_says_what_it_does_every_30_seconds_on_a_terminal():
    """``still_working`` beats on a terminal while its block runs, stops with
    it, and prints nothing off a terminal (a log file keeps only the lines that say something)."""
    import io
    import time

    from platform.console import still_working

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, log = Terminal(), io.StringIO()
    for stream in (tty, log):
        with still_working("final evaluation", every=0.2, stream=stream):
            time.sleep(0.7)
    time.sleep(0.3)  # nothing after the block
    beats = tty.getvalue().splitlines()
    assert len(beats) == 3 and all(b.startswith("final evaluation: still working (0 min ") for b in beats), beats
    assert log.getvalue() == ""
