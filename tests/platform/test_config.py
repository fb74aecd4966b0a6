"""Typed configuration: profiles, --set parsing, validation, and the paper defaults."""

from __future__ import annotations

import dataclasses

import pytest

from methods.recipe import INGREDIENTS, NAMED, SharedParams
from platform.config import ConfigError, TrainConfig, parse_sets


def test_paper_defaults_are_simcse_bert_base():
    cfg = TrainConfig.build("simcse", "paper")
    assert (cfg.model, cfg.batch_size, cfg.lr, cfg.max_len, cfg.epochs, cfg.eval_steps) == (
        "bert-base-uncased@86b5e0934494bd15c9632b12f734a8a67f723594", 64, 3e-5, 32, 1, 125)
    assert cfg.shared.temperature == 0.05 and cfg.dropout == 0.1 and cfg.use_gpu


def test_local_profile_and_set_overrides():
    cfg = TrainConfig.build("simcse", "local", parse_sets(["lr=1e-4", "temperature=0.1", "use_gpu=false"]))
    assert cfg.model == "minilm" and cfg.num_workers == 2
    assert cfg.lr == 1e-4 and cfg.shared.temperature == 0.1 and cfg.use_gpu is False


def test_flat_round_trip():
    cfg = TrainConfig.build("simcse", "local", {"batch_size": "16", "pooler": "avg"})
    again = TrainConfig.from_flat(cfg.flat())
    assert again.flat() == cfg.flat()


@pytest.mark.parametrize(
    "sets,message",
    [
        ({"learning_rate": "1"}, "unknown key 'learning_rate'"),
        ({"lr": "fast"}, "lr='fast' is not a valid float"),
        ({"batch_size": "3.5"}, "batch_size='3.5' is not a whole number"),
        ({"batch_size": "many"}, "batch_size='many' is not a valid int"),
        ({"batch_size": "1e400"}, "batch_size='1e400' is not a finite number"),
        ({"eval_steps": "7.9e0"}, "eval_steps='7.9e0' is not a whole number"),
        ({"lr": "inf"}, "lr='inf' is not a finite number"),
        ({"lr": "nan"}, "lr='nan' is not a finite number"),
        ({"seed": "-1"}, "seed must be in [0, 4294967295]"),
        ({"output_dir": ""}, "output_dir is empty"),
        ({"use_gpu": "maybe"}, "not a valid bool"),
        ({"lr": "0"}, "lr must be > 0"),
        ({"lr": "-1e-5"}, "lr must be > 0"),
        ({"temperature": "0"}, "temperature must be > 0"),
        ({"batch_size": "1"}, "batch_size must be >= 2"),
        ({"batch_size": "9", "num_workers": "2"}, "multiple of num_workers"),
        ({"num_workers": "0"}, "num_workers must be >= 1"),
        ({"precision": "fp8"}, "precision must be fp16, bf16 or fp32"),
        ({"dropout": "1.0"}, "dropout must be in [0, 1)"),
        ({"pooler": "max"}, "unknown pooler"),
    ],
)
def test_bad_values_are_rejected(sets, message):
    with pytest.raises(ConfigError) as err:
        TrainConfig.build("simcse", "local", sets)
    assert message in str(err.value)


def test_unknown_method_and_profile():
    with pytest.raises(ConfigError, match="unknown method 'nope'"):
        TrainConfig.build("nope", "local")
    with pytest.raises(ConfigError, match="unknown profile 'huge'"):
        TrainConfig.build("simcse", "huge")


def test_set_needs_key_value():
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_sets(["lr"])


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def test_ingredient_params_never_shadow_common_or_shared_keys():
    common = set(_fields(TrainConfig)) | set(_fields(SharedParams))
    for kind, choices in INGREDIENTS.items():
        for name, ingredient in choices.items():
            assert not common & set(_fields(ingredient.Params)), (kind, name)


def test_a_key_two_ingredients_declare_is_one_setting_of_one_type_and_default():
    """Such a key (spacy_model) is set on both at once; it must mean the same."""
    seen: dict[str, tuple] = {}
    for choices in INGREDIENTS.values():
        for ingredient in choices.values():
            for name, field in _fields(ingredient.Params).items():
                here = (field.type, field.default)
                assert seen.setdefault(name, here) == here, name
    cfg = TrainConfig.build("recipe", "local", {"negatives": "san", "aux": "augcse", "spacy_model": "x_model"})
    assert cfg.params["san"].spacy_model == cfg.params["augcse"].spacy_model == "x_model"


