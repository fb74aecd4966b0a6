"""Positives: what each sentence is contrasted with (``positives=dropout | paraphrase``).

- ``dropout`` (SimCSE, Gao et al., 2021, Sec. 3): the sentence itself; its two views differ only by
  the dropout masks of one forward pass over both copies.
- ``paraphrase`` (UNA, Shu et al., Sec. 3.3): a seq2seq paraphrase of the sentence, generated once
  per corpus (paper: tuner007/pegasus_paraphrase, beam 10, one output; any Hugging Face seq2seq
  model by name or path), or read from a user's Parquet file with columns ``sentence`` and
  ``paraphrase``. Paraphrases also enter the corpus statistics (UNA's TF-IDF).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from methods.encoder import pretrained_source
from methods.ingredients import GeneratedColumn, Params, Positives, check, cited


class DropoutPositives(Positives):
    name = "dropout"
    cites = "Gao et al. (2021), SimCSE, Sec. 3"
    column = "sentence"


@dataclasses.dataclass
class ParaphraseParams(Params):
    paraphraser: str = cited("", (
        "A seq2seq model name or path (paper: tuner007/pegasus_paraphrase, beam 10, one output), or an existing "
        "Parquet file (columns sentence, paraphrase) in ``paraphrase_cache``."))
    paraphrase_beams: int = cited(10, "beam search width (Shu et al.: beam 10, one output)")
    paraphrase_max_length: int = cited(60, "the generation's length limit, in tokens (the paraphraser's card)")
    paraphrase_cache: str = cited("", "a Parquet file (columns sentence, paraphrase) used instead of generating; empty: generate")

    def validate(self) -> None:
        check([
            (bool(self.paraphraser or self.paraphrase_cache),
             "positives=paraphrase needs paraphraser=MODEL or paraphrase_cache=FILE.parquet"),
            (self.paraphrase_beams >= 1 and self.paraphrase_max_length >= 2,
             "paraphrase_beams must be >= 1 and paraphrase_max_length >= 2"),
        ])


class ParaphrasePositives(Positives):
    name = "paraphrase"
    Params = ParaphraseParams
    cites = "Shu et al., UNA, Sec. 3.3 (paraphrase positives)"
    column = "paraphrase"

    def generated_columns(self, seed: int = 0) -> list[GeneratedColumn]:  # beam search: no draw, no seed
        p = self.params
        if p.paraphrase_cache:
            return [GeneratedColumn("paraphrase", file=p.paraphrase_cache)]
        kwargs = {"model": p.paraphraser, "num_beams": p.paraphrase_beams, "max_length": p.paraphrase_max_length}
        return [GeneratedColumn("paraphrase", generator="methods.positives:Paraphraser", kwargs=kwargs)]

    def text_columns(self) -> tuple[str, ...]:
        return ("paraphrase",)



class Paraphraser:
    def __init__(self, model: str, num_beams: int = 10, max_length: int = 60, batch_size: int = 32, device: str | None = None):
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))

        path, pinned = pretrained_source(model)
        self.tokenizer = AutoTokenizer.from_pretrained(path, **pinned)
        self.model = AutoModelForSeq2SeqLM.from_pretrained(path, **pinned).eval().to(self.device)
        self.num_beams, self.max_length, self.batch_size = num_beams, max_length, batch_size

    @torch.inference_mode()
    def generate(self, sentences: list[str]) -> list[str]:
        out: list[str] = []
        for start in range(0, len(sentences), self.batch_size):
            enc = self.tokenizer(
                sentences[start : start + self.batch_size], padding=True, truncation=True,
                max_length=self.max_length, return_tensors="pt",
            )
            ids = self.model.generate(
                input_ids=enc["input_ids"].to(self.device),
                attention_mask=enc["attention_mask"].to(self.device),
                num_beams=self.num_beams,
                num_return_sequences=1,
                max_length=self.max_length,
            )
            out.extend(s.strip() for s in self.tokenizer.batch_decode(ids, skip_special_tokens=True))
        return out

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        sentences = [str(s) for s in batch["sentence"]]
        return {**batch, "paraphrase": np.asarray(self.generate(sentences), dtype=object)}
