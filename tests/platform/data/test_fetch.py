"""``python -m platform.data fetch`` against a loopback HTTP server started here: complete,
truncated and resumed, checksum mismatch, server gone mid-file, SentEval tar install."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest

from tests.helpers import assert_user_error, run_cli
from tests.services import Server


WIKI = "".join(f"sentence number {i} of a small wiki copy .\n" for i in range(50_000)).encode()


def _senteval_tar(extra_member: str | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in {
            "SentEval/data/downstream/STS/STSBenchmark/sts-dev.csv": b"x\n",
            "SentEval/data/downstream/SICK/SICK_test_annotated.txt": b"y\n",
            **({extra_member: b"evil"} if extra_member else {}),
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    return buf.getvalue()


@pytest.fixture()
def server():
    s = Server({"wiki1m_for_simcse.txt": WIKI, "senteval.tar": _senteval_tar()})
    yield s
    s.stop()


def fetch(what, data_dir, url):
    return run_cli("data", "fetch", what, "--data-dir", str(data_dir), env={"PLATFORM_DATA_MIRROR": url})


def test_fetch_complete_then_already_present(server, tmp_path):
    proc = fetch("wiki1m", tmp_path, server.url)
    assert proc.returncode == 0, proc.stderr[-2000:]
    target = tmp_path / "corpus" / "wiki1m_for_simcse.txt"
    assert target.read_bytes() == WIKI
    assert "verified" in proc.stdout and not list(tmp_path.rglob("*.part"))
    again = fetch("wiki1m", tmp_path, server.url)
    assert again.returncode == 0 and "already present" in again.stdout


def test_truncated_download_resumes_with_a_range_request(server, tmp_path):
    server.mode = "truncate"
    proc = fetch("wiki1m", tmp_path, server.url)
    assert_user_error(proc, "interrupted", "run the same command again to resume")
    part = tmp_path / "corpus" / "wiki1m_for_simcse.txt.part"
    assert 0 < part.stat().st_size < len(WIKI)
    assert not (tmp_path / "corpus" / "wiki1m_for_simcse.txt").exists()
    have = part.stat().st_size
    server.mode = "ok"
    proc = fetch("wiki1m", tmp_path, server.url)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert server.ranges == [have]
    assert (tmp_path / "corpus" / "wiki1m_for_simcse.txt").read_bytes() == WIKI


def test_checksum_mismatch_discards_the_download(server, tmp_path):
    server.mode = "bad_etag"
    assert_user_error(fetch("wiki1m", tmp_path, server.url), "checksum mismatch", "discarded")
    assert not list((tmp_path / "corpus").iterdir())


def test_unverifiable_file_is_refused(server, tmp_path):
    server.mode = "no_etag"
    assert_user_error(fetch("wiki1m", tmp_path, server.url), "cannot verify")
    assert not (tmp_path / "corpus" / "wiki1m_for_simcse.txt").exists()


def test_complete_part_file_is_verified_through_a_head_request(server, tmp_path):
    """A run stopped after the last byte but before the rename: the Range request gets 416 with no
    checksum, so the checksum comes from a HEAD request and the file is installed."""
    part = tmp_path / "corpus" / "wiki1m_for_simcse.txt.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(WIKI)
    proc = fetch("wiki1m", tmp_path, server.url)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert server.ranges == [len(WIKI)] and server.heads == 1 and "verified" in proc.stdout
    assert (tmp_path / "corpus" / "wiki1m_for_simcse.txt").read_bytes() == WIKI and not part.exists()


def test_part_file_longer_than_the_file_is_discarded(server, tmp_path):
    part = tmp_path / "corpus" / "wiki1m_for_simcse.txt.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(WIKI + b"junk")
    assert_user_error(fetch("wiki1m", tmp_path, server.url), "discarded it", "afresh")
    assert not part.exists() and not (tmp_path / "corpus" / "wiki1m_for_simcse.txt").exists()
    proc = fetch("wiki1m", tmp_path, server.url)
    assert proc.returncode == 0 and (tmp_path / "corpus" / "wiki1m_for_simcse.txt").read_bytes() == WIKI


def test_server_gone_mid_file_then_back(tmp_path):
    s = Server({"wiki1m_for_simcse.txt": WIKI})
    s.mode = "truncate"
    url = s.url
    assert_user_error(fetch("wiki1m", tmp_path, url), "interrupted")
    s.stop()  # the server goes away
    assert_user_error(fetch("wiki1m", tmp_path, url), "cannot reach", "resume")
    part = tmp_path / "corpus" / "wiki1m_for_simcse.txt.part"
    assert part.exists()
    back = Server({"wiki1m_for_simcse.txt": WIKI})
    try:
        proc = fetch("wiki1m", tmp_path, back.url)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert back.ranges and back.ranges[0] > 0
        assert (tmp_path / "corpus" / "wiki1m_for_simcse.txt").read_bytes() == WIKI
    finally:
        back.stop()


def test_senteval_installs_downstream_atomically(server, tmp_path):
    proc = fetch("senteval", tmp_path, server.url)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "downstream" / "STS" / "STSBenchmark" / "sts-dev.csv").read_bytes() == b"x\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_senteval_tar_with_path_traversal_is_refused(tmp_path):
    s = Server({"senteval.tar": _senteval_tar("../../escape.txt")})
    try:
        assert_user_error(fetch("senteval", tmp_path, s.url), "refusing tar member")
        assert not (tmp_path / "downstream").exists() and not (tmp_path.parent / "escape.txt").exists()
    finally:
        s.stop()


def test_no_data_dir(tmp_path):
    proc = run_cli("data", "fetch", "wiki1m", env={"PLATFORM_DATA_DIR": ""})
    assert_user_error(proc, "no data directory")


def _clustering_files() -> dict[str, bytes]:
    """Small stand-ins for the eight files, as the public copy writes them (label, tab, text; some
    with CRLF and a trailing tab, one line with no text)."""
    from platform.data.fetch import SOURCES

    files = {}
    for i, source in enumerate(SOURCES["clustering"]):
        lines = [f"{1 + k % 3}\t{source.local} text {k}" + ("\t\r" if i % 2 else "") for k in range(9)]
        files[source.remote] = ("\n".join(lines + ["2\t"]) + "\n").encode()
    return files


def test_clustering_sets_install_pinned_and_load(tmp_path, monkeypatch):
    """``fetch clustering``: the eight files from the mirror's relative paths, each checked against
    its pinned sha256 (pinned here to the stand-ins' own), into ``<data>/clustering/<Name>.tsv``,
    where the evaluator reads them."""
    import dataclasses

    from platform.data import fetch as fetch_module
    from platform.evaluation.clustering import PAPER_SETS, load_labelled
    from tests.helpers import run_main

    files = _clustering_files()
    pinned = [dataclasses.replace(s, sha256=hashlib.sha256(files[s.remote]).hexdigest())
              for s in fetch_module.SOURCES["clustering"]]
    monkeypatch.setitem(fetch_module.SOURCES, "clustering", pinned)
    server = Server(files)
    try:
        proc = run_main("data", "fetch", "clustering", "--data-dir", str(tmp_path), env={"PLATFORM_DATA_MIRROR": server.url})
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "clustering").iterdir()) == sorted(f"{n}.tsv" for n in PAPER_SETS)
    texts, labels = load_labelled("Tweet", tmp_path)
    assert texts[:2] == ["clustering/Tweet.tsv text 0", "clustering/Tweet.tsv text 1"] and texts[-1] == "."
    assert labels.tolist() == [0, 1, 2] * 3 + [1]


def test_a_clustering_file_that_is_not_the_pinned_one_is_refused(tmp_path):
    """The real pins: a mirror's file with other bytes is refused, and nothing is installed."""
    server = Server(_clustering_files())
    try:
        proc = fetch("clustering", tmp_path, server.url)
    finally:
        server.stop()
    assert_user_error(proc, "sha256")
    assert not list((tmp_path / "clustering").glob("*.tsv")) and not list(tmp_path.rglob("*.part"))
