"""``python -m benchmarks report --check``: the records under ``benchmarks/results/`` are the suite's
measurements. Each of the three defects a record can have is refused, in one line naming it; run as
a user runs it, on a folder of records written here (``--results``)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.e2e  # the command, a few interpreter starts a test


@functools.cache
def _cases() -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "list"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    return [line.split()[0] for line in proc.stdout.splitlines()]


def _record(case: str, command: str | None = None, **extra) -> dict:
    return {"case": case, "date": "2000-01-01T00:00:00Z", "smoke": False,
            "command": command or f"python -m benchmarks run {case}", "environment": {"machine": "2-core CPU"}, **extra}


def _write(folder, records: list[dict]) -> None:
    for r in records:
        with open(folder / f"{r['case']}.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps(r) + "\n")


def _page(folder) -> None:
    """The folder's page, written by ``report --results FOLDER``."""
    subprocess.run([sys.executable, "-m", "benchmarks", "report", "--results", str(folder)], cwd=ROOT,
                   capture_output=True, text=True, timeout=300, check=True)


def _check(folder, *extra: dict) -> list[str]:
    """The defects ``report --check`` prints for the folder (``extra`` records added, and its page
    written, first: only the records' defects remain): [] when it passes."""
    _write(folder, list(extra))
    _page(folder)
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "report", "--results", str(folder), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    lines = proc.stderr.splitlines()
    assert proc.returncode == (1 if lines else 0), proc.stderr
    return lines


def test_a_record_of_every_case_and_nothing_else_passes(tmp_path):
    _write(tmp_path, [_record(case) for case in _cases()])
    assert len(_cases()) >= 15 and _check(tmp_path) == []


def test_listing_and_the_page_import_nothing_a_case_measures_with(tmp_path):
    """``list`` and ``report`` read each case's description from its source (a start, not 5 s of
    torch, transformers and Ray); what they read is what the imported case says."""
    for command in (["list"], ["report", "--results", str(tmp_path)]):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "benchmarks", *command], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines()}
        assert not imported & {"torch", "transformers", "ray", "mlflow", "methods", "platform"}, command
    compare = ("from benchmarks import harness\n"
               "for name in harness.CASES:\n"
               "    case = harness.load(name)\n"
               "    assert harness.about(name) == harness.About(case.measures, case.meaning, case.gpu), name\n"
               "print(len(harness.CASES))")
    proc = subprocess.run([sys.executable, "-c", compare], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and int(proc.stdout) == len(_cases()), proc.stderr[-2000:]


def test_a_stale_page_is_refused(tmp_path):
    _write(tmp_path, [_record(case) for case in _cases()])
    _page(tmp_path)
    _write(tmp_path, [_record("una")])
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "report", "--check", "--results", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stderr.strip() == f"{tmp_path / 'RESULTS.md'} is stale: run `python -m benchmarks report`"


def test_a_record_of_no_case_is_refused(tmp_path):
    _write(tmp_path, [_record(case) for case in _cases()])
    assert _check(tmp_path, _record("gpu-step")) == ["gpu-step: 1 record(s) of no case of the suite"]


def test_a_case_with_no_full_size_record_is_refused(tmp_path):
    _write(tmp_path, [_record(case) for case in _cases() if case != "una"] + [_record("una", smoke=True)])
    assert _check(tmp_path) == ["una: no full-size record (`python -m benchmarks run una`)"]


def test_a_record_whose_command_is_not_its_cases_is_refused(tmp_path):
    _write(tmp_path, [_record(case) for case in _cases()])
    assert _check(tmp_path, _record("una", "python benchmarks/una_speed.py"),
                  _record("san", "python -m benchmarks run una")) == [
        "san: a record (2000-01-01) whose command is not this case's: 'python -m benchmarks run una'",
        "una: a record (2000-01-01) whose command is not this case's: 'python benchmarks/una_speed.py'"]


def test_an_imported_record_stands_only_for_a_gpu_case_measured_on_a_gpu(tmp_path):
    _write(tmp_path, [_record(case) for case in _cases()])
    gpu = {"machine": "H100/H200 GPU machine"}
    assert _check(tmp_path,
                  _record("train-step", imported=True, environment=gpu),  # a GPU case's GPU import: kept
                  _record("una", imported=True, environment=gpu),  # a case that runs here: re-run it
                  _record("paper-precision", imported=True),  # a GPU case, imported from a CPU
                  _record("eval-cost", environment={"gpu": "NVIDIA H200", "machine": "NVIDIA H200, 16-core"})) == [
        "paper-precision: an imported record (2000-01-01) that is not a GPU case's GPU measurement: re-run it with "
        "the harness",
        "una: an imported record (2000-01-01) that is not a GPU case's GPU measurement: re-run it with the harness"]



def test_a_record_measures_what_ran_beside_it(tmp_path):
    """``alone`` in a record is measured, not claimed: a busy process of someone else's (the shell
    that starts it exits at once, so it belongs to init, not to the run) counts as beside the case;
    the case's own work does not."""
    subprocess.run(["sh", "-c", "(timeout 25 sh -c 'while :; do :; done' &)"], check=True)
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "run", "sts-evaluator", "--smoke", "--results", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    beside = json.loads((tmp_path / "sts-evaluator.jsonl").read_text(encoding="utf-8"))["beside"]
    assert beside["alone"] is False and beside["other_cores"] > 0.5 and beside["other_peak_cores"] > 0.8, beside
    assert beside["own_cores"] > 0.2, beside


def test_a_case_shorter_than_the_window_has_its_whole_run_as_its_busiest_stretch():
    """A case shorter than the peak's 5-second window: its busiest stretch is the whole run, so the
    peak is not below the mean (spread over the window, a 2-second run's peak read well under its
    mean, and a short case's smoke beside a busy core could read as almost alone)."""
    subprocess.run(["sh", "-c", "(timeout 5 sh -c 'while :; do :; done' &)"], check=True)
    probe = ("import json, time\nfrom benchmarks.harness import Beside\nwith Beside() as beside:\n    time.sleep(2)\n"
             "print(json.dumps([beside.cores, beside.peak_cores]))\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cores, peak = json.loads(proc.stdout.splitlines()[-1])
    assert cores > 0.3 and peak >= cores * 0.999, (cores, peak)


def test_a_ratio_that_misses_its_target_is_flagged_on_the_page(tmp_path):
    """The page marks each ratio whose value misses the target it opens with, and only those."""
    ratios = {"fast": {"value": 0.05, "target": "<= 0.1"}, "slow": {"value": 0.7, "target": "<= 0.1"},
              "about one": {"value": 1.05, "target": "~1: the host adds nothing"},
              "far from one": {"value": 1.6, "target": "~1: the host adds nothing"},
              "more": {"value": 0.9, "target": "> 1"}, "free": {"value": 3.0, "target": ""}}
    _write(tmp_path, [_record("eval-cost", ratios=ratios)])
    subprocess.run([sys.executable, "-m", "benchmarks", "report", "--results", str(tmp_path)], cwd=ROOT,
                   capture_output=True, text=True, timeout=300, check=True)
    page = (tmp_path / "RESULTS.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| ") and "|" in line[2:]}
    assert {k for k, line in rows.items() if "**missed**" in line} == {"slow", "far from one", "more"}
