"""The prompt recipes scored and selected as their authors do, checked against procedures
re-derived from the authors' evaluation code (``tests.reference``): the final test's text and
tokens on all seven STS test sets (BERT's WordPiece, and a byte-level BPE standing in for
RoBERTa's), PromptBERT's denoised STS-B dev, CoT-BERT's step of two replicas, and whole
checkpoints through ``platform.evaluate`` against the authors' procedure with plain transformers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from methods.encoder import Encoder, load_tokenizer
from methods.prompt import template_bias, wrap
from methods.recipe import Recipe
from platform.config import TrainConfig
from platform.evaluation.sts import STSEvaluator
from platform.data.pipeline import StepInputs
from tests.helpers import build_tiny_roberta, recipe_of
from tests.reference import (MASKS, TEST_SPECS, authors_mask_rows, authors_template, authors_test_text,
                             promptbert_delta, promptbert_dev_embeddings)

CASES = sorted(TEST_SPECS)


@pytest.fixture(scope="module")
def tiny_roberta(tmp_path_factory, test_sentences):
    """A tiny random RoBERTa whose byte-level BPE was trained here on the test sentences and templates."""
    texts = test_sentences + [authors_test_text(r, TEST_SPECS[(r, "roberta")], "x", "<mask>") for r in MASKS]
    return build_tiny_roberta(tmp_path_factory.mktemp("tiny-roberta"), texts)


def model_path(backbone: str, tiny_model, tiny_roberta):
    return str(tiny_model if backbone == "bert" else tiny_roberta)


def _differing_rows(a: dict, b: dict, pad_id: int) -> torch.Tensor:
    """Which rows of two right-padded batches hold other tokens (or another length)."""
    width = max(a["input_ids"].shape[1], b["input_ids"].shape[1])

    def padded(x):
        ids = torch.where(x["attention_mask"].bool(), x["input_ids"], pad_id)
        return torch.nn.functional.pad(ids, (0, width - ids.shape[1]), value=pad_id)

    return (padded(a) != padded(b)).any(1) | (a["attention_mask"].sum(1) != b["attention_mask"].sum(1))


@pytest.mark.parametrize("name,backbone", CASES)
def test_the_final_test_embeds_the_authors_text_and_tokens(name, backbone, tiny_model, tiny_roberta, test_sentences):
    """Every distinct sentence of the seven STS test sets, as the exported encoder tokenises it for
    the final test, is token for token what the authors' test script tokenises (PromptBERT's and
    CoT-BERT's "." rule and one-string template, SNCSE's " ."), with the embedding mask where the
    script takes it. On BERT's WordPiece the training's spliced form gives the same ids; on the
    byte-level BPE it does not (the sentence's first word has no leading space there): a test
    embedded spliced would fail here."""
    pooling = recipe_of(name, backbone).encoder.pooling()
    encoder = Encoder.from_pretrained(model_path(backbone, tiny_model, tiny_roberta), pooler="mask",
                                      prompt=dataclasses.asdict(pooling))
    tok = encoder.tokenizer
    spliced_differ = 0
    for start in range(0, len(test_sentences), 512):
        chunk = test_sentences[start:start + 512]
        ours = encoder.tokenize(chunk)
        theirs, positions = authors_mask_rows(tok, [authors_test_text(name, TEST_SPECS[(name, backbone)], s, tok.mask_token)
                                                    for s in chunk], MASKS[name])
        differ = _differing_rows(ours, theirs, tok.pad_token_id)
        assert not differ.any(), [chunk[i] for i in differ.nonzero()[:3, 0].tolist()]
        assert ours["prompt_mask"].tolist() == positions
        if name == "promptbert":  # the training's spliced form, once per tokenizer
            plain = tok([pooling.prepare(s) for s in chunk], padding=True, return_tensors="pt")
            spliced = wrap(dict(plain), encoder._template(pooling.template), tok.pad_token_id)
            spliced_differ += int(_differing_rows(spliced, ours, tok.pad_token_id).sum())
    if name == "promptbert" and backbone == "bert":
        assert spliced_differ == 0
    elif name == "promptbert":
        assert spliced_differ > len(test_sentences) // 2
    if name != "sncse":  # the "." rule moves a share of every task's text (SICK-R has no final stops)
        assert sum(pooling.prepare(s) != s for s in test_sentences) > len(test_sentences) // 4


def test_each_recipe_scores_dev_as_its_authors_do():
    """PromptBERT selects on the denoised dev score (the trainer's sentemb_forward), CoT-BERT on the
    plain one (--mask_embedding_sentence_delta_no_delta_eval), SNCSE with the one-string template
    its selection script fills; none of them has the test's "." rule at dev, and the final test
    never denoises."""
    dev = {name: Recipe.named(name).dev_prompt() for name in MASKS}
    assert (dev["promptbert"].denoise, dev["cotbert"].denoise, dev["sncse"].denoise) == ("shift", "none", "none")
    assert (dev["promptbert"].joined, dev["cotbert"].joined, dev["sncse"].joined) == (False, False, True)
    assert not any(p.period for p in dev.values())
    test = {name: Recipe.named(name).encoder.pooling() for name in MASKS}
    assert all(p.denoise == "none" and p.joined for p in test.values())
    assert test["promptbert"].period and test["cotbert"].period and not test["sncse"].period


def test_promptbert_dev_score_is_the_authors_denoised_score(tiny_model, data_root):
    """STS-B dev as the loop scores it for PromptBERT equals the authors' ``CLTrainer.evaluate``
    through ``sentemb_forward`` (the bias of 128 shifted templates in eval mode, subtracted at each
    sentence's length), run one sentence at a time: embeddings and score. Without the denoising
    (the final test's rules) the score is another."""
    recipe = Recipe.named("promptbert")
    tok = load_tokenizer(str(tiny_model))
    exported = recipe.export_encoder(recipe.build(Encoder.from_pretrained(str(tiny_model))))
    evaluator = STSEvaluator.stsb_dev(data_root)
    bs, es = authors_template(TEST_SPECS[("promptbert", "bert")], tok)
    theirs_emb = promptbert_dev_embeddings(exported.backbone, tok, bs, es, evaluator.sentences)
    ours_emb = evaluator.encode(exported, pooler="mask", prompt=recipe.dev_prompt())
    torch.testing.assert_close(ours_emb, theirs_emb, rtol=1e-4, atol=1e-5)
    ours = evaluator(exported, pooler="mask", prompt=recipe.dev_prompt())["STSBenchmark"]
    theirs = evaluator.score(theirs_emb)["STSBenchmark"]
    assert ours == pytest.approx(theirs, abs=0.01)
    assert abs(evaluator(exported, pooler="mask")["STSBenchmark"] - theirs) > 0.5


def test_authors_code_shifts_each_templates_bias_after_the_anchors_prefix(tiny_model):
    """PromptBERT's ``get_delta`` shifts the positive template's positions after ``len(cls.bs)``,
    the anchor's prefix (``fidelity=authors_code``); the paper's denoising shifts each template
    after its own. A positive template with a longer prefix tells them apart."""
    tok = load_tokenizer(str(tiny_model))
    custom = 'In other words , "{sentence}" means{mask}.'
    bs2, es2 = authors_template('*cls*_In_other_words_,_"*sent_0*"_means*mask*.*sep+*', tok)
    anchor_bs, _ = authors_template(TEST_SPECS[("promptbert", "bert")], tok)
    biases = {}
    for fidelity in ("paper", "authors_code"):
        recipe = Recipe.named("promptbert", positive_template=custom, fidelity=fidelity)
        backbone = Encoder.from_pretrained(str(tiny_model), dropout=0.0).backbone.eval()
        state = recipe.build(Encoder(backbone, tok, "mask")).prompt
        with torch.no_grad():
            biases[fidelity] = template_bias(backbone, state.tokens[1], 9, "shift", tok.cls_token_id, tok.sep_token_id,
                                             tok.pad_token_id, state.shift_at)
            reference = promptbert_delta(backbone, tok, bs2, es2, 10, anchor_bs if fidelity == "authors_code" else None)
        torch.testing.assert_close(biases[fidelity], reference, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(biases["paper"][1:], biases["authors_code"][1:], atol=1e-4)


SENTENCES = ["A man is playing a guitar.", "two dogs run across the field", "Hi there", "The cat sat on the mat.",
             "A woman slices an onion", "Kids play in the park.", "the stock market fell", "Rain is expected today"]


def _cot_step(tiny_model, sentences, **values):
    torch.manual_seed(0)  # the same MLP head for every model built here
    recipe = Recipe.named("cotbert", **values)
    model = recipe.build(Encoder.from_pretrained(str(tiny_model), dropout=0.0), 32, len(sentences))
    inputs = StepInputs(recipe, str(tiny_model), 32)
    batch = inputs.nest(inputs.collate(inputs.arrays({"sentence": np.array(sentences, dtype=object)})))
    loss, _ = recipe.loss(model, batch, 0)
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_a_replica_step_is_the_mean_of_its_replicas_losses(tiny_model):
    """CoT-BERT's step of R=2 replicas (the authors' DataParallel): the mean of two independent
    Eq. 3 losses over each half of the batch, with no row of one half in the other's denominator;
    its gradient is the mean of theirs. One loss over the whole batch is another."""
    loss, grads = _cot_step(tiny_model, SENTENCES, replicas=2)
    halves = [_cot_step(tiny_model, SENTENCES[:4]), _cot_step(tiny_model, SENTENCES[4:])]
    assert loss == pytest.approx((halves[0][0] + halves[1][0]) / 2, rel=1e-6)
    assert set(grads) == set(halves[0][1])
    largest = max(g.abs().max().item() for g in grads.values())
    for name, g in grads.items():
        # Denoising's round-off, as in the DDP test of the prompt recipes (tests/methods/test_losses.py).
        atol = max(1e-6, 1e-3 * g.abs().max().item(), 2e-5 * largest)
        torch.testing.assert_close(g, (halves[0][1][name] + halves[1][1][name]) / 2, rtol=1e-4, atol=atol, msg=name)
    whole, _ = _cot_step(tiny_model, SENTENCES)
    assert whole != pytest.approx(loss, rel=1e-3)


def test_replicas_take_a_batch_they_divide_and_no_aux_term():
    from platform.errors import ConfigError

    cfg = TrainConfig.build("cotbert", "paper")
    assert (cfg.batch_size, cfg.shared.replicas) == (256, 2)
    assert cfg.sources["replicas"].startswith("profile 'paper' (methods.cotbert)")
    with pytest.raises(ConfigError, match="multiple of replicas"):
        TrainConfig.build("cotbert", "local", {"batch_size": 9, "replicas": 2, "num_workers": 1})
    with pytest.raises(ConfigError, match="aux=bml"):
        TrainConfig.build("sncse", "local", {"replicas": 2})
