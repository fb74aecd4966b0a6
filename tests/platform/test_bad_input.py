"""Every row of the bad-input table (docs/failures.md), run as written: exit code 2, one error line that
says what the table says, no traceback, no MLflow run left RUNNING, no half-written cache entry.

The rows run in this process (``main(argv)`` of each CLI, as ``python -m`` would call it) so
that ~30 commands cost seconds, not minutes; the subprocess path of the same handler is covered
by the per-command CLI tests.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
from pathlib import Path

import pytest

from tests.helpers import ROOT

TABLE = re.compile(r"<!-- bad-input-table -->(.*?)<!-- /bad-input-table -->", re.S)


def table_rows() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "failures.md").read_text(encoding="utf-8")
    rows = []
    for line in TABLE.search(text).group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows.append((cells[0].strip("`"), cells[1].strip("`")))
    return rows


def test_the_table_is_long_enough():
    assert len(table_rows()) >= 45


def _read_only_dir(tmp_path: Path) -> Path:
    """A folder that refuses files. chmod works for other users; root ignores permission bits,
    so root gets a sysfs folder (mkdir and create both fail there for everyone)."""
    if os.geteuid() != 0:
        ro = tmp_path / "read-only"
        ro.mkdir()
        ro.chmod(0o555)
        return ro
    return Path("/sys/kernel")


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model, small_corpus):
    d = tmp_path_factory.mktemp("bad-input")
    (d / "empty.txt").write_text("\n \n")
    (d / "binary.bin").write_bytes(b"\x00\x01\x02binary\x00" * 100)
    (d / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (d / "huge.txt").write_bytes(b"first line\n" + b"x" * (2 << 20) + b"\n")
    (d / "malformed.yaml").write_text("space: {lr: [1, 2\n")
    (d / "unknown.yaml").write_text("metric: stsb_dev_spearman\ntrials: 3\nspace: {lr: {loguniform: [1.0e-5, 1.0e-4]}}\n")
    (d / "not-a-checkpoint").mkdir()
    (d / "not-a-checkpoint" / "notes.txt").write_text("hello")
    (d / "invisible.txt").write_text("\u200b\u200c\u2060\n" * 100, encoding="utf-8")
    space = "mode: max\nsearch: optuna\nscheduler: {type: asha}\nspace: {beta: {uniform: [0.3, 0.8]}}\n"
    (d / "metric.yaml").write_text("metric: accuracy\n" + space)
    (d / "grace0.yaml").write_text(space.replace("{type: asha}", "{type: asha, grace_period: 0}"))
    (d / "corpus.yaml").write_text(space.replace("{beta:", "{corpus: {choice: [a.txt, b.txt]}, beta:"))
    (d / "scale.yaml").write_text(space.replace("{beta: {uniform: [0.3, 0.8]}}", "{scale: {uniform: [10, 40]}}"))
    user = d / "thesis"
    (user / "src").mkdir(parents=True)
    (user / "thesis.tex").write_text("\\documentclass{article}")
    (user / "src" / "main.py").write_text("print(1)")
    (d / "user-data" / "downstream").mkdir(parents=True)
    (d / "user-data" / "downstream" / "notes.txt").write_text("mine")
    shutil.copytree(tiny_model, d / "truncated")
    weights = d / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (d / "broken-checkpoint" / "model").mkdir(parents=True)
    (d / "broken-checkpoint" / "state.json").write_text('{"step": 3, "eval_pool')
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"sentence": ["another corpus", "its second line"], "paraphrase": ["a corpus", "line 2"]}),
                   d / "other-paraphrases.parquet")
    return {
        "MISSING": str(d / "does-not-exist.txt"), "EMPTY": str(d / "empty.txt"), "BINARY": str(d / "binary.bin"),
        "LATIN1": str(d / "latin1.txt"), "HUGE_LINE": str(d / "huge.txt"), "MALFORMED_YAML": str(d / "malformed.yaml"),
        "UNKNOWN_KEY_YAML": str(d / "unknown.yaml"), "NOT_A_CHECKPOINT": str(d / "not-a-checkpoint"),
        "TINY_MODEL": str(tiny_model), "CORPUS": str(small_corpus), "READ_ONLY": str(_read_only_dir(d)),
        "INVISIBLE": str(d / "invisible.txt"), "SPACE_METRIC": str(d / "metric.yaml"),
        "SPACE_GRACE0": str(d / "grace0.yaml"), "SPACE_CORPUS": str(d / "corpus.yaml"),
        "SPACE_SCALE": str(d / "scale.yaml"), "USER_FOLDER": str(user),
        "USER_DATA": str(d / "user-data"), "TRUNCATED_MODEL": str(d / "truncated"),
        "BROKEN_CHECKPOINT": str(d / "broken-checkpoint"), "OTHER_PARAPHRASES": str(d / "other-paraphrases.parquet"),
    }


def _entry(module: str):
    return importlib.import_module("platform.data.fetch" if module == "data" else f"platform.{module}").main


@pytest.mark.parametrize("command,needle", table_rows(), ids=[r[0][:60] for r in table_rows()])
def test_bad_input_row(command, needle, files, tmp_path, monkeypatch, capsys, mlflow_uri):
    cache = tmp_path / "cache"
    monkeypatch.setenv("PLATFORM_CACHE_DIR", str(cache))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.chdir(tmp_path)  # default output folders land here
    words = shlex.split(command.format(**files))
    while "=" in words[0]:  # VAR=value prefixes
        key, value = words.pop(0).split("=", 1)
        monkeypatch.setenv(key, value)
    assert words[:2] == ["python", "-m"] and words[2].startswith("platform.")
    module, argv = words[2].split(".", 1)[1], words[3:]
    before = _tree(Path(files["USER_FOLDER"]).parent)
    with pytest.raises(SystemExit) as exit_info:
        _entry(module)(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    assert needle in lines[0], lines[0]
    for secret in re.findall(r"://[^\s/@:]*:([^\s/@]+)@", command):  # a password in the command is never printed
        assert secret not in err
    # Before any Ray work or MLflow run, and nothing a user made is changed.
    import ray

    assert not ray.is_initialized()
    if Path(mlflow_uri.split("///", 1)[1]).exists():
        from mlflow.tracking import MlflowClient

        c = MlflowClient(mlflow_uri)
        assert not c.search_runs([e.experiment_id for e in c.search_experiments()])
    if cache.exists():
        assert not [p for p in cache.iterdir() if ".tmp-" in p.name]
    assert _tree(Path(files["USER_FOLDER"]).parent) == before


def _tree(folder: Path) -> list:
    return sorted((str(p.relative_to(folder)), p.stat().st_size if p.is_file() else None) for p in folder.rglob("*"))
