"""VaSCL through the platform: a 2-trial sweep and its bad input."""

from __future__ import annotations

import pytest

from tests.conftest import assert_user_error, run_cli
from tests.test_cli import _runs, _train_args


def test_tune_vascl_two_trials(tiny_model, small_corpus, tmp_path, mlflow_uri):
    args = _train_args(tiny_model, small_corpus, tmp_path)
    proc = run_cli("tune", "vascl", "--num-samples", "2", *args, "--set", "batch_size=64",
                   env={"MLFLOW_TRACKING_URI": mlflow_uri})
    assert proc.returncode == 0, proc.stderr[-3000:]
    c, runs = _runs(mlflow_uri, "vascl")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in runs)
    for child in children:
        assert {"delta", "k", "lr", "head_lr_scale"} <= set(child.data.params)
        history = c.get_metric_history(child.info.run_id, "vascl_neighbourhood")
        assert history and all(m.value > 0 for m in history)


@pytest.mark.parametrize(
    "sets,needle",
    [(["k=32", "batch_size=32"], "smaller than the batch size"), (["k=0"], "k must be >= 1"), (["delta=0"], "delta must be > 0")],
)
def test_vascl_bad_input(sets, needle):
    args = [a for s in sets for a in ("--set", s)]
    assert_user_error(run_cli("train", "vascl", *args), needle)
