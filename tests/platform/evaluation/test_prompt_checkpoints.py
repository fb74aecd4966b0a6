"""Each prompt recipe's exported checkpoint through ``python -m platform.evaluate`` gives, on every
STS task, the score of the authors' test procedure re-implemented with plain transformers
(``tests.reference.authors_sts_scores``): on BERT for the three recipes, and on a byte-level BPE
standing in for RoBERTa for PromptBERT, whose test template there is not its training one."""

from __future__ import annotations

import json

import pytest
import torch

from methods.encoder import Encoder, load_tokenizer
from platform.data import STS_TASKS
from tests.helpers import build_tiny_roberta, recipe_of, run_main
from tests.reference import MASKS, TEST_SPECS, authors_sts_scores, authors_test_text

# Four whole 7-task evaluations and their slow references: beside the other end-to-end scenarios.
pytestmark = pytest.mark.scenario
CASES = [("promptbert", "bert"), ("sncse", "bert"), ("cotbert", "bert"), ("promptbert", "roberta")]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, test_sentences):
    """Each recipe's exported encoder (its prompt.json beside the weights) on each tiny backbone.
    Their weights are drawn 10x wider than BERT's init: a tiny random model's STS pairs then have
    cosines far enough apart that float round-off (batching, padding) moves no Spearman rank."""
    from transformers import BertConfig, BertModel

    from platform.data.columns import TINY_BERT

    bert = tmp_path_factory.mktemp("wide-bert")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        BertModel(BertConfig(**TINY_BERT, initializer_range=0.2)).save_pretrained(bert)
    load_tokenizer("minilm").save_pretrained(bert)
    texts = test_sentences + [authors_test_text(r, TEST_SPECS[(r, "roberta")], "x", "<mask>") for r in MASKS]
    roberta = build_tiny_roberta(tmp_path_factory.mktemp("wide-roberta"), texts, initializer_range=0.2)
    out = {}
    for name, backbone in CASES:
        recipe = recipe_of(name, backbone)
        torch.manual_seed(0)
        model = recipe.build(Encoder.from_pretrained(str(bert if backbone == "bert" else roberta)))
        out[(name, backbone)] = recipe.export_encoder(model).save_pretrained(tmp_path_factory.mktemp(f"{name}-{backbone}"))
    return out


@pytest.mark.parametrize("name,backbone", CASES)
def test_a_checkpoint_scores_what_the_authors_evaluation_gives(name, backbone, checkpoints, sts_tests, tmp_path):
    """``python -m platform.evaluate CHECKPOINT`` on a prompt recipe's export gives, on each of the
    seven tasks, the score of the authors' test procedure re-implemented with plain transformers
    (their text, one-string tokens, the mask's state, cosine, Spearman over the task's pairs)."""
    from transformers import AutoModel, AutoTokenizer

    path = checkpoints[(name, backbone)]
    proc = run_main("evaluate", str(path), "--json", str(tmp_path / "scores.json"))
    assert proc.returncode == 0, proc.stderr
    ours = json.loads((tmp_path / "scores.json").read_text())["scores"]
    tasks = {t: (p.sent1, p.sent2, p.scores) for t, p in sts_tests.items()}
    theirs = authors_sts_scores(AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path), name,
                                TEST_SPECS[(name, backbone)], tasks, MASKS[name])
    for task in STS_TASKS:
        assert ours[task] == pytest.approx(theirs[task], abs=0.01), task
