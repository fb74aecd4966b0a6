"""Nothing a user made is deleted: the platform replaces only folders it wrote (``platform.storage``),
through ``augment --out``, ``report --out``, ``data fetch senteval`` and the exports."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from platform import storage
from platform.errors import UserError


def _users_folder(tmp_path):
    folder = tmp_path / "thesis"
    (folder / "src").mkdir(parents=True)
    (folder / "thesis.tex").write_text("\\documentclass{article}")
    (folder / "src" / "main.py").write_text("print(1)")
    return folder


def _tree(folder):
    return sorted((str(p.relative_to(folder)), p.read_bytes() if p.is_file() else None) for p in folder.rglob("*"))


def test_a_users_folder_is_refused_and_left_as_it_was(tmp_path):
    folder = _users_folder(tmp_path)
    before = _tree(folder)
    with pytest.raises(UserError, match="is not empty and was not written by this platform: nothing was changed; pick"):
        storage.check_replaceable(folder, "pick another")
    new = storage.staging(folder)
    (new / "part-0.parquet").write_bytes(b"x")
    with pytest.raises(UserError, match="not written by this platform"):
        storage.install(new, folder, "test", "pick another")
    assert _tree(folder) == before and not new.exists()
    (tmp_path / "a-file").write_text("mine")
    with pytest.raises(UserError, match="is a file, not a folder"):
        storage.check_replaceable(tmp_path / "a-file", "pick another")


def test_a_rerun_replaces_its_own_output_and_nothing_beside_it(tmp_path):
    target = tmp_path / "out"
    neighbours = {"out.tmp": "a user's", "out.old": "another user's"}
    for name, text in neighbours.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "keep.txt").write_text(text)
    for content in ("first", "second"):
        new = storage.staging(target)
        (new / "data.txt").write_text(content)
        storage.install(new, target, "test", "pick another")
        assert (target / "data.txt").read_text() == content and storage.is_ours(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out.old", "out.tmp"]
    assert all((tmp_path / n / "keep.txt").read_text() == t for n, t in neighbours.items())
    empty = tmp_path / "empty"
    empty.mkdir()
    storage.install(storage.staging(empty), empty, "test", "pick another")  # an empty folder may be used


def test_a_killed_writers_leftovers_are_removed_a_live_ones_kept(tmp_path):
    """A writer killed mid-write leaves its staging folder; the next writer of the target removes
    it when that process is gone, and leaves a live writer's alone."""
    target = tmp_path / "out"
    code = ("import sys, time; from pathlib import Path; from platform import storage; "
            "d = storage.staging(Path(sys.argv[1])); print(d, flush=True); time.sleep(int(sys.argv[2]))")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    dead_dir = subprocess.run([sys.executable, "-c", code, str(target), "0"], capture_output=True, text=True,
                              env=env).stdout.strip()
    assert os.path.isdir(dead_dir)
    live = subprocess.Popen([sys.executable, "-c", code, str(target), "60"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        live_dir = live.stdout.readline().strip()
        assert os.path.isdir(live_dir) and not os.path.exists(dead_dir)  # the live writer removed it
        mine = storage.staging(target)
        assert os.path.isdir(live_dir) and mine.is_dir()
    finally:
        live.kill()
        live.wait()


def test_report_and_fetch_keep_a_users_folder(tmp_path, cli, mlflow_uri):
    folder = _users_folder(tmp_path)
    before = _tree(folder)
    proc = cli("report", "--out", str(folder), env={"MLFLOW_TRACKING_URI": mlflow_uri})
    assert proc.returncode == 2 and "not written by this platform" in proc.stderr and _tree(folder) == before
    data = tmp_path / "data"
    (data / "downstream").mkdir(parents=True)
    (data / "downstream" / "my-notes.txt").write_text("mine")
    proc = cli("data", "fetch", "senteval", "--data-dir", str(data), env={"PLATFORM_DATA_MIRROR": "http://127.0.0.1:9"})
    assert proc.returncode == 2 and "move it away or choose another --data-dir" in proc.stderr
    assert (data / "downstream" / "my-notes.txt").read_text() == "mine"


def test_a_cache_entry_killed_mid_write_is_cleaned_by_the_next_writer(tmp_path, monkeypatch):
    """A cache writer killed mid-build leaves its ``*.tmp-<host>-<pid>-*`` folder; the next writer
    of that entry removes it (its process is gone) and builds a complete entry."""
    from platform.storage import cache_entry, cached

    monkeypatch.setenv("PLATFORM_CACHE_DIR", str(tmp_path / "cache"))
    code = ("import os, sys; from pathlib import Path; from platform.storage import cached; "
            "cached('kind', 'digest', {'p': 1}, lambda d: (Path(d, 'half').write_text('x'), os._exit(9)))")
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "PLATFORM_CACHE_DIR": str(tmp_path / "cache")}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 9
    final = cache_entry("kind", "digest", {"p": 1})
    assert [p.name for p in (tmp_path / "cache").iterdir() if ".tmp-" in p.name]  # the killed writer's
    folder = cached("kind", "digest", {"p": 1}, lambda d: (d / "whole").write_text("y"))
    assert folder == final and (final / "whole").is_file() and (final / "COMPLETE").is_file()
    assert not [p for p in (tmp_path / "cache").iterdir() if ".tmp-" in p.name]


def test_generated_columns_are_keyed_by_their_generators_code():
    """A generated column's cache key holds a digest of its generator's module source: a changed
    generator makes new columns rather than reusing the old ones."""
    import hashlib
    import importlib.util
    from pathlib import Path

    from methods.ingredients import GeneratedColumn
    from platform.data.columns import _key

    spec = GeneratedColumn("san_negative", "methods.san:SANNegatives", {"mlm": "bert-base-uncased@abc"})
    origin = Path(importlib.util.find_spec("methods.san").origin)
    assert _key(spec) == {"generator": "methods.san:SANNegatives", "mlm": "bert-base-uncased@abc",
                          "code": hashlib.sha256(origin.read_bytes()).hexdigest()[:16]}
