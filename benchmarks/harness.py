"""The suite's one harness: a case's arguments and its smoke size, the run (its output teed, its
markdown tables read back, wall time with the device synchronised, peak memory), the machine it
ran on, and one JSON record appended per run under ``benchmarks/results/``; RESULTS.md is written
from those records (``python -m benchmarks report``)."""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import importlib
import io
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
REPORT = ROOT / "benchmarks" / "RESULTS.md"
CASES = ["train-step", "loop-host-share", "ray-train-overhead", "eval-cost", "sts-evaluator", "transfer",
         "una", "san", "san-mask-predict", "augcse", "vascl", "fp32-logits", "paper-precision", "checkpoint-cost", "reliability",
         "shuffle", "corpus-1m", "mlflow-auth", "report-poll", "asha-rungs", "uncertainty", "esimcse", "actor-memory"]
PACKAGES = ["torch", "ray", "transformers", "mlflow", "sentence-transformers", "scikit-learn", "scipy", "numpy",
            "spacy", "nlpaug", "optuna"]


@dataclasses.dataclass
class Case:
    """A named measurement: ``run(args, bench)`` prints its results (markdown tables are read back
    into the record) and states the ratios it exists to show with ``bench.ratio``."""

    name: str
    measures: str  # one line: what the case measures
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, "Bench"], None]
    smoke: list[str]  # the arguments of a size that runs here in seconds
    meaning: str = ""  # a short paragraph: what the numbers mean
    gpu: bool = False  # measured on a GPU machine (which has neither Ray nor MLflow): its figures are a GPU's


def missed(ratio: dict[str, Any]) -> str:
    """`` **missed**`` where a ratio's value misses the target it opens with (``<= x``, ``>= x``,
    ``< x``, ``> x``, ``~x`` within 10 %), else nothing (also for a target it cannot read)."""
    import re

    found = re.match(r"\s*(<=|>=|<|>|~)\s*([0-9]+(?:\.[0-9]+)?)", str(ratio.get("target") or ""))
    if not found:
        return ""
    op, bound, value = found[1], float(found[2]), ratio["value"]
    met = {"<=": value <= bound, ">=": value >= bound, "<": value < bound, ">": value > bound,
           "~": abs(value - bound) <= 0.1 * bound}[op]
    return "" if met else " **missed**"


class Bench:
    """What a case hands the harness besides its printed tables: named figures and ratios."""

    def __init__(self) -> None:
        self.figures: dict[str, float] = {}
        self.ratios: dict[str, dict[str, Any]] = {}

    def figure(self, name: str, value: float) -> float:
        self.figures[name] = round(float(value), 6)
        return value

    def ratio(self, name: str, value: float, target: str = "") -> float:
        """A ratio the case exists to show, with its target (e.g. ``<= 1.10``) when it has one."""
        self.ratios[name] = {"value": round(float(value), 4), "target": target}
        print(f"ratio {name}: {value:.3f}" + (f" (target {target})" if target else ""), flush=True)
        return value

    @staticmethod
    def sync() -> None:
        """Wait for the device: a timing that ends before the GPU does measures nothing."""
        if "torch" in sys.modules:
            torch = sys.modules["torch"]
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()

    @contextlib.contextmanager
    def timed(self, name: str):
        """Wall seconds of the block, the device synchronised at both ends, kept as a figure."""
        self.sync()
        start = time.perf_counter()
        yield
        self.sync()
        self.figure(name, time.perf_counter() - start)


def _module(name: str) -> str:
    """The module of the case ``name`` under ``benchmarks/cases/``."""
    if name not in CASES:
        raise SystemExit(f"no case {name!r}; `python -m benchmarks list` lists them")
    return name.replace("-", "_")


def load(name: str) -> Case:
    return importlib.import_module(f"benchmarks.cases.{_module(name)}").CASE


@dataclasses.dataclass(frozen=True)
class About:
    """What ``list`` and ``report`` print of a case."""

    measures: str
    meaning: str = ""
    gpu: bool = False


