"""The STS evaluator against a direct computation of the SentEval protocol, and its tokenising once
per tokenizer (a run evaluates STS-B dev every ``eval_steps`` on the same sentences)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from tokenizers.normalizers import BertNormalizer, Replace, Sequence
from transformers import AutoTokenizer

from methods.encoder import Encoder
from platform.data import load_sts
from platform.evaluation.sts import STSEvaluator


@pytest.fixture(scope="module")
def pairs(data_root) -> dict[str, dict[str, list]]:
    """The first 60 pairs of STS-B dev, and 40 of STS12 (sentences shared across tasks)."""
    def head(task, split, n):
        p = load_sts(task, data_root, split=split).plain()
        return {k: list(v)[:n] for k, v in p.items()}

    return {"STSBenchmark": head("STSBenchmark", "dev", 60), "STS12": head("STS12", "test", 40)}


def _direct(encoder: Encoder, pairs: dict[str, list]) -> float:
    """Spearman x100 of the cosine of each pair, each sentence encoded on its own (no padding)."""
    with torch.inference_mode():
        e1 = torch.cat([encoder(encoder.tokenize([s])) for s in pairs["sent1"]]).double()
        e2 = torch.cat([encoder(encoder.tokenize([s])) for s in pairs["sent2"]]).double()
    cos = (e1 * e2).sum(-1) / (e1.norm(dim=-1) * e2.norm(dim=-1))
    return float(spearmanr(cos.numpy(), np.asarray(pairs["scores"], dtype=float)).statistic * 100)


def test_scores_are_the_protocols_and_a_second_evaluation_tokenises_nothing(tiny_model, pairs):
    enc = Encoder.from_pretrained(str(tiny_model)).eval()
    ev = STSEvaluator.from_pairs(pairs, batch_size=16)
    first = ev(enc)
    for task, p in pairs.items():
        assert first[task] == pytest.approx(_direct(enc, p), abs=1e-3)
    batches = ev._batches
    assert batches is not None and batches.tokenizer is enc.tokenizer
    with torch.no_grad():  # the next evaluation of a run: the weights moved, the sentences did not
        for w in enc.parameters():
            w.add_(0.05 * torch.randn_like(w))
    second = ev(enc)
    assert ev._batches is batches
    assert second != first
    assert second == STSEvaluator.from_pairs(pairs, batch_size=16)(enc)


def test_another_tokenizer_gets_its_own_tokens(tiny_model, pairs):
    """An evaluator called on an encoder with another tokenizer (the same, but its normaliser
    writes every "a" as "e": other tokens for most sentences) scores it as a new evaluator does,
    not with the first one's tokens."""
    first = Encoder.from_pretrained(str(tiny_model)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    tokenizer.backend_tokenizer.normalizer = Sequence([BertNormalizer(), Replace("a", "e")])
    other = Encoder(first.backbone, tokenizer)
    assert first.tokenize(["a man"])["input_ids"].tolist() != other.tokenize(["a man"])["input_ids"].tolist()
    ev = STSEvaluator.from_pairs(pairs, batch_size=16)
    ev(first)
    scores = ev(other)
    assert scores == STSEvaluator.from_pairs(pairs, batch_size=16)(other)
    assert scores != ev(first)
