"""Alignment and uniformity (Wang & Isola, 2020, Eq. 2 and 3; SimCSE Sec. 5) against direct
loops over pairs, from the embeddings STS-B dev is scored with; SimCSE's Fig. 2 drawn."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from methods.encoder import Encoder
from platform.data import load_sts
from platform.evaluation.sts import STSEvaluator, geometry_figure


def _slow(emb: torch.Tensor, pairs, index) -> dict[str, float]:
    """Both measures with explicit loops over pairs, in float64."""
    f = [e / math.sqrt(sum(float(v) ** 2 for v in e)) for e in emb.double()]
    i1, i2 = (t.tolist() for t in index)
    positives = [(a, b) for a, b, g in zip(i1, i2, pairs.scores) if g > 4.0]
    align = sum(float(((f[a] - f[b]) ** 2).sum()) for a, b in positives) / len(positives)
    distinct = sorted(set(i1) | set(i2))
    total, count = 0.0, 0
    for x in range(len(distinct)):
        for y in range(x + 1, len(distinct)):
            total += math.exp(-2 * float(((f[distinct[x]] - f[distinct[y]]) ** 2).sum()))
            count += 1
    return {"alignment": align, "uniformity": math.log(total / count)}


def test_alignment_and_uniformity_equal_loops_over_pairs(tiny_model, data_root):
    dev = load_sts("STSBenchmark", data_root, split="dev")
    subset = {"STSBenchmark": {"sent1": dev.sent1[:120], "sent2": dev.sent2[:120], "scores": list(dev.scores[:120])}}
    evaluator = STSEvaluator.from_pairs(subset)
    encoder = Encoder.from_pretrained("minilm", pooler="avg")  # a sentence-tuned space: values far from 0
    emb = evaluator.encode(encoder)
    ours = evaluator.geometry(emb)
    slow = _slow(emb, evaluator.pairs[0], evaluator.index[0])
    assert sum(g > 4.0 for g in subset["STSBenchmark"]["scores"]) >= 10
    assert ours["alignment"] == pytest.approx(slow["alignment"], abs=1e-5)
    assert ours["uniformity"] == pytest.approx(slow["uniformity"], abs=1e-5)
    assert 0 < ours["alignment"] < 1 and -4 < ours["uniformity"] < -0.5
    # The tiny random BERT's [CLS] states are nearly one point: alignment and uniformity near 0.
    tiny = evaluator.geometry(evaluator.encode(Encoder.from_pretrained(str(tiny_model))))
    assert tiny["alignment"] < 1e-3 and tiny["uniformity"] > -1e-2


def test_the_figure_draws_each_trajectory(tmp_path):
    from PIL import Image

    path = geometry_figure({"simcse": [(125, 0.16, -2.3), (0, 0.10, -1.74), (250, 0.19, -2.6)],
                            "una": [(0, 0.10, -1.74), (125, 0.14, -2.1)]}, tmp_path / "geometry.png")
    image = np.asarray(Image.open(path).convert("RGB"))
    assert image.shape[0] > 400 and image.shape[1] > 600
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 20  # drawn, not blank
