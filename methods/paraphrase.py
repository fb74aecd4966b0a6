"""Seq2seq paraphrases as positives (UNA, Shu et al.: tuner007/pegasus_paraphrase, beam 10, one
output). Any Hugging Face seq2seq model by name or path. The class is a callable over column
batches so that Ray Data can run it as an actor (one model load per actor, a GPU each if any)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class Paraphraser:
    def __init__(self, model: str, num_beams: int = 10, max_length: int = 60, batch_size: int = 32, device: str | None = None):
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model = AutoModelForSeq2SeqLM.from_pretrained(model).eval().to(self.device)
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
