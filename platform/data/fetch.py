"""``python -m platform.data fetch senteval|wiki1m|clustering|all [--data-dir DIR]``: the papers' data.

Downloads SimCSE's copies (huggingface.co/datasets/princeton-nlp/datasets-for-simcse):
``wiki1m_for_simcse.txt`` into ``<data>/corpus/`` and ``senteval.tar`` unpacked into
``<data>/downstream/`` (SentEval's layout); and the eight short-text clustering sets of VaSCL's
Table 4 (AgNews, SearchSnippets, StackOverflow, Biomedical, GoogleNews TS/T/S, Tweet) from the
copy SCCL's ``get_data.sh`` uses (rashadulrakib/short-text-clustering-enhancement, at a pinned
commit) into ``<data>/clustering/<name>.tsv``. ``$PLATFORM_DATA_MIRROR`` replaces every base URL
(a mirror holding the same relative paths, or the loopback server of the tests).

Each file is downloaded to ``<name>.part`` (an interrupted download resumes from there with an
HTTP Range request; a part file that is already whole, left by a run stopped before the rename,
is checked against a HEAD request's size and checksum), verified by sha256 and only then renamed
into place; the tar is unpacked into a temporary folder that replaces ``downstream/`` in one
rename. The expected sha256 is the one pinned in ``SOURCES`` or, where none is pinned, the one the
server states: Hugging Face serves LFS files with their sha256 as ETag (``X-Linked-Etag``). A file
that can be verified neither way is refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import re
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from platform import settings, storage
from platform.errors import UserError, cli_main, writable_dir

BASE_URL = "https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main"
CLUSTERING_URL = ("https://raw.githubusercontent.com/rashadulrakib/short-text-clustering-enhancement/"
                  "f363b66e6fd51f9dd1db679d2a9ce55538ab9868")
SENTEVAL_ADVICE = "move it away or choose another --data-dir"


@dataclasses.dataclass(frozen=True)
class Source:
    """A file to fetch: ``base/remote`` into ``<data>/local``, checked against ``sha256`` (None:
    the server's LFS ETag)."""

    remote: str
    local: str
    sha256: str | None = None
    base: str = BASE_URL


# The SimCSE files are not pinned: this repository was written offline; pin the values printed by
# the first verified download. The clustering files are pinned (read from their commit).
_CLUSTERING = {
    "AgNews": ("data/agnewsdataraw-8000", "9a3ecfb3d5daef1cdef2fa1cc23d1f1c23784220116c39072d6d8422f5781c06"),
    "SearchSnippets": ("data/search_snippets/search_snippets_true_text",
                       "e39dbcb5d956c2a34d1a68727c18b05646dfd4921857f7f61beccf6481e94787"),
    "StackOverflow": ("data/stackoverflow/stackoverflow_true_text",
                      "e683a764d1c05828ee13828695fb273c3d61991b853af716da383061356e9ff5"),
    "Biomedical": ("data/biomedical/biomedical_true_text", "a52cc072e35bfac1a971880ff3222239438cea24571b8910dd549f1831b34a04"),
    "GoogleNews-TS": ("data/TS", "a2bd94663542b849477b0a2a95a23626a7c8af50d50978056159997ddd800065"),
    "GoogleNews-T": ("data/T", "4b4a5feeaa35e7e96e08203fe44f0b5b136c7d1e01eba3a282d25ae4ecae8f8c"),
    "GoogleNews-S": ("data/S", "004e6210fbfcd11414f27b8bb6a83df6051bb8449c063b9d77955e2df0294082"),
    "Tweet": ("data/tweet-original-order.txt", "bd63058a56d4b2ff35eca50db6fdbdf51d4dbc222e16604cbcaad813c2831479"),
}
SOURCES: dict[str, list[Source]] = {
    "wiki1m": [Source("wiki1m_for_simcse.txt", "corpus/wiki1m_for_simcse.txt")],
    "senteval": [Source("senteval.tar", "senteval.tar")],
    "clustering": [Source(remote, f"clustering/{name}.tsv", sha, CLUSTERING_URL) for name, (remote, sha) in _CLUSTERING.items()],
}
CHUNK = 1 << 20
_SHA = re.compile(r'^(?:W/)?"?([0-9a-f]{64})"?$')


def _server_sha256(headers) -> str | None:
    for key in ("X-Linked-Etag", "ETag"):
        value = headers.get(key)
        if value and _SHA.match(value.strip()):
            return _SHA.match(value.strip()).group(1)
    return None


def _head(url: str, timeout: float):
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout) as response:
        return response.headers


