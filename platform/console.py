"""What the commands print besides the per-evaluation line: tables of results, plain-text help;
the figures they draw; and which of the libraries' log notes they leave out."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from platform.data import SHORT_NAMES
from typing import Iterator, TextIO


class _Drop(logging.Filter):
    def __init__(self, needles: tuple[str, ...]):
        super().__init__()
        self.needles = needles

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(n in str(record.msg) for n in self.needles)


def drop_notes(notes: dict[str, tuple[str, ...]]) -> None:
    """Leave out the records of each named logger whose message holds one of its strings (notes of
    a library that are not the user's to act on); idempotent."""
    for name, needles in notes.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(needles))


def format_frame(frame) -> str:
    """A pandas DataFrame as an aligned text table (floats to 2 decimals, tiny or huge ones in g)."""
    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.4g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.2f}"
        return "" if value is None else str(value)

    header = list(frame.columns)
    body = [[cell(v) for v in row] for row in frame.itertuples(index=False)]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]
    lines = [" | ".join(h.ljust(w) for h, w in zip(header, widths)), "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(c.ljust(w) for c, w in zip(r, widths)) for r in body]
    return "\n".join(lines)


def pyplot():
    """``matplotlib.pyplot`` drawing to files (Agg): a command on a head node or in a job has no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a Markdown (GitHub) table: a header, its rule, a line per row of cells."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def seed_table(per_seed: list[dict[str, float]], seeds: list[int], scores: dict[str, float]) -> str:
    """One row per seed's 7-task scores, then their mean +- std (``scores``)."""
    import pandas as pd


    def f(t: str, v: float) -> str:  # Spearman x100 to the hundredth; alignment and uniformity (about 0..4) finer
        return f"{v:.2f}" if t in SHORT_NAMES or t == "avg" else f"{v:.4f}"

    rows = [{"": f"seed {s}", **{SHORT_NAMES.get(t, t): f(t, v) for t, v in row.items()}}
            for s, row in zip(seeds, per_seed)]
    rows.append({"": "mean +- std", **{SHORT_NAMES.get(t, t): f"{f(t, scores[t])} +- {f(t, scores[t + '_std'])}"
                                       for t in per_seed[0]}})
    return format_frame(pd.DataFrame(rows))


def command_parser(prog: str, doc: str, example: str):
    """An argparse parser whose ``--help`` reads as plain text: the module docstring without its
    reStructuredText markup, each option's default, and an example."""
    import argparse
    import re

    class Formatter(argparse.RawDescriptionHelpFormatter):
        def _get_help_string(self, action):  # a default worth saying, once
            text = action.help or ""
            if "default" not in text and action.default not in (None, False, argparse.SUPPRESS) and action.option_strings:
                text += " (default: %(default)s)"
            return text

    plain = re.sub(r"``([^`]+)``", r"\1", doc).strip()
    return argparse.ArgumentParser(prog=prog, description=plain, formatter_class=Formatter,
                                   epilog=f"example:\n  {example}")


def as_number(text: str):
    """``text`` as an int or a float where it reads as one (a run's params are text)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def short(value) -> str:
    """A searched value as the console shows it: floats to 3 significant digits (a value read back
    from a run's params is text)."""
    value = as_number(value) if isinstance(value, str) else value
    return f"{value:.3g}" if isinstance(value, float) else str(value)


@contextlib.contextmanager
def still_working(what: str, every: float = 30.0, stream: TextIO | None = None) -> Iterator[None]:
    """On a terminal, ``<what>: still working (1 min 30 s)`` every ``every`` seconds until the block
    ends: the end of a sweep (the 7 tasks, the baseline, the export, the registry) says what it is
    doing at least that often. Off a terminal (a log file, CI) it prints nothing."""
    out = stream or sys.stdout
    if not getattr(out, "isatty", lambda: False)():
        yield
        return
    done, start = threading.Event(), time.monotonic()

    def beat() -> None:
        while not done.wait(every):
            elapsed = int(time.monotonic() - start)
            print(f"{what}: still working ({elapsed // 60} min {elapsed % 60} s)", file=out, flush=True)

    thread = threading.Thread(target=beat, name="still-working", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
