"""Shared fixtures: the real data folder, a tiny randomly initialised BERT with a real tokenizer,
a real MLflow SQLite store per test, a real MLflow server per module, and the commands called in
this process. (Helpers that are not fixtures: ``tests/helpers.py``.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import new_mlflow_db
from tests.suite_order import pytest_collection_modifyitems, pytest_configure  # noqa: F401 (pytest's hooks)


def _data_root() -> Path:
    raw = os.environ.get("PLATFORM_DATA_DIR")
    if not raw:
        pytest.exit("set PLATFORM_DATA_DIR to the data folder (e.g. ../shared/data); see README", returncode=2)
    return Path(raw).resolve()


@pytest.fixture(scope="session")
def data_root() -> Path:
    return _data_root()


@pytest.fixture(scope="session", autouse=True)
def _isolated_env(tmp_path_factory):
    """Ray's session files and Ray Data's caches go to a temp dir; HF never goes online."""
    import shutil
    import tempfile

    # A short path of its own: Ray's socket paths under it must stay within AF_UNIX's 107 bytes,
    # which pytest's per-worker folders (pytest-of-root/pytest-N/popen-gw1/...) exceed.
    ray_tmp = tempfile.mkdtemp(prefix="ray-")
    os.environ["RAY_TMPDIR"] = ray_tmp
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["PLATFORM_DATA_DIR"] = str(_data_root())
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # The suite's processes share the cores: torch's OpenMP threads, one per core in each test
        # process and each command it starts, would spin against the other process's (Ray's
        # workers already run with one thread each).
        import torch

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    yield
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def _module_env():
    """Each module starts from the session's environment: an in-process ``ray.init`` exports
    ``RAY_AUTH_MODE=token`` (Ray 2.60), and a later module's ``ray start --head`` with a HOME of
    its own then finds no token for it."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer, 32-d BERT with random weights and the packaged MiniLM (uncased) tokenizer."""
    from platform.data.columns import build_tiny_bert

    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def _empty_mlflow_db(tmp_path_factory) -> Path:
    """An empty MLflow SQLite store, created by MLflow once: its schema migrations take ~2 s, paid
    by every new store otherwise."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture()
def mlflow_uri(tmp_path, _empty_mlflow_db) -> str:
    return new_mlflow_db(_empty_mlflow_db, tmp_path / "mlflow.db")


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory, _empty_mlflow_db):
    """A real ``mlflow server`` process (SQLite, local artifacts), one per test module."""
    from tests.services import MlflowServer

    base = tmp_path_factory.mktemp("mlflow-server")
    server = MlflowServer(base, new_mlflow_db(_empty_mlflow_db, base / "mlflow.db")).start()
    yield server.uri
    server.stop()


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory, data_root) -> Path:
    """256 real sentences from the wiki1m prefix."""
    from platform.data import read_corpus

    sentences = read_corpus(data_root / "corpus" / "wiki1m_for_simcse.first11914.txt.gz", limit=256)
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    path.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return path


@pytest.fixture()
def cli():
    """``cli(module, *args, env=...)``: the command's ``main`` in this process (``run_main``), for
    commands that fail before Ray starts or run without it. The subprocess path of the same
    handler is tested by ``run_cli`` tests."""
    from tests.helpers import run_main

    return run_main


@pytest.fixture(scope="session")
def sts_tests(data_root):
    """The 7 STS tasks' test pairs, read once."""
    from platform.data import STS_TASKS, load_sts

    return {t: load_sts(t, data_root) for t in STS_TASKS}


@pytest.fixture(scope="session")
def test_sentences(sts_tests):
    """Every distinct sentence of the 7 STS test sets, in order of first appearance."""
    return list(dict.fromkeys(s for p in sts_tests.values() for s in p.sent1 + p.sent2))
