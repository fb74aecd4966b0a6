"""The platform's files: where runs persist, the folders it writes whole, and its content-keyed cache.

Runs persist in a local folder, a shared mount, or object storage (``s3://``, ``gs://``), named by
one string, ``output_dir``. On a multi-node cluster every node must reach the checkpoints (Ray
Train persists them from the workers, Tune restores a sweep from them), so ``output_dir`` is then a
URI; S3-compatible stores are reached through the standard AWS variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ...), which pyarrow (Ray's storage layer) and boto3 both read. Local paths
stay plain paths, resolved against the working directory. Every read and write of ``output_dir``
goes through here.

A folder the platform writes whole (``augment --out``, an export, SentEval's ``downstream/``, a
report folder) carries a marker file naming the command that wrote it. Such a folder is replaced
only when it is absent, empty, or carries the marker: a re-run replaces its own earlier output,
never a folder of the user's (``--out .`` in a repository, a thesis folder, a typo). The new
content is written beside the target under a name no user picks, then swapped in by renames, so
the target is complete or absent whatever stops the writer; leftovers of a killed writer are
removed by the next writer of the same target.

A cache entry (generated columns, statistics, an encoder's results, local models) is a folder
under ``$PLATFORM_CACHE_DIR`` (default ``<repo>/.cache/platform``) named by a hash of everything
its content depends on: the sentences themselves (not the file name), the method, the parameters
that matter, and a code version. It is filled under a temporary name and renamed into place, so
readers only see complete entries; a killed writer's leftovers are removed by the next writer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from platform import settings
from platform.errors import UserError, check_uri, one_line, redact, writable_dir

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
        raise UserError(f"{what} {redact(location)}: cannot open ({one_line(exc, 300)})") from None


def write_text(location: str, text: str) -> None:
    fs, path = filesystem(location)
    parent = path.rsplit("/", 1)[0]
    fs.create_dir(parent, recursive=True)
    with fs.open_output_stream(path) as out:
        out.write(text.encode("utf-8"))


def write_json(path: str | os.PathLike, value: dict) -> None:
    """``value`` as JSON in the local file ``path``, whole or not at all (written aside and renamed:
    a reader, on this node or another, never sees half of it); a refused write is one UserError line."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=1)
        os.replace(tmp, path)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None


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
    timeout = settings.number(settings.STORAGE_TIMEOUT)
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
                        f"the credentials, or raise {settings.STORAGE_TIMEOUT})")
    if isinstance(outcome[0], UserError):
        raise outcome[0]
    if outcome[0] is not None:
        raise UserError(f"{what} {location} is not writable ({one_line(outcome[0], 300)})") from None
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


# -- folders written whole -------------------------------------------------------------------------

MARKER = ".platform-output.json"
_STAGING = ".platform-staging-"  # prefix of the folders new content is written into
_ASIDE = ".platform-aside-"  # prefix of the replaced content, removed once the new one is in place


# Ray unpacks a job's working_dir (``ray job submit --working-dir``) into a folder of this prefix
# in its session's temp folder, and deletes it once no job uses it.
RAY_PACKAGE_PREFIX = "_ray_pkg_"


def in_ray_job_copy(path) -> bool:
    """Whether ``path`` lies in a copy of the repository Ray unpacked for a job: nothing that must
    outlast the job (runs, the MLflow store, caches) is written there."""
    return any(part.startswith(RAY_PACKAGE_PREFIX) for part in Path(path).expanduser().resolve().parts)


