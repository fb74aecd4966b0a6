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


def test_transfer_slice_through_the_cli(tiny_model, tmp_path, monkeypatch):
    """A second evaluation of the same model encodes nothing and gives the same numbers."""
    monkeypatch.setenv("PLATFORM_CACHE_DIR", str(tmp_path / "cache"))
    args = ("evaluate", str(tiny_model), "--pooler", "avg", "--tasks", "MR", "SICKRelatedness", "--transfer-limit",
            "200", "--transfer-classifier", "sklearn")
    first = run_main(*args, "--json", str(tmp_path / "t.json"))
    assert first.returncode == 0, first.stderr[-2000:]
    scores = json.loads((tmp_path / "t.json").read_text())["scores"]
    assert 0 <= scores["MR"] <= 100 and "transfer MR" in first.stdout and "sklearn" in first.stdout
    assert "200 distinct sentences, 200 encoded now" in first.stdout
    second = run_main(*args, "--json", str(tmp_path / "t2.json"))
    assert "200 distinct sentences, 0 encoded now" in second.stdout
    assert json.loads((tmp_path / "t2.json").read_text())["scores"] == scores


def test_unknown_transfer_task_and_bad_jobs(cli):
    assert_user_error(cli("evaluate", "minilm", "--tasks", "IMDB"), "unknown task 'IMDB'")
    assert_user_error(cli("evaluate", "minilm", "--tasks", "MR", "--transfer-jobs", "0"), "--transfer-jobs")


@pytest.mark.parametrize("protocol", ["inner_kfold", "kfold", "split"])
def test_the_batched_engine_returns_sentevals_numbers(protocol):
    """The default engine (all fits of a grid as one program) on the recorded cases: SentEval's
    numbers, as the serial engine (test above) gives them."""
    data = cases()[protocol]
    cfg = engine.ClassifierConfig(engine="batched")
    if protocol == "inner_kfold":
        got = engine.inner_kfold(data["x"], data["y"], data["nclasses"], cfg)
    elif protocol == "kfold":
        got = engine.kfold(data["train"], data["test"], data["nclasses"], cfg)
    else:
        got = engine.split(data["train"], data["dev"], data["test"], data["nclasses"], cfg)
    assert (got.dev, got.test) == (REFERENCE[f"pytorch/{protocol}"]["dev"], REFERENCE[f"pytorch/{protocol}"]["test"])


def test_batched_adam_steps_are_torch_adams():
    """Kingma & Ba (2015), Algorithm 1, as torch.optim.Adam implements it (L2 added to the gradient),
    written out for many fits: 30 steps of 6 fits (3 L2 values x 2 groups with their own batches;
    group 1's batches short, and group 1 sitting out every third step as at the end of a shorter
    pass; one fit stopped) against nn.Linear + CrossEntropyLoss + torch.optim.Adam, fit by fit."""
    import numpy as np
    import torch

    from platform.evaluation import classifier_fits

    rng = np.random.RandomState(0)
    x = torch.from_numpy(rng.normal(size=(90, 7)).astype(np.float32))
    y = torch.from_numpy(rng.randint(0, 3, size=90))
    onehot = torch.nn.functional.one_hot(y, 3).float()
    xa = classifier_fits.augment(x)
    l2s = [1e-5, 1e-3, 1e-1]
    w0, b0 = classifier_fits._initial_layer(7, 3, 1111)
    G = 2
    fits = classifier_fits.AdamFits(w0, b0, torch.tensor([l2s, l2s]), max_steps=40)
    fits.keep[1, 2] = 0.0  # a stopped fit keeps its weights
    fits.all_running = False
    batches = [[rng.permutation(90)[:16] for _ in range(30)], [rng.permutation(90)[:16] for _ in range(30)]]
    taken = {0: [], 1: []}
    for s in range(30):
        idx = torch.from_numpy(np.stack([batches[0][s], batches[1][s]]))
        mask = torch.ones(G, 16, dtype=torch.bool)
        mask[1, 11:] = False  # group 1's batches hold 11 rows
        on = torch.tensor([True, s % 3 != 2])
        fits.step(xa[idx], onehot[idx], mask, on)
        for g in range(G):
            if on[g]:
                taken[g].append(batches[g][s][: 16 if g == 0 else 11])
    for g in range(G):
        for k, reg in enumerate(l2s):
            layer = torch.nn.Linear(7, 3)
            with torch.no_grad():
                layer.weight.copy_(w0)
                layer.bias.copy_(b0)
            opt = torch.optim.Adam(layer.parameters(), weight_decay=reg)
            for rows in taken[g] if fits.keep[g, k] else []:
                rows = torch.from_numpy(rows)
                loss = torch.nn.functional.cross_entropy(layer(x[rows]), y[rows])
                opt.zero_grad()
                loss.backward()
                opt.step()
            torch.testing.assert_close(fits.w[g, k], layer.weight.detach(), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(fits.b[g, k], layer.bias.detach(), rtol=1e-5, atol=1e-6)
    assert torch.equal(fits.w[1, 2], w0) and torch.equal(fits.b[1, 2], b0) and fits.t.tolist() == [30, 20]
    # The full-batch path (no mask) is the same step.
    a = classifier_fits.AdamFits(w0, b0, torch.tensor([l2s]), max_steps=5)
    b = classifier_fits.AdamFits(w0, b0, torch.tensor([l2s]), max_steps=5)
    idx = torch.from_numpy(batches[0][0])[None]
    a.step(xa[idx], onehot[idx])
    b.step(xa[idx], onehot[idx], torch.ones(1, 16, dtype=torch.bool), torch.tensor([True]))
    assert torch.equal(a.w, b.w) and torch.equal(a.b, b.b)


def test_batched_and_serial_engines_agree_on_real_embeddings(tmp_path, monkeypatch):
    """On a slice of CR and TREC embedded by the packaged backbone (real sentences, real geometry,
    hundreds of Adam steps per fit), the batched engine returns the serial engine's dev and test
    scores and predictions. Batched matrix products may round differently from single ones in the
    last float32 bits; a prediction could only flip on a near-tie of two logits, which these sets do
    not have: if one ever shows up, the difference is one sentence's worth of accuracy."""
    from methods.encoder import Encoder
    from platform.evaluation.embedding_cache import EmbeddingStore

    monkeypatch.setenv("PLATFORM_CACHE_DIR", str(tmp_path))
    store = EmbeddingStore(Encoder.from_pretrained("minilm", pooler="avg"), "avg")
    cr = transfer.task_features("CR", store.embed, limit=300)
    trec = transfer.task_features("TREC", store.embed, limit=300)
    serial, fast = engine.ClassifierConfig(engine="serial"), engine.ClassifierConfig(engine="batched")
    a = engine.inner_kfold(*cr.parts["all"], 2, serial, k=3, jobs=1)
    b = engine.inner_kfold(*cr.parts["all"], 2, fast, k=3)
    assert (a.dev, a.test) == (b.dev, b.test)
    a = engine.kfold(trec.parts["train"], trec.parts["test"], 6, serial, k=4, jobs=1)
    b = engine.kfold(trec.parts["train"], trec.parts["test"], 6, fast, k=4)
    assert (a.dev, a.test) == (b.dev, b.test) and (a.predictions == b.predictions).all()
    assert 60 < a.test < 100  # a real classifier, not chance
