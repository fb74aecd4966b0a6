"""Poolers against direct computations, strict loading, and export to sentence-transformers."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from methods.encoder import Encoder, WeightLoadError, pool, resolve_backbone
from methods.recipe import NAMED, Recipe
from platform.data.pipeline import StepInputs

SENTS = ["a man is playing a guitar .", "the weather is nice today", "ok"]


def test_poolers_match_direct_computation(tiny_model):
    enc = Encoder.from_pretrained(str(tiny_model)).eval()
    inputs = enc.tokenize(SENTS)
    out = enc.backbone(**inputs, output_hidden_states=True)
    mask = inputs["attention_mask"]
    for i in range(len(SENTS)):
        n = int(mask[i].sum())
        last, first = out.last_hidden_state[i, :n], out.hidden_states[1][i, :n]
        torch.testing.assert_close(enc(inputs, pooler="cls_before_pooler")[i], out.last_hidden_state[i, 0])
        torch.testing.assert_close(enc(inputs, pooler="avg")[i], last.mean(0))
        torch.testing.assert_close(enc(inputs, pooler="avg_first_last")[i], ((first + last) / 2).mean(0))
        dense = enc.backbone.pooler.dense
        torch.testing.assert_close(enc(inputs, pooler="cls")[i], torch.tanh(dense(out.last_hidden_state[i, 0])))


def test_encode_restores_input_order(tiny_model):
    enc = Encoder.from_pretrained(str(tiny_model))
    batched = enc.encode(SENTS, batch_size=2)
    one_by_one = torch.cat([enc.encode([s]) for s in SENTS])
    torch.testing.assert_close(batched, one_by_one, rtol=1e-4, atol=1e-5)


def test_unknown_pooler():
    with pytest.raises(ValueError, match="unknown pooler"):
        pool("max", torch.ones(1, 2), torch.ones(1, 2, 3))


def test_alias_resolves_to_packaged_model():
    assert resolve_backbone("minilm").endswith("model")
    assert resolve_backbone("bert-base-uncased") == "bert-base-uncased"


def test_strict_loading_rejects_missing_and_unexpected_weights(tiny_model, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    weights = load_file(broken / "model.safetensors")
    key = next(k for k in weights if "encoder.layer.1" in k)
    weights["encoder.layer.7.extra.weight"] = weights.pop(key)
    save_file(weights, broken / "model.safetensors")
    with pytest.raises(WeightLoadError, match="missing.*unexpected"):
        Encoder.from_pretrained(str(broken))


def test_pretraining_heads_are_not_unexpected(tiny_model, tmp_path):
    """bert-base-uncased ships MLM/NSP heads (cls.*); an encoder legitimately drops them."""
    import shutil

    with_heads = tmp_path / "with_heads"
    shutil.copytree(tiny_model, with_heads)
    weights = load_file(with_heads / "model.safetensors")
    weights["cls.predictions.bias"] = torch.zeros(30522)
    save_file(weights, with_heads / "model.safetensors")
    Encoder.from_pretrained(str(with_heads))


def test_export_folds_mlp_into_pooler(tiny_model):
    method = Recipe.named("simcse")
    model = method.build(Encoder.from_pretrained(str(tiny_model)))
    torch.nn.init.normal_(model.projection.dense.weight)
    inputs = model.encoder.tokenize(SENTS)
    with torch.no_grad():
        model.eval()
        trained_view = model.project({"x": model(inputs)}, ["x"])["x"]  # z: [CLS] through the trained MLP
        exported = method.export_encoder(model)
        torch.testing.assert_close(exported(inputs, pooler="cls"), trained_view)


@pytest.mark.parametrize("pooler", ["cls_before_pooler", "avg", "cls"])
def test_sentence_transformers_export_embeds_identically(tiny_model, tmp_path, pooler):
    from sentence_transformers import SentenceTransformer

    from platform.run.export import export_sentence_transformers

    out = export_sentence_transformers(tiny_model, tmp_path / "st", pooler)
    st = SentenceTransformer(str(out), device="cpu")
    ours = Encoder.from_pretrained(str(tiny_model)).encode(SENTS, pooler=pooler)
    theirs = torch.as_tensor(st.encode(SENTS))
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-5)


def test_a_hub_model_at_a_pinned_revision(tmp_path):
    """``name@revision`` loads that commit of a hub model (the paper profiles pin theirs); a path
    with an '@' in it stays a path; an alias stays its packaged folder."""
    from methods.encoder import pretrained_source
    from platform.config import TrainConfig

    assert pretrained_source("bert-base-uncased@86b5e0934494bd15c9632b12f734a8a67f723594") == (
        "bert-base-uncased", {"revision": "86b5e0934494bd15c9632b12f734a8a67f723594"})
    folder = tmp_path / "me@work"
    folder.mkdir()
    assert pretrained_source(str(folder)) == (str(folder), {})
    assert pretrained_source("minilm")[0].endswith("model")
    bert, roberta = ("bert-base-uncased@86b5e0934494bd15c9632b12f734a8a67f723594",
                     "roberta-base@e2da8e2f811d1448a5b465c236feacd80ffbac7b")
    for method in NAMED:  # every named recipe's paper profiles pin their backbone (VaSCL's paper is RoBERTa's)
        assert TrainConfig.build(method, "paper").model == (roberta if method == "vascl" else bert), method
        assert TrainConfig.build(method, "paper-roberta").model == roberta, method
    assert TrainConfig.build("san", "paper").params["san"].mlm.endswith("@86b5e0934494bd15c9632b12f734a8a67f723594")


def test_step_inputs_are_what_tokenize_gives(tiny_model):
    """The pipeline's fixed-width arrays, collated per batch, are ``Encoder.tokenize``'s tensors for
    the same rows (padding to the batch's longest row, truncation at ``max_len``, an empty
    negative as [CLS] [SEP]), and the recipe's other step columns come along as tensors."""
    from methods.augcse import NO_AUGMENTATION

    enc = Encoder.from_pretrained(str(tiny_model))
    recipe = Recipe.named("augcse", augmentations="random_swap,random_delete")
    inputs = StepInputs(recipe, str(tiny_model), 8)
    batch = {"sentence": ["a man is playing a guitar on a stage tonight .", "ok", "the cat"],
             "augmented": ["", "ok ok", "cat the"], "aug_label": ["random_swap", NO_AUGMENTATION, "random_delete"]}
    arrays = inputs.arrays(batch)
    assert arrays["sentence/input_ids"].shape == (3, 8) and arrays["sentence/input_ids"].dtype.name == "int32"
    got = inputs.nest(inputs.collate(arrays))
    for column in ("sentence", "augmented"):
        want = enc.tokenize(batch[column], max_len=8)
        assert set(got[column]) == set(want)
        for key in want:
            assert torch.equal(got[column][key], want[key]), (column, key)
    assert got["augmented"]["attention_mask"][0].sum() == 2  # the empty row: [CLS] [SEP]
    assert torch.equal(got["aug_label"], recipe.tensor_columns(batch, None)["aug_label"])
    # Rows of a shorter batch are cut to that batch's longest row, as tokenize pads them.
    short = inputs.nest(inputs.collate({k: v[1:] for k, v in arrays.items()}))
    assert torch.equal(short["sentence"]["input_ids"], enc.tokenize(batch["sentence"][1:], max_len=8)["input_ids"])


