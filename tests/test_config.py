"""Typed configuration: profiles, --set parsing, validation, and the paper defaults."""

from __future__ import annotations

import dataclasses

import pytest

from methods.base import REGISTRY, method_class
from platform.config import ConfigError, TrainConfig, parse_sets


def test_paper_defaults_are_simcse_bert_base():
    cfg = TrainConfig.build("simcse", "paper")
    assert (cfg.model, cfg.batch_size, cfg.lr, cfg.max_len, cfg.epochs, cfg.eval_steps) == (
        "bert-base-uncased", 64, 3e-5, 32, 1, 125)
    assert cfg.params.temperature == 0.05 and cfg.dropout == 0.1 and cfg.use_gpu


def test_local_profile_and_set_overrides():
    cfg = TrainConfig.build("simcse", "local", parse_sets(["lr=1e-4", "temperature=0.1", "use_gpu=false"]))
    assert cfg.model == "minilm" and cfg.num_workers == 2
    assert cfg.lr == 1e-4 and cfg.params.temperature == 0.1 and cfg.use_gpu is False


def test_flat_round_trip():
    cfg = TrainConfig.build("simcse", "local", {"batch_size": "16", "pooler": "avg"})
    again = TrainConfig.from_flat(cfg.flat())
    assert again.flat() == cfg.flat()


@pytest.mark.parametrize(
    "sets,message",
    [
        ({"learning_rate": "1"}, "unknown key 'learning_rate'"),
        ({"lr": "fast"}, "lr='fast' is not a valid float"),
        ({"batch_size": "3.5"}, "not a valid int"),
        ({"use_gpu": "maybe"}, "not a valid bool"),
        ({"lr": "0"}, "lr must be > 0"),
        ({"lr": "-1e-5"}, "lr must be > 0"),
        ({"temperature": "0"}, "temperature must be > 0"),
        ({"batch_size": "1"}, "batch_size must be >= 2"),
        ({"batch_size": "9", "num_workers": "2"}, "multiple of num_workers"),
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


@pytest.mark.parametrize("method", sorted(REGISTRY))
def test_method_params_never_shadow_common_keys(method):
    common = {f.name for f in dataclasses.fields(TrainConfig)}
    own = {f.name for f in dataclasses.fields(method_class(method).Params)}
    assert not common & own
