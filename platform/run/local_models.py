"""Stand-ins for weights that do not exist offline.

``tiny-random-mlm``: a 2-layer BERT masked LM with random weights and the packaged MiniLM
(uncased BERT) tokenizer, saved once into the cache. The local profile's SAN uses it so that the
whole pipeline (tagging, mask-predict, guard, HiNCE) runs offline; its negatives are noise, not
real SAN negatives, and every run using it is tagged ``mlm_random_weights=true`` in MLflow.
Users running the paper profile download ``bert-base-uncased``.
"""

from __future__ import annotations

from pathlib import Path

from methods.encoder import load_tokenizer
from platform import settings
from platform.data import DATA_ENV
from platform.data.cache import cached

TINY_MLM = "tiny-random-mlm"
# The tests' and benchmarks' encoder: 2 layers, 32-d, random weights (seed 0), the MiniLM tokenizer.
TINY_BERT = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=512)


def build_tiny_bert(path: Path) -> Path:
    """A randomly initialised 2-layer 32-d BERT (seed 0) with the packaged MiniLM (uncased)
    tokenizer, saved at ``path``: the encoder of the tests and the benchmarks."""
    import torch
    from transformers import BertConfig, BertModel


    with torch.random.fork_rng(devices=[]):  # the caller's random state stays as it was
        torch.manual_seed(0)
        BertModel(BertConfig(**TINY_BERT)).save_pretrained(path)
    load_tokenizer("minilm").save_pretrained(path)
    return path


def ensure_tiny_mlm() -> Path:
    def build(tmp: Path) -> None:
        import torch
        from transformers import BertConfig, BertForMaskedLM
        from transformers.utils import logging as hf_logging


        tok = load_tokenizer("minilm")
        config = BertConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=128, max_position_embeddings=512)
        hf_logging.disable_progress_bar()
        # Built once and cached: the run that builds it draws the rest of its numbers as one that finds it.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            BertForMaskedLM(config).save_pretrained(tmp)
        tok.save_pretrained(tmp)

    return cached(TINY_MLM, "v1", {"hidden": 64, "layers": 2, "seed": 0}, build)


def resolve_local_models(ingredient_params) -> None:
    """Replace the ``tiny-random-mlm`` name in the ingredients' params by its saved folder; point
    an empty ``nltk_data`` at ``$PLATFORM_DATA_DIR/nltk_data`` when that exists and ``$NLTK_DATA``
    is not set (the data directory is the one variable tests and CI set)."""
    for params in ingredient_params:
        if getattr(params, "mlm", None) == TINY_MLM:
            params.mlm = str(ensure_tiny_mlm())
        if getattr(params, "nltk_data", None) == "" and not settings.get(settings.NLTK_DATA):
            folder = Path(settings.get(DATA_ENV) or "nonexistent") / "nltk_data"
            if folder.is_dir():
                params.nltk_data = str(folder.resolve())


def uses_random_mlm(ingredient_params) -> bool:
    return any(Path(getattr(p, "mlm", "") or "x").name.startswith(TINY_MLM) for p in ingredient_params)