@pytest.mark.parametrize("method", sorted(NAMED))
def test_named_recipes_round_trip_and_record_their_ingredients(method):
    cfg = TrainConfig.build(method, "paper")
    flat = cfg.flat()
    assert {"positives", "negatives", "loss", "aux"} <= set(flat)
    assert TrainConfig.from_flat(flat).flat() == flat


def test_recipe_keys_and_their_errors():
    cfg = TrainConfig.build("recipe", "local", {"negatives": "una,san", "loss": "hince", "aux": "vascl"})
    assert cfg.recipe.negatives == ("una", "san") and cfg.shared.pooler == "avg"  # VaSCL's pooling
    assert cfg.flat()["negatives"] == "una,san" and cfg.params["vascl"].k == 16
    with pytest.raises(ConfigError, match="'tau2' belongs to loss=hince"):
        TrainConfig.build("una", "local", {"tau2": "0.1"})
    with pytest.raises(ConfigError, match="loss=hince needs negatives"):
        TrainConfig.build("recipe", "local", {"loss": "hince"})
    # A named recipe's loss follows fidelity where paper and authors' code differ (UNA).
    assert TrainConfig.build("una", "local", {"fidelity": "authors_code"}).recipe.loss == "ntxent"
    assert TrainConfig.build("una", "local").recipe.loss == "infonce"


def test_runtime_process_is_one_worker():
    with pytest.raises(ConfigError, match="num_workers must be 1"):
        TrainConfig.build("simcse", "local", {"runtime": "process"})
    assert TrainConfig.build("simcse", "local", {"runtime": "process", "num_workers": "1"}).runtime == "process"


def test_recipe_card_says_where_every_value_comes_from():
    """``--print-config``: the layer that set a value, else the citation at its field."""
    card = {key: (value, source) for key, value, source in TrainConfig.build("vascl", "paper").recipe_card()}
    assert card["batch_size"] == (1024, "profile 'paper' (ingredients.vascl)")
    assert card["schedule"] == ("constant", "profile 'paper' (ingredients.vascl)")
    assert card["loss"][0] == "ntxent" and "Zhang et al." in card["loss"][1]
    assert "Appendix A" in card["head_lr_scale"][1] and card["head_lr_scale"][1].startswith("default: ")
    una = {key: source for key, _, source in TrainConfig.build("una", "local", {"alpha": "3"}).recipe_card()}
    assert una["alpha"] == "--set" and "Table C5" in una["beta"]
    assert all(source != "default: no note" for source in una.values()), [k for k, s in una.items() if s.endswith("no note")]


def test_every_default_cites_its_source_as_field_metadata():
    """Each field of the configuration, the shared settings and every ingredient's parameters
    carries the source of its default as field metadata (``cited``), and the card shows it."""
    owners = [TrainConfig, SharedParams] + [ing.Params for kind in INGREDIENTS.values() for ing in kind.values()]
    containers = {"recipe", "shared", "params", "sources"}
    for owner in owners:
        for field in dataclasses.fields(owner):
            if field.name not in containers:
                assert len(field.metadata.get("source", "")) > 8, (owner.__name__, field.name)
    card = TrainConfig.build("augcse", "paper").recipe_card()
    source = {key: why for key, _, why in card}
    assert source["lambda_disc"] == "default: lambda, Tang et al. App. A.7 (BERT-base, STS); grid 1e-5 ... 1e-2"


def test_a_papers_values_follow_its_ingredient_into_combinations():
    """The paper profile's SAN dropout reaches ``recipe`` with SAN's negatives and HiNCE as it
    reaches the named ``san``; two ingredients that set one key differently: the later wins, and
    the card says over whose value."""
    named = TrainConfig.build("san", "paper")
    combined = TrainConfig.build("recipe", "paper", {"negatives": "san", "loss": "hince"})
    assert named.dropout == combined.dropout == 0.15
    card = {key: (value, source) for key, value, source in
            TrainConfig.build("recipe", "paper", {"negatives": "una", "aux": "vascl"}).recipe_card()}
    assert card["eval_steps"] == (500, "profile 'paper' (ingredients.vascl), over una's 100: the later "
                                       "ingredient of the recipe wins")
    assert card["batch_size"] == (1024, "profile 'paper' (ingredients.vascl)")


