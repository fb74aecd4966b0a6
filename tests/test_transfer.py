"""SentEval transfer tasks: the classifier protocol on synthetic data and a real slice through the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from platform.evaluation.transfer import kfold_accuracy
from tests.conftest import assert_user_error, run_cli


def test_kfold_accuracy_separable_and_random():
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 60)
    x = rng.normal(size=(120, 8)) + y[:, None] * 4.0
    assert kfold_accuracy(x, y) == pytest.approx(100.0)
    assert 25 < kfold_accuracy(rng.normal(size=(120, 8)), y) < 75  # labels carry no signal


def test_transfer_slice_through_the_cli(tiny_model, tmp_path):
    proc = run_cli("evaluate", str(tiny_model), "--pooler", "avg", "--tasks", "MR", "--transfer-limit", "200",
                   "--json", str(tmp_path / "t.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    acc = json.loads((tmp_path / "t.json").read_text())["scores"]["MR"]
    assert 0 <= acc <= 100 and "transfer MR" in proc.stdout


def test_unknown_transfer_task():
    assert_user_error(run_cli("evaluate", "minilm", "--tasks", "IMDB"), "unknown task 'IMDB'")
