"""What several cases share: random BERTs of a known size, a corpus or random sentences, STS-B dev."""

from __future__ import annotations

import os
import random
from pathlib import Path

import torch


def random_bert(folder: Path, size: str, tokenizer: str | Path | None) -> str:
    """bert-base (``BertConfig()``) or the tests' tiny BERT (a CPU check of a script), random weights,
    with ``tokenizer``: a folder (``prepare`` saves one: the GPU machine lacks the MiniLM package), a
    name ``load_tokenizer`` knows, or None for the packaged MiniLM's (bert-base-uncased's vocabulary)."""
    from transformers import BertConfig, BertModel

    from methods.encoder import load_tokenizer
    from methods.errors import BackboneNotFound
    from platform.data.columns import TINY_BERT

    hint = f"{tokenizer}: no tokenizer there; the paper-precision case's prepare step saves one"
    if tokenizer is not None and Path(tokenizer).is_dir() and not (Path(tokenizer) / "tokenizer_config.json").is_file():
        raise SystemExit(hint)
    try:
        tok = load_tokenizer(str(tokenizer) if tokenizer is not None else "minilm")
    except BackboneNotFound:
        raise SystemExit(hint) from None
    torch.manual_seed(0)
    BertModel(BertConfig(**TINY_BERT) if size == "tiny" else BertConfig()).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def sentences(n: int, tokenizer, seed: int = 0) -> list[str]:
    """The corpus's first ``n`` sentences, or random words of the vocabulary (8 to 40 of them)."""
    data = os.environ.get("PLATFORM_DATA_DIR")
    if data:
        from platform.data import read_corpus, resolve_corpus

        return read_corpus(resolve_corpus("wiki1m_for_simcse.first11914.txt.gz"), limit=n)
    words = [w for w in tokenizer.get_vocab() if w.isalpha() and len(w) > 2]
    rng = random.Random(seed)
    return [" ".join(rng.choices(words, k=rng.randint(8, 40))) for _ in range(n)]


def dev_pairs(tokenizer) -> dict[str, list] | None:
    """STS-B dev when the data is here (the evaluator reads it), else 1,500 random pairs like it."""
    if os.environ.get("PLATFORM_DATA_DIR"):
        return None
    s = sentences(3000, tokenizer, seed=1)
    return {"sent1": s[:1500], "sent2": s[1500:], "scores": [random.Random(i).uniform(0, 5) for i in range(1500)]}


def model_source(name: str) -> str:
    """``tiny``: the tests' 2-layer 32-d random BERT (a check of a case in seconds); else the name."""
    if name != "tiny":
        return name
    import tempfile

    from platform.data.columns import build_tiny_bert

    return str(build_tiny_bert(Path(tempfile.mkdtemp()) / "tiny-bert"))
