"""The head's SQLite MLflow database, kept beyond the head: ``python -m platform.cluster down``
backs it up to S3 before the head goes (and does not terminate it when that fails), ``up``
restores it on a new head before MLflow starts. A PostgreSQL backend (``MLFLOW_BACKEND_STORE_URI``)
lives outside the cluster and needs neither.

The copy is SQLite's online backup (consistent while the MLflow server writes), checked with
``PRAGMA integrity_check`` before it is uploaded and again before a restored copy takes its place.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from pathlib import Path

from platform import settings
from platform.cluster_aws import s3_location
from platform.errors import UserError


def on_head(backend: str | None) -> bool:
    """Whether the MLflow backend store lives on the head's disk (the default, SQLite)."""
    return not backend or backend.startswith("sqlite:")


def _check(path: Path, what: str) -> int:
    """The number of runs in a sound MLflow database at ``path``."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        verdict = db.execute("PRAGMA integrity_check").fetchone()[0]
        if verdict != "ok":
            raise UserError(f"{what} is damaged (integrity_check: {verdict})")
        try:
            return db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        except sqlite3.DatabaseError:
            raise UserError(f"{what} is not an MLflow database (no runs table)") from None


def _s3(region: str | None):
    """An S3 client in the cluster's region (boto3 does not read an instance's region by itself)."""
    import boto3

    return boto3.client("s3", region_name=next(filter(None, map(settings.get, settings.AWS_REGIONS)), region))


def _exists(client, bucket: str, key: str) -> bool:
    """Whether ``key`` is stored, by listing (what the head's policy allows under the backup's
    prefix; a missing key's HeadObject would be a 403 without listing rights on the whole bucket)."""
    listed = client.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=10).get("Contents", [])
    return any(item["Key"] == key for item in listed)


def copy_database(source: Path, target: Path) -> None:
    """SQLite's online backup of ``source`` (consistent while MLflow writes), put at ``target`` in one step."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as src, sqlite3.connect(tmp) as dst:
            src.backup(dst)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def backup(source: Path, uri: str, region: str | None = None) -> str:
    """Copy the database at ``source`` to ``uri`` (s3://bucket/key); a line saying what was kept."""
    source = Path(source).expanduser()
    if not source.is_file():
        raise UserError(f"no MLflow database at {source}")
    bucket, key = s3_location(uri, "the backup location")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "mlflow.db"
        copy_database(source, copy)
        runs = _check(copy, f"the copy of {source}")
        size = copy.stat().st_size
        client = _s3(region)
        if _exists(client, bucket, key):
            before = int(client.head_object(Bucket=bucket, Key=key).get("Metadata", {}).get("runs", 0))
            if before > runs:
                raise UserError(f"the backup at {uri} holds {before} runs, the database at {source} {runs}: it is not "
                                "replaced (a head that started without restoring it?); give --backup-to another place")
        client.upload_file(str(copy), bucket, key, ExtraArgs={"Metadata": {"runs": str(runs)}})
        stored = client.head_object(Bucket=bucket, Key=key)["ContentLength"]
    if stored != size:
        raise UserError(f"the backup at {uri} has {stored} bytes, not {size}")
    return f"MLflow database backed up: {runs} runs, {size:,} bytes -> {uri}"


def restore(target: Path, uri: str, region: str | None = None) -> str:
    """Put the backup at ``uri`` in place at ``target`` unless a database is already there."""
    target = Path(target).expanduser()
    if target.exists():
        return f"MLflow database kept: {target} exists (the backup at {uri} was not needed)"
    bucket, key = s3_location(uri, "the backup location")
    client = _s3(region)
    if not _exists(client, bucket, key):
        return f"no MLflow database backup at {uri}: MLflow starts with a new database"
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".mlflow.db.restore-", dir=target.parent)
    os.close(fd)
    try:
        client.download_file(bucket, key, tmp)
        runs = _check(Path(tmp), f"the backup at {uri}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return f"MLflow database restored from {uri}: {runs} runs -> {target}"
