"""What every method provides, and the registry of methods by name.

A method is a small object around a typed ``Params`` dataclass (the paper's hyperparameters with
its defaults). The training loop calls, in order: ``prepare`` once per corpus (picklable
statistics), ``augment`` over column batches (a pure CPU function; Ray Data runs it in parallel),
``build`` to wrap the encoder with the method's training-only heads, and ``loss`` every step.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import torch
from torch import nn

from methods.encoder import Encoder

# name -> "module:Class", imported lazily so one method's optional dependencies stay optional.
REGISTRY = {
    "simcse": "methods.simcse:SimCSE",
    "una": "methods.una:UNA",
    "vascl": "methods.vascl:VaSCL",
    "san": "methods.san:SAN",
    "augcse": "methods.augcse:AugCSE",
}


class InvalidParams(ValueError):
    """A hyperparameter is outside its valid range."""


@dataclasses.dataclass
class MethodParams:
    """Hyperparameters shared by every contrastive method."""

    # Softmax temperature of InfoNCE; 0.05 in SimCSE (Gao et al., 2021, Sec. 3 / Appendix A).
    temperature: float = 0.05

    def validate(self) -> None:
        if not self.temperature > 0:
            raise InvalidParams(f"temperature must be > 0, got {self.temperature}")

    def validate_batch(self, batch_size: int) -> None:
        """Checks that involve the global batch size (e.g. in-batch neighbourhoods)."""


class Method:
    name: str = ""
    Params: type[MethodParams] = MethodParams
    # Text columns the loss needs tokenised; produced by ``augment`` where not in the corpus.
    text_columns: tuple[str, ...] = ("sentence",)

    def __init__(self, params: MethodParams | None = None):
        self.params = params if params is not None else self.Params()
        self.params.validate()

    def prepare(self, sentences: list[str]) -> Any:
        """Corpus-level statistics computed once; must be picklable."""
        return None

    def state_cache_spec(self) -> dict[str, Any] | None:
        """``{"kind": ..., "params": {...}}`` if ``prepare``'s result can be cached on disk: the
        parameters it depends on besides the corpus (and a code version). None: never cached."""
        return None

    def save_state(self, state: Any, directory) -> None:
        raise NotImplementedError

    def load_state(self, directory) -> Any:
        raise NotImplementedError

    def preflight(self) -> None:
        """Cheap checks of external resources (models, taggers) before any distributed work, so
        bad input fails with one clear line instead of inside a Ray actor."""

    def generated_columns(self) -> dict[str, dict[str, Any]]:
        """Columns generated once per corpus (not per epoch), e.g. paraphrases or MLM negatives:
        ``{column: {"generator": "module:Class", "kwargs": {...}}}`` where ``Class(**kwargs)`` is
        a callable over ``{"sentence": [...]}`` batches adding ``column`` (Ray Data runs it as an
        actor); or ``{column: {"file": path}}`` for a user's existing Parquet cache.

        Optional keys: ``"group": {...}`` -- the missing columns with the same generator and group
        are made in one pass by ``Class(columns=[...], **group)`` (e.g. one spaCy parse for many
        augmentations), each still cached on its own under its ``kwargs``; ``"cpu_bound": True``
        -- one actor per CPU instead of one per two CPUs (for pure-Python generators)."""
        return {}

    def check_state(self, state: Any) -> None:
        """Raise ``InvalidParams`` if these parameters cannot work with this corpus' statistics."""

    def space_limits(self, state: Any) -> dict[str, tuple[float, float]]:
        """Bounds the corpus puts on searchable parameters (a sweep clips its ranges to them)."""
        return {}

    def augment(self, batch: dict[str, Any], state: Any) -> dict[str, Any]:
        """Add the method's columns to a batch of ``{"sentence": array_of_str}``."""
        return batch

    def tensor_columns(self, batch: dict[str, Any], device) -> dict[str, torch.Tensor]:
        """Non-text columns the loss needs as tensors (e.g. AugCSE's augmentation labels)."""
        return {}

    def build(self, encoder: Encoder) -> nn.Module:
        raise NotImplementedError

    def param_groups(self, model: nn.Module, lr: float) -> list[dict]:
        """Optimizer parameter groups; one group at the base learning rate unless a paper says otherwise."""
        return [{"params": [p for p in model.parameters() if p.requires_grad], "lr": lr}]

    def loss(self, model: nn.Module, batch: dict[str, dict[str, torch.Tensor]], step: int):
        """Return ``(loss, metrics)``; ``loss`` is the global loss, identical on every worker."""
        raise NotImplementedError

    def eval_pooler(self) -> str:
        """The pooler to evaluate with (may differ from the training pooler)."""
        return "cls_before_pooler"

    def export_encoder(self, model: nn.Module) -> Encoder:
        """The encoder to save and evaluate, with any kept training head folded in."""
        return getattr(model, "module", model).encoder  # unwrap DDP


def method_class(name: str) -> type[Method]:
    if name not in REGISTRY:
        raise KeyError(f"unknown method {name!r}; choose one of {', '.join(sorted(REGISTRY))}")
    module_name, cls_name = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), cls_name)