@pytest.mark.parametrize("recipe", ["simcse", "promptbert", "cotbert"])
def test_evaluation_batches_padded_to_a_few_widths_embed_as_unpadded_ones(tiny_model, recipe):
    """``Encoder.batches`` rounds each batch's width up to ``WIDTH_MULTIPLE`` tokens (a compiled
    backbone reuses its graphs): every pooler gives the unpadded batch's embeddings, to float
    rounding, the prompt poolers (wrapped and joined templates) included; the widths used are
    multiples of 32 only."""
    from methods.encoder import WIDTH_MULTIPLE

    r = Recipe.named(recipe)
    encoder = r.export_encoder(r.build(Encoder.from_pretrained(str(tiny_model))))
    sentences = SENTS + ["a much longer sentence about a man who plays the guitar on a stage in front of people " * 2,
                         "two dogs run", "prices rose again this year as they did the year before"]
    poolers = [r.eval_pooler()] if recipe != "simcse" else ["cls", "cls_before_pooler", "avg", "avg_first_last"]
    padded = encoder.batches(sentences, batch_size=2, prompt=r.dev_prompt())
    plain = encoder.batches(sentences, batch_size=2, prompt=r.dev_prompt(), multiple=1)
    assert {c["input_ids"].shape[1] % WIDTH_MULTIPLE for c in padded.chunks} == {0}
    assert any(c["input_ids"].shape[1] % WIDTH_MULTIPLE for c in plain.chunks)
    for pooler in poolers:
        a, b = encoder.encode_batches(padded, pooler=pooler), encoder.encode_batches(plain, pooler=pooler)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(a[0], a[3], atol=1e-4)
