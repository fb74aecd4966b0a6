"""The benchmark suite (``python -m benchmarks``): every case runs at its smoke size here and
appends one record that says what ran where (command, machine, packages) and what it measured, so
that a rename in the platform cannot rot a case unseen. Run as the user runs it, in a process of
its own, each case's record written to a temporary folder instead of ``benchmarks/results/``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.scenario  # about 12 minutes of Ray, Tune and model starts: beside the boot rehearsal


def _cases() -> list[str]:
    tree = ast.parse((ROOT / "benchmarks" / "harness.py").read_text(encoding="utf-8"))
    found = [node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "CASES" for t in node.targets)]
    return ast.literal_eval(found[0])


def test_the_list_names_every_case_with_what_it_measures():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "list"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = [line.split()[0] for line in proc.stdout.splitlines()]
    assert listed == _cases() and len(listed) >= 15
    assert all(len(line.split(None, 1)[1]) > 30 for line in proc.stdout.splitlines())
    # Each case is a module of its own under benchmarks/cases/, and nothing else is left beside the harness.
    modules = {p.stem for p in (ROOT / "benchmarks" / "cases").glob("*.py")} - {"__init__"}
    assert modules == {c.replace("-", "_") for c in listed}
    assert {p.name for p in (ROOT / "benchmarks").glob("*.py")} == {"__init__.py", "__main__.py", "harness.py", "common.py"}


@pytest.mark.parametrize("case", _cases())
def test_every_case_runs_at_its_smoke_size_and_appends_one_record(case, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "run", case, "--smoke", "--results", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = (tmp_path / f"{case}.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["case"] == case and record["smoke"] is True
    assert record["command"].startswith(f"python -m benchmarks run {case}") and record["command"].endswith("--smoke")
    env = record["environment"]
    assert len(env["commit"]) == 40 and env["python"] == sys.version.split()[0] and env["cores"] >= 1
    assert env["packages"]["torch"] and env["packages"]["ray"] and env["machine"]
    assert record["wall_s"] > 0 and record["peak_rss_mib"] > 0
    assert record["beside"]["own_cores"] > 0 and isinstance(record["beside"]["alone"], bool), record["beside"]
    assert record["figures"] or record["ratios"] or record["tables"], record
