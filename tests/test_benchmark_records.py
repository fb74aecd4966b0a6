"""``python -m benchmarks report --check``: the records under ``benchmarks/results/`` are the suite's
measurements. Each of the three defects a record can have is refused, in one line naming it."""

from __future__ import annotations

import json

from benchmarks import harness


def _record(case: str, command: str | None = None, **extra) -> dict:
    return {"case": case, "date": "2026-12-02T00:00:00Z", "smoke": False,
            "command": command or f"python -m benchmarks run {case}", "environment": {"machine": "2-core CPU"}, **extra}


def _write(folder, records: list[dict]) -> None:
    for r in records:
        with open(folder / f"{r['case']}.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps(r) + "\n")


def _complete(folder) -> None:
    _write(folder, [_record(case) for case in harness.CASES])


def test_a_record_of_every_case_and_nothing_else_passes(tmp_path):
    _complete(tmp_path)
    assert harness.defects(tmp_path) == []


def test_a_record_of_no_case_is_refused(tmp_path):
    _complete(tmp_path)
    _write(tmp_path, [_record("gpu-step")])
    assert harness.defects(tmp_path) == ["gpu-step: 1 record(s) of no case of the suite"]


def test_a_case_with_no_full_size_record_is_refused(tmp_path):
    _write(tmp_path, [_record(case) for case in harness.CASES if case != "una"] + [_record("una", smoke=True)])
    assert harness.defects(tmp_path) == ["una: no full-size record (`python -m benchmarks run una`)"]


def test_a_record_whose_command_is_not_its_cases_is_refused(tmp_path):
    _complete(tmp_path)
    _write(tmp_path, [_record("una", "python benchmarks/una_speed.py"), _record("san", "python -m benchmarks run una")])
    assert harness.defects(tmp_path) == [
        "san: a record (2026-12-02) whose command is not this case's: 'python -m benchmarks run una'",
        "una: a record (2026-12-02) whose command is not this case's: 'python benchmarks/una_speed.py'"]


def test_an_imported_record_stands_only_for_a_gpu_case_measured_on_a_gpu(tmp_path):
    _complete(tmp_path)
    gpu = {"machine": "H100/H200 GPU machine"}
    _write(tmp_path, [_record("train-step", imported=True, environment=gpu),  # a GPU case's GPU import: kept
                      _record("una", imported=True, environment=gpu),  # a case that runs here: re-run it
                      _record("paper-precision", imported=True),  # a GPU case, imported from a CPU
                      _record("eval-cost", environment={"gpu": "NVIDIA H200", "machine": "NVIDIA H200, 16-core"})])
    assert harness.defects(tmp_path) == [
        "paper-precision: an imported record (2026-12-02) that is not a GPU case's GPU measurement: re-run it with "
        "the harness",
        "una: an imported record (2026-12-02) that is not a GPU case's GPU measurement: re-run it with the harness"]