def about(name: str) -> About:
    """A case's description, read from its module's ``CASE = Case(...)`` without importing it: the
    module imports what it measures with (torch, transformers, Ray: 5 s a start), and listing the
    cases or writing the page needs none of it. A case whose description is not literal text is
    imported."""
    import ast

    source = ROOT / "benchmarks" / "cases" / f"{_module(name)}.py"
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["CASE"]:
            call = node.value
            given = {**dict(zip(["name", "measures"], getattr(call, "args", []))),
                     **{k.arg: k.value for k in getattr(call, "keywords", [])}}
            try:
                return About(**{k: ast.literal_eval(v) for k, v in given.items() if k in ("measures", "meaning", "gpu")})
            except (ValueError, TypeError, SyntaxError):
                break
    case = load(name)
    return About(case.measures, case.meaning, case.gpu)


def environment() -> dict[str, Any]:
    """Where a record was measured: commit, machine, Python, torch, CUDA and driver, packages."""
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
    # Dirty: code changed beside the commit (the records the suite writes are not code).
    changed = git("status", "--porcelain", "--", "platform", "methods", "benchmarks", ":!benchmarks/results")
    env: dict[str, Any] = {"commit": git("rev-parse", "HEAD"), "dirty": bool(changed),
                           "host": os.uname().nodename, "cpu": _cpu_name(), "cores": os.cpu_count(),
                           "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
                           "python": sys.version.split()[0], "packages": {}}
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            env["packages"][name] = metadata.version(name)
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        env["cuda"] = torch.version.cuda if torch.cuda.is_available() else None
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True).stdout.strip().split("\n")[0]
    env["machine"] = (f"{env['gpu']}, " if env.get("gpu") else "") + f"{env['cores']}-core {env['cpu']}, {env['memory_gib']} GiB"
    return env


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    return os.uname().machine


