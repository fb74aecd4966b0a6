"""SentEval transfer tasks: the engine against numbers from SentEval's own engine, the data in
SentEval's order, and a real slice through the CLI."""

from __future__ import annotations

import json

import pytest

from platform.evaluation import classifier as engine
from platform.evaluation import transfer
from tests.helpers import assert_user_error, run_main
from tests.senteval_reference import FIXTURE, cases, text_digest

REFERENCE = json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("kind", engine.CLASSIFIERS)
@pytest.mark.parametrize("protocol", ["inner_kfold", "kfold", "split"])
def test_engine_returns_sentevals_numbers(kind, protocol):
    """Dev and test scores equal those SentEval's InnerKFold/KFold/SplitClassifier returned on the
    same embeddings (tests/senteval_reference.py), in the "test" setting and with scikit-learn.
    The inner k-fold case runs its 410 fits in two processes, the others in this one: both give
    SentEval's numbers, so parallel fits change nothing."""
    data = cases()[protocol]
    cfg = engine.ClassifierConfig(kind=kind)
    if protocol == "inner_kfold":
        got = engine.inner_kfold(data["x"], data["y"], data["nclasses"], cfg, jobs=2)
    elif protocol == "kfold":
        got = engine.kfold(data["train"], data["test"], data["nclasses"], cfg, jobs=1)
    else:
        got = engine.split(data["train"], data["dev"], data["test"], data["nclasses"], cfg, jobs=1)
    assert (got.dev, got.test) == (REFERENCE[f"{kind}/{protocol}"]["dev"], REFERENCE[f"{kind}/{protocol}"]["test"])


def test_a_changed_setting_changes_the_numbers():
    """Control: the comparison above can fail (tenacity 2 instead of SentEval's 5)."""
    data = cases()["kfold"]
    got = engine.kfold(data["train"], data["test"], data["nclasses"], engine.ClassifierConfig(tenacity=2))
    assert (got.dev, got.test) != (REFERENCE["pytorch/kfold"]["dev"], REFERENCE["pytorch/kfold"]["test"])


def test_grids_are_sentevals():
    assert engine.ClassifierConfig().grid("inner") == [1e-5, 1e-4, 1e-3, 1e-2]
    sk = engine.ClassifierConfig(kind="sklearn")
    assert sk.grid("inner") == sk.grid("split") == [0.25, 0.5, 1, 2, 4, 8]
    assert sk.grid("kfold") == [0.5, 1, 2, 4, 8, 16, 32]


def test_tasks_come_in_sentevals_order(data_root):
    """Each task's sentences in the order SentEval's task classes encode them (recorded from
    SentEval on the same files): its folds are drawn over that order."""
    root = data_root / "downstream"
    order = {name: transfer.binary_task(name, root)[0] for name in transfer.BINARY}
    order["SST2"] = [t for part in ("train", "dev", "test") for t in transfer.sst2(root, part)[0]]
    order["TREC"] = transfer.trec(root, "train_5500.label")[0] + transfer.trec(root, "TREC_10.label")[0]
    order["MRPC"] = [t for part in ("train", "test") for side in (0, 1) for t in transfer.mrpc(root, part)[side]]
    assert {name: text_digest(texts) for name, texts in order.items()} == REFERENCE["order"]
    texts, labels = transfer.binary_task("CR", root)
    assert len(texts) == 3775 and texts.count("") == 4  # SentEval keeps the empty lines
    lengths = [len(t.split()) for t in texts]
    assert lengths == sorted(lengths) and set(labels.tolist()) == {0, 1}


def test_transfer_slice_through_the_cli(tiny_model, tmp_path):
    proc = run_main("evaluate", str(tiny_model), "--pooler", "avg", "--tasks", "MR", "--transfer-limit", "200",
                   "--transfer-classifier", "sklearn", "--json", str(tmp_path / "t.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    acc = json.loads((tmp_path / "t.json").read_text())["scores"]["MR"]
    assert 0 <= acc <= 100 and "transfer MR" in proc.stdout and "sklearn" in proc.stdout


def test_unknown_transfer_task_and_bad_jobs(cli):
    assert_user_error(cli("evaluate", "minilm", "--tasks", "IMDB"), "unknown task 'IMDB'")
    assert_user_error(cli("evaluate", "minilm", "--tasks", "MR", "--transfer-jobs", "0"), "--transfer-jobs")
