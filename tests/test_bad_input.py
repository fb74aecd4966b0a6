"""Every row of the README's bad-input table, run as written: exit code 2, one error line that
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
from pathlib import Path

import pytest

from tests.helpers import ROOT

TABLE = re.compile(r"<!-- bad-input-table -->(.*?)<!-- /bad-input-table -->", re.S)


def table_rows() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = []
    for line in TABLE.search(text).group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows.append((cells[0].strip("`"), cells[1].strip("`")))
    return rows


def test_the_table_is_long_enough():
    assert len(table_rows()) >= 20


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
    return {
        "MISSING": str(d / "does-not-exist.txt"), "EMPTY": str(d / "empty.txt"), "BINARY": str(d / "binary.bin"),
        "LATIN1": str(d / "latin1.txt"), "HUGE_LINE": str(d / "huge.txt"), "MALFORMED_YAML": str(d / "malformed.yaml"),
        "UNKNOWN_KEY_YAML": str(d / "unknown.yaml"), "NOT_A_CHECKPOINT": str(d / "not-a-checkpoint"),
        "TINY_MODEL": str(tiny_model), "CORPUS": str(small_corpus), "READ_ONLY": str(_read_only_dir(d)),
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
    with pytest.raises(SystemExit) as exit_info:
        _entry(module)(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    assert needle in lines[0], lines[0]
    # Nothing left behind in a bad state.
    if os.environ["MLFLOW_TRACKING_URI"] == mlflow_uri and Path(mlflow_uri.split("///", 1)[1]).exists():
        from mlflow.tracking import MlflowClient

        c = MlflowClient(mlflow_uri)
        exps = [e.experiment_id for e in c.search_experiments()]
        assert not [r for r in c.search_runs(exps) if r.info.status == "RUNNING"]
    if cache.exists():
        assert not [p for p in cache.iterdir() if ".tmp-" in p.name]