def tables_of(text: str) -> list[list[list[str]]]:
    """The markdown tables in a case's output, as rows of cells (header first, no rule line)."""
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|") and line.rstrip().endswith("|"):
            cells = [c.strip() for c in line.strip()[1:-1].split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                rows.append(cells)
        elif rows:
            tables.append(rows)
            rows = []
    return tables


class _Tee(io.TextIOBase):
    def __init__(self, stream) -> None:
        self.stream, self.buffer_ = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.buffer_.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def _cpu_ticks() -> dict[int, tuple[int, int]]:
    """Each live process's (parent pid, user+system clock ticks), read from /proc."""
    ticks = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            ticks[int(stat.parent.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return ticks


class Beside:
    """The cores that processes outside this run's own process tree kept busy while it ran (and
    that the tree did), sampled from /proc twice a second: what "alone on the machine" means,
    measured rather than claimed. Beside the mean, the busiest ``window`` seconds: a short burst
    beside a case's sensitive moment is hidden in a long case's mean. It undercounts: a process's
    last half second before it ends is missed."""

    def __init__(self, every: float = 0.5, window: float = 5.0) -> None:
        self.every, self.own_ticks, self.other_ticks, self.stop = every, 0, 0, threading.Event()
        self.recent: collections.deque[int] = collections.deque(maxlen=max(1, round(window / every)))
        self.peak_ticks = 0
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _ours(self, ticks: dict[int, tuple[int, int]]) -> set[int]:
        ours, me = set(), os.getpid()
        for pid in ticks:
            chain, seen = pid, 0
            while chain > 1 and seen < 64 and chain != me:
                chain, seen = ticks.get(chain, (0, 0))[0], seen + 1
            if chain == me:
                ours.add(pid)
        return ours

    def _sample(self) -> None:
        before, stopped = self.first, False
        while not stopped:  # one more sample at the stop: a case shorter than a sample still counts
            stopped = self.stop.wait(self.every)
            now = _cpu_ticks()
            ours, others = self._ours(now), 0
            for pid, (_, ticks) in now.items():  # a process new since the last sample: all its ticks are new
                spent = max(0, ticks - before.get(pid, (0, 0))[1])
                if pid in ours:
                    self.own_ticks += spent
                else:
                    others += spent
            self.other_ticks += others
            self.recent.append(others)
            self.peak_ticks = max(self.peak_ticks, sum(self.recent))
            before = now

    def __enter__(self) -> "Beside":
        self.started, self.first = time.perf_counter(), _cpu_ticks()  # here, not when the thread gets the GIL
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        tick = os.sysconf("SC_CLK_TCK")
        elapsed = tick * max(time.perf_counter() - self.started, 1e-9)  # in clock ticks, as /proc counts
        self.cores, self.own_cores = self.other_ticks / elapsed, self.own_ticks / elapsed
        # A case shorter than the window: its busiest stretch is all of it, not that spread over the window.
        self.peak_cores = self.peak_ticks / min(tick * self.every * self.recent.maxlen, elapsed)

    @property
    def alone(self) -> bool:
        return self.cores < ALONE_BELOW and self.peak_cores < ALONE_PEAK_BELOW


# A run is alone on the machine when other processes kept under 0.1 cores busy on average and
# under 0.5 in any 5 seconds.
ALONE_BELOW, ALONE_PEAK_BELOW = 0.1, 0.5


def run(name: str, argv: list[str], smoke: bool, results: Path = RESULTS) -> dict[str, Any]:
    """One run of a case, its record appended to ``results/<case>.jsonl`` and returned."""
    case = load(name)
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks run {name}", description=case.measures)
    case.arguments(parser)
    args = parser.parse_args([*case.smoke, *argv] if smoke else argv)
    bench, tee = Bench(), _Tee(sys.stdout)
    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(tee), Beside() as beside:
        case.run(args, bench)
        Bench.sync()
    peak = {"peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "peak_children_rss_mib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        peak["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    output = tee.buffer_.getvalue()
    record = {"case": name, "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"), "smoke": smoke,
              "command": shlex.join(["python", "-m", "benchmarks", "run", name, *argv, *(["--smoke"] if smoke else [])]),
              "arguments": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "environment": environment(), "wall_s": round(time.perf_counter() - t0, 3), **peak,
              # The 1-minute load average (cores busy) before and after: above ~0.5 before, something
              # else ran beside the case and its timings carry that.
              "load": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
              "beside": {"other_cores": round(beside.cores, 3), "other_peak_cores": round(beside.peak_cores, 3),
                         "own_cores": round(beside.own_cores, 3), "alone": beside.alone},
              "figures": bench.figures, "ratios": bench.ratios, "tables": tables_of(output),
              "lines": [line for line in output.splitlines() if line.strip() and not line.startswith("|")][-40:]}
    results.mkdir(parents=True, exist_ok=True)
    with open(results / f"{name}.jsonl", "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
    print(f"record appended to {results / f'{name}.jsonl'} ({record['wall_s']:.1f} s)", file=sys.stderr)
    return record


def records(results: Path = RESULTS) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(results.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                found.setdefault(record["case"], []).append(record)
    return found


def on_gpu(record: dict[str, Any]) -> bool:
    """Measured on a GPU: the harness names the device (``gpu``); an imported record says so in its machine."""
    env = record.get("environment", {})
    return bool(env.get("gpu")) or "GPU" in env.get("machine", "")


def defects(results: Path = RESULTS) -> list[str]:
    """What makes the records untrue to the suite, one line each: a record of no case, a case with
    no full-size record, a record whose command is not that case's ``python -m benchmarks run``. A
    record carried over from before the harness (``imported``) stands only for a GPU case, from a
    GPU machine, with the command that would re-measure it now."""
    found, problems = records(results), []
    for name, recs in found.items():
        if name not in CASES:
            problems.append(f"{name}: {len(recs)} record(s) of no case of the suite")
            continue
        for r in recs:
            words = shlex.split(r.get("command", ""))
            if words[:5] != ["python", "-m", "benchmarks", "run", name]:
                problems.append(f"{name}: a record ({r['date'][:10]}) whose command is not this case's: {r.get('command')!r}")
            elif r.get("imported") and not (about(name).gpu and on_gpu(r)):
                problems.append(f"{name}: an imported record ({r['date'][:10]}) that is not a GPU case's GPU "
                                "measurement: re-run it with the harness")
    problems += [f"{name}: no full-size record (`python -m benchmarks run {name}`)" for name in CASES
                 if not any(not r.get("smoke") for r in found.get(name, []))]
    return problems


def report(results: Path = RESULTS) -> str:
    """RESULTS.md: per case, its latest full-size record (figures, ratios, command, machine, date)
    and its earlier records by date; the smokes only prove that a case runs."""
    everything = records(results)
    out = ["# Benchmark results", "",
           "Written by `python -m benchmarks report` from the records under `benchmarks/results/` (one JSON line",
           "per run: command, machine, packages, figures); do not edit by hand. Run a case with",
           "`python -m benchmarks run CASE`, list them with `python -m benchmarks list`.", ""]
    names = CASES + sorted(set(everything) - set(CASES))
    for name in names:
        full = [r for r in everything.get(name, []) if not r.get("smoke")]
        case = about(name) if name in CASES else About("a dropped case: its records are kept")
        out += [f"## {name}", "", case.measures, ""]
        if case.meaning:
            out += [case.meaning, ""]
        if not full:
            out += ["No full-size record yet.", ""]
            continue
        latest = full[-1]
        if case.gpu and not on_gpu(latest):
            out += [f"A GPU case with no GPU record yet; on a GPU machine: `python -m benchmarks run {name}`.", ""]
        out += _render(latest)
        if len(full) > 1:
            out += ["Earlier records: " + ", ".join(f"{r['date'][:10]} ({r['environment'].get('machine', '?')})"
                                                    for r in reversed(full[:-1])) + ".", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _render(record: dict[str, Any]) -> list[str]:
    env = record.get("environment", {})
    if record.get("imported"):  # a GPU measurement from before the harness wrote records
        out = [f"Imported GPU record (not written by the harness): measured {record['date'][:10]} on "
               f"{env.get('machine', '?')}. The command that re-measures it now, on a GPU machine:", "",
               f"    {record['command']}", ""]
    else:
        load_before, beside = record.get("load", {}).get("before"), record.get("beside")
        if beside:
            company = ("alone on the machine" if beside["alone"] else "not alone") + \
                f" (other processes kept {beside['other_cores']:.2f} cores busy on average" + \
                (f", {beside['other_peak_cores']:.2f} in their busiest 5 s)" if "other_peak_cores" in beside else ")")
        else:
            company = f"load {load_before} before it ran; what ran beside it was not measured" if load_before is not None else ""
        out = [f"Measured {record['date'][:10]} on {env.get('machine', '?')}"
               + (f", torch {env['packages']['torch']}" if env.get("packages", {}).get("torch") else "")
               + (f", {company}" if company else "") + ":", "",
               f"    {record['command']}", ""]
    if record.get("ratios"):
        out += ["| ratio | value | target |", "|---|---|---|"]
        out += [f"| {k} | {v['value']:.3f} | {v.get('target') or ''}{missed(v)} |" for k, v in record["ratios"].items()] + [""]
    for table in record.get("tables", []):
        width = max(len(row) for row in table)
        rows = [row + [""] * (width - len(row)) for row in table]
        out += ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * width]
        out += ["| " + " | ".join(row) + " |" for row in rows[1:]] + [""]
    if record.get("figures"):
        out += ["| figure | value |", "|---|---|"]
        out += [f"| {k} | {v:.4g} |" for k, v in record["figures"].items()] + [""]
    if record.get("text"):
        out += [record["text"].strip(), ""]
    elif record.get("lines"):
        out += ["```text", *record["lines"][-15:], "```", ""]
    return out
