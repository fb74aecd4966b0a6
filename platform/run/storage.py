"""Where runs persist: a local folder, a shared mount, or object storage (``s3://``, ``gs://``),
named by one string, ``output_dir``.

On a multi-node cluster every node must reach the checkpoints (Ray Train persists them from the
workers, Tune restores a sweep from them), so ``output_dir`` is then a URI; S3-compatible stores
are reached through the standard AWS variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...),
which pyarrow (Ray's storage layer) and boto3 both read. Local paths stay plain paths, resolved
against the working directory. Every read and write of ``output_dir`` goes through here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Iterator

from platform import settings
from platform.errors import UserError, check_uri, redact, writable_dir
from platform.outputs import in_ray_job_copy

def is_uri(location: str | os.PathLike) -> bool:
    return "://" in str(location)


def resolve(location: str | os.PathLike) -> str:
    """A URI unchanged (without a trailing slash), a local path made absolute."""
    text = str(location)
    return text.rstrip("/") if is_uri(text) else str(Path(text).expanduser().resolve())


def join(location: str, *parts: str) -> str:
    return "/".join([location.rstrip("/"), *parts]) if is_uri(location) else str(Path(location, *parts))


def filesystem(location: str, what: str = "output_dir"):
    """``(pyarrow file system, path inside it)`` for a URI or a local path."""
    import pyarrow.fs as pafs

    if not is_uri(location):
        return pafs.LocalFileSystem(), resolve(location)
    try:
        return pafs.FileSystem.from_uri(location)
    except Exception as exc:  # unknown scheme, no credentials for the scheme's client
        raise UserError(f"{what} {redact(location)}: cannot open ({_reason(exc)})") from None


def write_text(location: str, text: str) -> None:
    fs, path = filesystem(location)
    parent = path.rsplit("/", 1)[0]
    fs.create_dir(parent, recursive=True)
    with fs.open_output_stream(path) as out:
        out.write(text.encode("utf-8"))


def read_text(location: str) -> str | None:
    """The file's text, or None when it does not exist."""
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as src:
        return src.read().decode("utf-8")


def exists(location: str) -> bool:
    """Whether a file or folder is at ``location`` (False where the storage cannot be opened)."""
    import pyarrow.fs as pafs

    try:
        fs, path = filesystem(location)
        return fs.get_file_info(path).type != pafs.FileType.NotFound
    except (UserError, OSError):
        return False


def remove(location: str) -> None:
    """Delete the file or folder at ``location``, if there is one."""
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    kind = fs.get_file_info(path).type
    if kind == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif kind == pafs.FileType.File:
        fs.delete_file(path)


def empty(location: str, note: str, name: str = "PRUNED") -> None:
    """Delete what the folder at ``location`` holds, leaving the file ``name`` with ``note``: the
    folder stays for whoever still lists it."""
    fs, path = filesystem(location)
    fs.delete_dir_contents(path, missing_dir_ok=True)
    with fs.open_output_stream(f"{path}/{name}") as out:
        out.write(note.encode("utf-8"))


def list_dirs(location: str) -> list[str]:
    """The names of the folders directly under ``location`` (none if it does not exist)."""
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    selector = pafs.FileSelector(path, allow_not_found=True, recursive=False)
    return sorted(i.base_name for i in fs.get_file_info(selector) if i.type == pafs.FileType.Directory)


TIMEOUT_ENV = settings.STORAGE_TIMEOUT


def check_writable(location: str, what: str = "output_dir") -> str:
    """Create ``location`` and prove it takes a file: a read-only disk, a missing bucket, refused
    credentials or storage that does not answer (a cloud client without credentials may retry for
    minutes) become one clear line before Ray starts, not a failure at the first checkpoint."""
    if not is_uri(location):
        if in_ray_job_copy(location):
            raise UserError(f"{what} {location} would be inside the job's temporary copy of the repository, which "
                            "Ray deletes: give an s3:// URI (or a folder outside it) with --set output_dir=...")
        return str(writable_dir(location, what))
    check_uri(location, what)
    timeout = settings.number(TIMEOUT_ENV, 30)
    outcome: list[BaseException | None] = []

    def probe() -> None:
        try:
            fs, path = filesystem(location, what)
            fs.create_dir(path, recursive=True)
            with fs.open_output_stream(f"{path}/.write-test-{os.getpid()}") as out:
                out.write(b"ok")
            fs.delete_file(f"{path}/.write-test-{os.getpid()}")
            outcome.append(None)
        except BaseException as exc:  # reported by the caller's thread
            outcome.append(exc)

    worker = threading.Thread(target=probe, daemon=True)  # left behind if it never answers
    worker.start()
    worker.join(timeout)
    if not outcome:
        raise UserError(f"{what} {location} is not writable (no answer within {timeout:g} s; check the network and "
                        f"the credentials, or raise {TIMEOUT_ENV})")
    if isinstance(outcome[0], UserError):
        raise outcome[0]
    if outcome[0] is not None:
        raise UserError(f"{what} {location} is not writable ({_reason(outcome[0])})") from None
    return resolve(location)


@contextlib.contextmanager
def local_copy(location: str) -> Iterator[Path]:
    """A folder on this machine with the contents of ``location`` (itself when it is local; a
    downloaded copy, removed afterwards, when it is a URI)."""
    if not is_uri(location):
        yield Path(location)
        return
    import pyarrow.fs as pafs

    fs, path = filesystem(location)
    tmp = Path(tempfile.mkdtemp(prefix="checkpoint-"))
    try:
        pafs.copy_files(path, str(tmp), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _reason(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__
