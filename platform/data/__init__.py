"""Training corpora and the SentEval STS files, read from one data directory. It imports no
torch: every command (``report``, ``data fetch``, an error line) reads its constants.

The data directory (environment variable ``PLATFORM_DATA_DIR``) has SentEval's layout::

    $PLATFORM_DATA_DIR/downstream/STS/STS12-en-test/STS.input.MSRpar.txt ...
    $PLATFORM_DATA_DIR/downstream/STS/STSBenchmark/sts-{train,dev,test}.csv
    $PLATFORM_DATA_DIR/downstream/SICK/SICK_test_annotated.txt
    $PLATFORM_DATA_DIR/corpus/*.txt[.gz]   (one sentence per line)

STS loading follows SentEval's rules: STS12-16 keep only pairs with a gold score and split the
(already tokenised) sentences on whitespace; STS-B reads columns 5, 6 (sentences) and 4 (score)
of the tab-separated csv; SICK-R skips the header and reads columns 1, 2 and 3. Sentences are
re-joined with single spaces, as SimCSE's SentEval batcher does.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
from pathlib import Path

import numpy as np

from platform import settings
from platform.errors import DataError


STS_YEARS = {
    "STS12": ("STS12-en-test", ["MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"]),
    "STS13": ("STS13-en-test", ["FNWN", "headlines", "OnWN"]),
    "STS14": ("STS14-en-test", ["deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"]),
    "STS15": ("STS15-en-test", ["answers-forums", "answers-students", "belief", "headlines", "images"]),
    "STS16": ("STS16-en-test", ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"]),
}
STS_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")
SHORT_NAMES = {**{t: t for t in STS_TASKS[:5]}, "STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}

LAYOUT_HINT = (
    "fetch it with: python -m platform.data fetch senteval; expected SentEval layout: $PLATFORM_DATA_DIR/downstream/STS/STS12-en-test/STS.input.MSRpar.txt, "
    "$PLATFORM_DATA_DIR/downstream/STS/STSBenchmark/sts-dev.csv, "
    "$PLATFORM_DATA_DIR/downstream/SICK/SICK_test_annotated.txt"
)


def data_dir(path: str | os.PathLike | None = None) -> Path:
    """The data directory: ``path`` if given, else ``$PLATFORM_DATA_DIR``."""
    raw = path if path is not None else settings.get(settings.DATA_DIR)
    if not raw:
        raise DataError(f"no data directory: set {settings.DATA_DIR} to a folder in SentEval layout ({LAYOUT_HINT})")
    root = Path(raw).expanduser().resolve()
    if not root.is_dir():
        raise DataError(f"data directory {root} does not exist ({settings.DATA_DIR}); {LAYOUT_HINT}")
    return root


# ---------------------------------------------------------------------------------------------
# Corpus


def _open_bytes(path: Path):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


# A sentence corpus has no business with megabyte lines; reading them whole (a binary dump, a
# file without newlines) could exhaust memory before anything else notices.
MAX_LINE_BYTES = 1 << 20


def read_corpus(path: str | os.PathLike, limit: int | None = None) -> list[str]:
    """Sentences of a ``.txt`` or ``.txt.gz`` corpus: one per line, stripped, blank lines skipped.

    Raises ``DataError`` for a missing, empty or binary file, for bytes that are not UTF-8 and for
    lines longer than ``MAX_LINE_BYTES`` (naming the line).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"corpus {path} not found")
    sentences: list[str] = []
    try:
        with _open_bytes(path) as f:
            lines = iter(lambda: f.readline(MAX_LINE_BYTES + 1), b"")  # never more than the limit in memory
            for lineno, raw in enumerate(lines, start=1):
                if len(raw.rstrip(b"\r\n")) > MAX_LINE_BYTES:
                    raise DataError(
                        f"corpus {path} line {lineno} is longer than {MAX_LINE_BYTES:,} bytes; expected one sentence per line"
                    )
                if b"\x00" in raw:
                    raise DataError(f"corpus {path} looks binary (NUL byte on line {lineno}); expected UTF-8 text")
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError as exc:
                    raise DataError(
                        f"corpus {path} line {lineno}: bytes that are not UTF-8 at column {exc.start + 1}"
                    ) from None
                if line:
                    sentences.append(line)
                    if limit and len(sentences) >= limit:
                        break
    except (OSError, EOFError) as exc:  # e.g. a truncated or corrupt gzip stream
        raise DataError(f"corpus {path} cannot be read: {exc}") from None
    if not sentences:
        raise DataError(f"corpus {path} has no sentences (empty or only blank lines)")
    return sentences