def _unreachable(url: str, exc: Exception) -> UserError:
    return UserError(f"cannot reach {url} ({getattr(exc, 'reason', exc)}); run the same command again to resume")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def download(url: str, target: Path, sha256: str | None = None, timeout: float = 30.0) -> Path:
    """``url`` -> ``target`` via ``target.part``: resumed, verified, renamed. Returns ``target``."""
    part = target.with_name(target.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    expected = sha256
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code != 416 or not have:
            raise UserError(f"download of {url} failed: HTTP {exc.code} {exc.reason}") from None
        response = None  # nothing past the part file: it is complete, or longer than the file
    except (urllib.error.URLError, OSError) as exc:
        raise _unreachable(url, exc) from None
    if response is None:
        expected = expected or _check_complete_part(url, part, have, timeout)
    else:
        with response:
            expected = expected or _server_sha256(response.headers)
            _receive(url, response, part, 0 if have and response.status != 206 else have, target.name)
    if expected is None:
        raise UserError(f"cannot verify {url}: no sha256 pinned and the server states none; the file was not installed")
    actual = _sha256(part)
    if actual != expected:
        part.unlink()
        raise UserError(f"checksum mismatch for {target.name}: sha256 {actual}, expected {expected}; the download was discarded")
    os.replace(part, target)
    print(f"{target}: sha256 {actual} verified")
    return target


def _check_complete_part(url: str, part: Path, have: int, timeout: float) -> str | None:
    """A part file the server has nothing past: whole if its size is the file's (a 416 answer
    carries neither the checksum nor always the size, so a HEAD request asks); discarded if not.
    Returns the checksum the server states, if any."""
    try:
        head = _head(url, timeout)
    except urllib.error.HTTPError as exc:
        raise UserError(f"cannot check {part.name} against {url}: HEAD answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise _unreachable(url, exc) from None
    size = head.get("Content-Length")
    if size is not None and int(size) != have:
        part.unlink()
        raise UserError(f"{part.name} holds {have:,} bytes but the file has {int(size):,}; discarded it, "
                        "run the same command again to download it afresh")
    return _server_sha256(head)


def _receive(url: str, response, part: Path, have: int, name: str) -> None:
    """The response's body appended to ``part`` (which holds ``have`` bytes; 0: written afresh,
    also when the server ignored the Range), with a progress bar."""
    from tqdm import tqdm

    length = response.headers.get("Content-Length")
    total = have + int(length) if length is not None else None
    try:
        with open(part, "ab" if have else "wb") as out, tqdm(
            total=total, initial=have, unit="B", unit_scale=True, desc=name, disable=None
        ) as bar:
            while True:
                block = response.read(CHUNK)
                if not block:
                    break
                out.write(block)
                bar.update(len(block))
    except OSError as exc:  # the connection dropped mid-file (incl. http.client.IncompleteRead)
        raise UserError(f"download of {url} interrupted after {part.stat().st_size:,} bytes "
                        f"({exc.__class__.__name__}); run the same command again to resume") from None
    if total is not None and part.stat().st_size < total:
        raise UserError(f"download of {url} interrupted after {part.stat().st_size:,} of {total:,} bytes; "
                        "run the same command again to resume")


def _safe_members(tar: tarfile.TarFile):
    for member in tar.getmembers():
        name = Path(member.name)
        if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
            raise UserError(f"refusing tar member {member.name!r} (absolute path, '..', or a link)")
        yield member


def install_senteval(tar_path: Path, root: Path) -> Path:
    """Unpack ``senteval.tar`` and put its ``downstream/`` folder in place in one rename (an
    existing ``downstream/`` only if this command wrote it: ``platform.storage``)."""
    with tempfile.TemporaryDirectory(dir=root, prefix=".senteval-") as tmp:
        try:
            with tarfile.open(tar_path) as tar:
                tar.extractall(tmp, members=list(_safe_members(tar)), filter="data")
        except tarfile.TarError as exc:
            raise UserError(f"{tar_path} is not a readable tar file ({exc})") from None
        found = sorted(Path(tmp).rglob("downstream"), key=lambda p: len(p.parts))
        if not found or not found[0].is_dir():
            raise UserError(f"{tar_path} has no downstream/ folder")
        staging = storage.staging(root / "downstream")
        os.replace(found[0], staging / "downstream")
        storage.install(staging / "downstream", root / "downstream", "platform.data fetch senteval", SENTEVAL_ADVICE)
        storage.discard(staging)
    return root / "downstream"


def fetch(what: str, root: Path) -> list[Path]:
    mirror = settings.get(settings.DATA_MIRROR)
    if mirror is not None and not re.match(r"^https?://[^/\s]+", mirror):
        raise UserError(f"{settings.DATA_MIRROR}={mirror!r} is not an http(s) URL; unset it to download from the sources")
    names = list(SOURCES) if what == "all" else [what]
    if "senteval" in names:  # before minutes of download
        storage.check_replaceable(root / "downstream", SENTEVAL_ADVICE)
    done = []
    for name in names:
        for source in SOURCES[name]:
            target = root / source.local
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                download(f"{(mirror or source.base).rstrip('/')}/{source.remote}", target, source.sha256)
            else:
                print(f"{target} already present")
            done.append(install_senteval(target, root) if name == "senteval" else target)
    return done


@cli_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m platform.data", description="Fetch the papers' data.")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="download and verify the papers' training corpus and SentEval data")
    f.add_argument("what", choices=[*SOURCES, "all"])
    f.add_argument("--data-dir", default=None, help=f"target folder (default ${settings.DATA_DIR})")
    args = p.parse_args(argv)
    raw = args.data_dir or settings.get(settings.DATA_DIR)
    if not raw:
        raise UserError(f"no data directory: pass --data-dir or set {settings.DATA_DIR}")
    root = writable_dir(raw, "data directory")
    for path in fetch(args.what, root):
        print(f"ready: {path}")
    return 0