def test_max_grad_norm_is_on_every_card_with_its_source():
    """1.0 where the authors train with the HF Trainer's default (SimCSE, SAN, AugCSE); 0 (no
    clipping) where their code steps without it (UNA, VaSCL); a negative value is refused."""
    for method, want, needle in [("simcse", 1.0, "Hugging Face Trainer"), ("san", 1.0, "Hugging Face Trainer"),
                                 ("augcse", 1.0, "Hugging Face Trainer"), ("una", 0.0, "Shu et al.'s code"),
                                 ("vascl", 0.0, "Zhang et al.'s code")]:
        card = {key: (value, source) for key, value, source in TrainConfig.build(method, "paper").recipe_card()}
        assert card["max_grad_norm"][0] == want and needle in card["max_grad_norm"][1], (method, card["max_grad_norm"])
    with pytest.raises(ConfigError, match="max_grad_norm must be >= 0"):
        TrainConfig.build("simcse", "local", {"max_grad_norm": "-1"})


def test_paper_roberta_applies_each_papers_roberta_values_on_the_paper_profile():
    """SimCSE's (and SAN's) RoBERTa-base batch 512 / lr 1e-5, UNA's batch 64 at a constant 5e-6
    (Shu et al., Sec. 4), AugCSE's lambda 1e-4 (Table 10) with BERT-base's batch and lr; VaSCL,
    RoBERTa already, keeps the paper profile's; the rest is the paper profile's, each value saying
    where it comes from."""
    from platform.config import load_profile

    got = {m: TrainConfig.build(m, "paper-roberta") for m in ("simcse", "una", "san", "augcse", "vascl")}
    assert all(c.model.startswith("roberta-base@") for c in got.values())
    assert (got["simcse"].batch_size, got["simcse"].lr, got["simcse"].schedule) == (512, 1e-5, "linear")
    assert (got["san"].batch_size, got["san"].lr, got["san"].dropout) == (512, 1e-5, 0.15)
    assert (got["una"].lr, got["una"].schedule, got["una"].eval_steps) == (5e-6, "constant", 100)
    assert got["una"].batch_size == 64 and got["una"].sources["batch_size"] == "profile 'paper-roberta' (ingredients.una)"
    assert got["augcse"].params["augcse"].lambda_disc == 1e-4
    assert TrainConfig.build("augcse", "paper").params["augcse"].lambda_disc == 5e-3
    paper = {m: TrainConfig.build(m, "paper") for m in ("augcse", "vascl")}
    for m, c in paper.items():
        assert (got[m].batch_size, got[m].lr, got[m].epochs) == (c.batch_size, c.lr, c.epochs)
    assert got["una"].sources["lr"] == "profile 'paper-roberta' (ingredients.una)"
    assert load_profile("paper-roberta")["ingredients"]["san"]["mlm"] == load_profile("paper")["ingredients"]["san"]["mlm"]


def test_a_profile_that_extends_itself_is_one_error(tmp_path, monkeypatch):
    import platform.config as config

    (tmp_path / "a.yaml").write_text("extends: b\n")
    (tmp_path / "b.yaml").write_text("extends: a\n")
    monkeypatch.setattr(config, "PROFILES_DIR", tmp_path)
    with pytest.raises(ConfigError, match="extends 'a', which extends it back"):
        config.load_profile("a")


def test_train_and_tune_read_their_shared_arguments_alike():
    """One definition of what both commands take: the same command line gives both the same values."""
    from platform import train, tune

    argv = ["una", "--profile", "local", "--config", "x.yaml", "--set", "lr=1e-5", "--set", "alpha=3",
            "--experiment", "e", "--tag", "a=b", "--push-to-hub", "me/m", "--seeds", "2"]
    ran, swept = vars(train.parse_args(argv)), vars(tune.parse_args(argv))
    shared = {"method", "profile", "config", "sets", "experiment", "tags", "push_to_hub", "seeds"}
    assert shared <= set(ran) & set(swept)
    assert {k: ran[k] for k in shared} == {k: swept[k] for k in shared}
    assert ran["sets"] == ["lr=1e-5", "alpha=3"] and ran["seeds"] == 2
