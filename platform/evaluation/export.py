"""Export a checkpoint's encoder for others: Hugging Face format and sentence-transformers format."""

from __future__ import annotations

from pathlib import Path

from platform import outputs

# Our pooler -> sentence-transformers Pooling mode. 'cls' additionally needs the pooler layer as a
# Dense(d, d, tanh) module; avg_first_last has no sentence-transformers equivalent.
_ST_MODES = {"cls_before_pooler": "cls", "cls": "cls", "avg": "mean"}


class ExportUnsupported(ValueError):
    pass


def export_sentence_transformers(hf_dir: str | Path, out_dir: str | Path, pooler: str) -> Path:
    """Write a folder that ``SentenceTransformer(out_dir)`` loads and that embeds like our encoder."""
    import torch
    from sentence_transformers import SentenceTransformer, models

    if pooler not in _ST_MODES:
        raise ExportUnsupported(f"pooler {pooler!r} has no sentence-transformers equivalent")
    transformer = models.Transformer(str(hf_dir))
    dim = transformer.get_embedding_dimension()
    modules = [transformer, models.Pooling(dim, pooling_mode=_ST_MODES[pooler])]
    if pooler == "cls":
        dense = getattr(transformer.auto_model, "pooler", None)
        if dense is None:
            raise ExportUnsupported("pooler 'cls' needs the model's pooler layer, which this model lacks")
        modules.append(
            models.Dense(
                dim,
                dim,
                activation_function=torch.nn.Tanh(),
                init_weight=dense.dense.weight.detach().clone(),
                init_bias=dense.dense.bias.detach().clone(),
            )
        )
    out_dir = Path(out_dir)
    outputs.check_replaceable(out_dir, "remove it or export elsewhere")
    tmp = outputs.staging(out_dir)
    try:
        SentenceTransformer(modules=modules, device="cpu").save(str(tmp))
    except BaseException:
        outputs.discard(tmp)
        raise
    return outputs.install(tmp, out_dir, "platform export (sentence-transformers)",
                           "remove it or export elsewhere")