def resolve_corpus(name: str, root: Path | None = None) -> Path:
    """A corpus given as a path, or as a file name under ``$PLATFORM_DATA_DIR/corpus``."""
    p = Path(name).expanduser()
    if p.is_file():
        return p.resolve()
    if not p.is_absolute():
        try:
            candidate = data_dir(root) / "corpus" / name
        except DataError:
            candidate = None
        if candidate is not None and candidate.is_file():
            return candidate
    hint = "; fetch it with: python -m platform.data fetch wiki1m" if Path(name).name == "wiki1m_for_simcse.txt" else ""
    raise DataError(f"corpus {name!r} not found (as a path, or under ${settings.DATA_DIR}/corpus/){hint}")


# ---------------------------------------------------------------------------------------------
# STS


@dataclasses.dataclass
class STSPairs:
    name: str
    sent1: list[str]
    sent2: list[str]
    scores: np.ndarray
    subset: list[str] | None = None  # STS12-16: each pair's subset (a resampling stratum)

    def __len__(self) -> int:
        return len(self.scores)

    def plain(self) -> dict[str, list]:
        """As plain lists (``STSEvaluator.from_pairs``'s input): what a driver sends to workers on
        nodes without a data folder."""
        return {"sent1": list(self.sent1), "sent2": list(self.sent2), "scores": [float(x) for x in self.scores]}


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise DataError(f"missing {path}; {LAYOUT_HINT}")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 ({exc.reason} at byte {exc.start})") from None


def _detok(s: str) -> str:
    return " ".join(s.split())


def load_sts_year(task: str, root: Path) -> STSPairs:
    """All subsets of one STS year concatenated (the "all" setting), gold-filtered as SentEval."""
    folder, subsets = STS_YEARS[task]
    base = root / "downstream" / "STS" / folder
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    labels: list[str] = []
    for subset in subsets:
        inputs = _read_lines(base / f"STS.input.{subset}.txt")
        gold = _read_lines(base / f"STS.gs.{subset}.txt")
        if len(inputs) != len(gold):
            raise DataError(f"{base}/STS.input.{subset}.txt has {len(inputs)} lines but its gold file {len(gold)}")
        for lineno, (pair, g) in enumerate(zip(inputs, gold), start=1):
            if g.strip() == "":
                continue
            cols = pair.split("\t")
            if len(cols) != 2:
                raise DataError(f"{base}/STS.input.{subset}.txt line {lineno}: expected 2 tab-separated sentences")
            s1.append(_detok(cols[0]))
            s2.append(_detok(cols[1]))
            scores.append(float(g))
            labels.append(subset)
    return STSPairs(task, s1, s2, np.asarray(scores, dtype=np.float64), labels)


def _tsv_pairs(name: str, path: Path, columns: tuple[int, int, int], header: bool = False) -> STSPairs:
    """Sentence pairs and scores from the given (sentence, sentence, score) columns of a TSV."""
    s1, s2, scores = [], [], []
    a, b, score = columns
    first = 2 if header else 1
    for lineno, line in enumerate(_read_lines(path)[first - 1 :], start=first):
        cols = line.strip().split("\t")
        if len(cols) <= max(columns):
            raise DataError(f"{path} line {lineno}: expected at least {max(columns) + 1} tab-separated columns")
        s1.append(_detok(cols[a]))
        s2.append(_detok(cols[b]))
        scores.append(float(cols[score]))
    return STSPairs(name, s1, s2, np.asarray(scores))


def load_sts(task: str, root: Path | None = None, split: str = "test") -> STSPairs:
    """One evaluation task; ``split`` applies to STS-B and SICK-R (STS12-16 are test-only)."""
    root = root if isinstance(root, Path) else data_dir(root)
    if task in STS_YEARS:
        return load_sts_year(task, root)
    if task == "STSBenchmark":
        return _tsv_pairs(f"STSBenchmark-{split}", root / "downstream" / "STS" / "STSBenchmark" / f"sts-{split}.csv", (5, 6, 4))
    if task == "SICKRelatedness":
        files = {"train": "SICK_train.txt", "dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
        return _tsv_pairs(f"SICKRelatedness-{split}", root / "downstream" / "SICK" / files[split], (1, 2, 3), header=True)
    raise DataError(f"unknown STS task {task!r}; choose from {', '.join(STS_TASKS)}")