def is_ours(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def check_replaceable(target: Path, advice: str) -> None:
    """``target`` may be replaced: absent, an empty folder, or one this platform wrote. Else one
    line ending with ``advice`` (what the user can do)."""
    target = Path(target)
    if not target.exists():
        return
    if not target.is_dir():
        raise UserError(f"{target} is a file, not a folder: nothing was changed; {advice}")
    if is_ours(target) or not any(target.iterdir()):
        return
    raise UserError(f"{target} is not empty and was not written by this platform: nothing was changed; {advice}")


def staging(target: Path) -> Path:
    """A new empty folder beside ``target`` to write its content into (same file system: the swap
    is a rename); earlier writers' leftovers for the same target are removed first."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(target)
    return Path(tempfile.mkdtemp(prefix=f"{_STAGING}{target.name}-{writer_id()}-", dir=target.parent))


def install(new: Path, target: Path, command: str, advice: str) -> Path:
    """Put the finished folder ``new`` at ``target`` (checked replaceable again: it may have
    appeared meanwhile), marked as written by ``command``; an earlier folder of ours is removed
    only after the new one took its place."""
    target = Path(target)
    try:
        check_replaceable(target, advice)
    except UserError:
        shutil.rmtree(new, ignore_errors=True)
        raise
    (new / MARKER).write_text(json.dumps({"written_by": command}) + "\n")
    aside = None
    if target.exists():
        aside = Path(tempfile.mkdtemp(prefix=f"{_ASIDE}{target.name}-{writer_id()}-", dir=target.parent))
        os.replace(target, aside / "old")
    os.replace(new, target)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    return target


def discard(new: Path) -> None:
    shutil.rmtree(new, ignore_errors=True)


def writer_id() -> str:
    """``<host>-<pid>``: what a temporary name carries so that a later writer can tell a dead
    writer's leftovers from a live one's."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _remove_leftovers(target: Path) -> None:
    for prefix in (_STAGING, _ASIDE):
        remove_leftovers(target.parent, f"{prefix}{target.name}-")


def remove_leftovers(folder: Path, prefix: str) -> None:
    """Remove the folders or files ``<prefix><host>-<pid>-<random>`` in ``folder`` whose writer ran
    on this host and is gone (killed mid-write); another host's, or a live writer's, are left alone."""
    import psutil

    for leftover in folder.glob(f"{prefix}*"):
        tail = leftover.name[len(prefix):]
        host, _, pid = tail.rpartition("-")[0].rpartition("-")
        if host != socket.gethostname() or not pid.isdigit() or psutil.pid_exists(int(pid)):
            continue
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


# -- the content-keyed cache -----------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[1]  # the repository (or the copy Ray unpacked for a job)


def cache_root() -> Path:
    """``$PLATFORM_CACHE_DIR``, else the repository's ``.cache/platform``; in a job's temporary copy
    of the repository, the user's cache folder (``~/.cache/contrastive-platform``) instead."""
    if settings.get(settings.CACHE_DIR):
        return Path(settings.get(settings.CACHE_DIR)).expanduser().resolve()
    if in_ray_job_copy(REPO_ROOT):
        return (Path.home() / ".cache" / "contrastive-platform").resolve()
    return (REPO_ROOT / ".cache" / "platform").resolve()


def sentences_digest(sentences: list[str]) -> str:
    h = hashlib.sha256()
    for s in sentences:
        h.update(s.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def encoder_key(encoder, pooler: str) -> str:
    """A digest of the weights, the tokenizer, the pooler and the device type."""
    import torch

    h = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(encoder.backbone.state_dict().items()):
        h.update(name.encode())
        h.update(str(tuple(tensor.shape)).encode() + str(tensor.dtype).encode())
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    tok = encoder.tokenizer
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:  # its padding and truncation settings change with each call: not part of it
        spec = {k: v for k, v in json.loads(backend.to_str()).items() if k not in ("padding", "truncation")}
        h.update(json.dumps(spec, sort_keys=True).encode())
    else:
        h.update(repr(sorted(tok.get_vocab().items())).encode())
    h.update(f"|{pooler}|{next(encoder.parameters()).device.type}".encode())
    if getattr(encoder, "prompt", None) is not None:  # the template it embeds sentences in
        h.update(json.dumps(dataclasses.asdict(encoder.prompt), sort_keys=True).encode())
    if getattr(encoder, "truncate_dim", None):  # a Matryoshka prefix of its vectors
        h.update(f"|dim{encoder.truncate_dim}".encode())
    return h.hexdigest()


def entry_key(kind: str, digest: str, params: dict[str, Any]) -> str:
    blob = json.dumps({"kind": kind, "corpus": digest, "params": params}, sort_keys=True, default=str)
    return f"{kind}-{hashlib.sha256(blob.encode()).hexdigest()[:20]}"


def cache_entry(kind: str, digest: str, params: dict[str, Any]) -> Path:
    """Where the entry lives (complete once it holds ``COMPLETE``)."""
    return cache_root() / entry_key(kind, digest, params)


def cached(kind: str, digest: str, params: dict[str, Any], build: Callable[[Path], None]) -> Path:
    """The folder of a complete entry; ``build(tmp_dir)`` fills a new one on a miss."""
    final = cache_entry(kind, digest, params)
    if not (final / "COMPLETE").is_file():
        with building(kind, digest, params) as tmp:
            build(tmp)
    return final


@contextlib.contextmanager
def building(kind: str, digest: str, params: dict[str, Any]) -> Iterator[Path]:
    """A new entry's temporary folder, to fill inside the block: complete and in place when the
    block ends without an error (several can be open at once, as one pass fills several
    entries), removed otherwise."""
    root = cache_root()
    final = cache_entry(kind, digest, params)
    root.mkdir(parents=True, exist_ok=True)
    remove_leftovers(root, final.name + ".tmp-")
    tmp = Path(tempfile.mkdtemp(prefix=f"{final.name}.tmp-{writer_id()}-", dir=root))
    try:
        yield tmp
        (tmp / "COMPLETE").write_text(json.dumps({"kind": kind, "corpus": digest, "params": params}, default=str))
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished the same entry first
            if not (final / "COMPLETE").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
