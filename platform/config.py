"""The one source of truth for a run's configuration: typed, validated, papers' defaults.

Resolution order (later wins): the dataclass defaults below (the SimCSE paper's BERT-base values,
Gao et al., 2021, Sec. 3 and Appendix A) and the method's ``Params`` defaults (its paper), then the
profile file ``platform/profiles/<profile>.yaml`` (its top level, then its ``methods.<method>``
section), then ``--set key=value`` overrides. Keys are flat: common fields and the method's
parameters share one namespace (they never collide; a test checks it).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from pathlib import Path
from typing import Any

import yaml

from methods.base import REGISTRY, InvalidParams, MethodParams, method_class

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"


class ConfigError(Exception):
    """A configuration value, key, profile or method is invalid; the message says which."""


@dataclasses.dataclass
class TrainConfig:
    method: str = "simcse"
    profile: str = "paper"
    # Backbone: a Hugging Face name or local path, or the alias 'minilm' (packaged, offline).
    model: str = "bert-base-uncased"
    dropout: float = 0.1  # SimCSE: the standard BERT dropout p=0.1 gives the positive pairs
    max_len: int = 32  # SimCSE: max sequence length 32 for unsupervised training
    # Optimisation (SimCSE, BERT-base unsupervised: batch 64, lr 3e-5, 1 epoch, AdamW, linear decay).
    batch_size: int = 64  # global batch over all workers
    lr: float = 3e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0
    epochs: int = 1
    max_steps: int = 0  # 0: the full epochs
    seed: int = 42
    # Data: a corpus path, or a file name under $PLATFORM_DATA_DIR/corpus.
    corpus: str = "wiki1m_for_simcse.txt"
    max_sentences: int = 0  # 0: the whole corpus
    # Evaluation: STS-B dev every eval_steps (SimCSE: 125) and at the last step; best checkpoint kept.
    eval_steps: int = 125
    eval_batch_size: int = 128
    log_steps: int = 10
    final_eval: bool = True  # the 7 STS tasks on the best checkpoint after training
    # Resources.
    num_workers: int = 1
    use_gpu: bool = True
    cpus_per_worker: float = 1.0
    # CPUs each Ray Data augmentation task asks for. Fractional on small machines: concurrent
    # trials' Train workers can hold every whole CPU, and the stage would never be scheduled.
    augment_cpus: float = 1.0
    bf16: bool = True  # autocast on GPU only
    # Fault tolerance: a failed worker group restarts from the latest checkpoint (model, heads,
    # optimizer, scheduler, step, RNG, data position) up to this many times (Ray Train FailureConfig).
    max_failures: int = 3
    # Where Ray Train workers get batches: 'ray' streams the method's augmentation through Ray Data
    # (parallel CPUs); 'local' has every worker read the corpus and take its slice of each seeded
    # global batch, so any worker count sees exactly the same batches (reproducibility checks).
    data_pipeline: str = "ray"
    # Where runs write checkpoints (Ray's storage_path); relative paths are under the repo root.
    output_dir: str = "runs"
    params: MethodParams = dataclasses.field(default_factory=MethodParams)

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def build(cls, method: str, profile: str = "local", overrides: dict[str, Any] | None = None) -> "TrainConfig":
        if method not in REGISTRY:
            raise ConfigError(f"unknown method {method!r}; choose one of {', '.join(sorted(REGISTRY))}")
        layers = load_profile(profile)
        section = layers.pop("methods", {}) or {}
        if not isinstance(section, dict):
            raise ConfigError(f"profile {profile!r}: 'methods' must be a mapping of method -> overrides")
        cfg = cls(method=method, profile=profile, params=method_class(method).Params())
        cfg.update(layers, source=f"profile {profile!r}")
        cfg.update(section.get(method) or {}, source=f"profile {profile!r} (methods.{method})")
        cfg.update(overrides or {}, source="--set")
        cfg.validate()
        return cfg

    @classmethod
    def from_flat(cls, flat: dict[str, Any]) -> "TrainConfig":
        """Inverse of ``flat()``: rebuild a config inside a worker or trial."""
        method = flat.get("method", "simcse")
        cfg = cls(method=method, params=method_class(method).Params())
        cfg.update({k: v for k, v in flat.items() if k != "method" and not k.startswith("_")}, source="config")
        cfg.validate()
        return cfg

    def fields(self) -> dict[str, tuple[object, dataclasses.Field]]:
        """Every settable key -> (owner object, field)."""
        out = {f.name: (self, f) for f in dataclasses.fields(self) if f.name not in ("params", "method")}
        for f in dataclasses.fields(self.params):
            out[f.name] = (self.params, f)
        return out

    def update(self, values: dict[str, Any], source: str) -> None:
        known = self.fields()
        for key, raw in values.items():
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{source}: unknown key {key!r} for method {self.method!r}{hint}")
            owner, field = known[key]
            setattr(owner, key, coerce(key, raw, field_type(owner, field), source))

    def flat(self) -> dict[str, Any]:
        """Flat key -> value, for MLflow params, Ray configs and ``from_flat``."""
        out = {"method": self.method}
        out.update({k: getattr(owner, k) for k, (owner, _) in self.fields().items()})
        return out

    def validate(self) -> None:
        checks = [
            (self.lr > 0, f"lr must be > 0, got {self.lr}"),
            (self.batch_size >= 2, f"batch_size must be >= 2 (in-batch negatives), got {self.batch_size}"),
            (self.num_workers >= 1, f"num_workers must be >= 1, got {self.num_workers}"),
            (
                self.batch_size % self.num_workers == 0 and self.batch_size // self.num_workers >= 1,
                f"batch_size {self.batch_size} must be a multiple of num_workers {self.num_workers}",
            ),
            (0 <= self.dropout < 1, f"dropout must be in [0, 1), got {self.dropout}"),
            (self.max_len >= 2, f"max_len must be >= 2, got {self.max_len}"),
            (self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (self.max_steps >= 0, f"max_steps must be >= 0, got {self.max_steps}"),
            (self.eval_steps >= 1, f"eval_steps must be >= 1, got {self.eval_steps}"),
            (self.log_steps >= 1, f"log_steps must be >= 1, got {self.log_steps}"),
            (self.max_sentences >= 0, f"max_sentences must be >= 0, got {self.max_sentences}"),
            (self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}"),
            (self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}"),
            (self.cpus_per_worker > 0, f"cpus_per_worker must be > 0, got {self.cpus_per_worker}"),
            (self.augment_cpus > 0, f"augment_cpus must be > 0, got {self.augment_cpus}"),
            (self.eval_batch_size >= 1, f"eval_batch_size must be >= 1, got {self.eval_batch_size}"),
            (self.max_failures >= 0, f"max_failures must be >= 0, got {self.max_failures}"),
            (self.data_pipeline in ("ray", "local"), f"data_pipeline must be ray or local, got {self.data_pipeline!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        try:
            self.params.validate()
            self.params.validate_batch(self.batch_size)
        except InvalidParams as exc:
            raise ConfigError(str(exc)) from None


def field_type(owner: object, field: dataclasses.Field) -> type:
    hints = typing.get_type_hints(type(owner))
    return hints[field.name]


def coerce(key: str, raw: Any, typ: type, source: str) -> Any:
    """Parse ``raw`` (a YAML value or a ``--set`` string) as ``typ``; a clear error otherwise."""
    try:
        if typ is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("true", "1", "yes"):
                return True
            if text in ("false", "0", "no"):
                return False
            raise ValueError
        if typ is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            value = int(float(raw)) if isinstance(raw, str) and "e" in raw.lower() else int(raw)
            return value
        if typ is float:
            if isinstance(raw, bool):
                raise ValueError
            value = float(raw)
            if math.isnan(value):
                raise ValueError
            return value
        if typ is str:
            if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
                raise ValueError
            return str(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {key}={raw!r} is not a valid {typ.__name__}") from None
    raise ConfigError(f"{source}: {key} has unsupported type {typ}")


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name: str) -> dict[str, Any]:
    path = PROFILES_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown profile {name!r}; choose one of {', '.join(available_profiles())}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"profile {path}: invalid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"profile {path}: expected a mapping of key: value")
    return data


def parse_sets(items: list[str] | None) -> dict[str, str]:
    """``["lr=1e-5", "batch_size=32"]`` -> dict; types are checked later against the fields."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value")
        out[key.strip()] = value.strip()
    return out
