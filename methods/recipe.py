"""A recipe: one choice of positives, negatives, loss and auxiliary terms, and its training step.

Each paper is a named recipe (``NAMED``, the one list of them: the commands' help and the README's
methods table are made from it); any valid combination of ingredients is a recipe too (``python -m platform.train recipe --set negatives=una,san --set loss=hince --set
aux=vascl``). One training step, for every recipe:

1. one forward pass over [anchors; positives; negatives that share the anchors' dropout; rows an
   aux term adds], padded to a common length, every row with its own dropout mask (SimCSE);
   negatives with a dropout of their own (SAN's p2) get a pass each, after it;
2. pooling (``pooler``) then the projection: SimCSE's MLP on [CLS] when ``pooler=cls`` (training
   only unless ``mlp_only_train=false``), or the head an aux term brings (VaSCL's h, AugCSE's g);
3. all-gather over DDP workers, the contrastive loss over the views (with ``replicas`` R, the mean of
   R losses over consecutive groups of the global batch, as R GPUs under ``nn.DataParallel``),
   plus each aux term.

Ingredients (``methods.positives``, ``methods.una``, ``methods.san``, ``methods.losses``,
``methods.vascl``, ``methods.augcse``) keep their paper's equations; this module only composes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterator

import torch
from torch import nn

from methods.encoder import POOLERS, Encoder, dropout_override, pad_cat
from methods.ingredients import (KINDS, Draws, EncoderIngredient, Ingredient, InvalidParams, Params, StepOutputs, check,
                                 cited)
from methods.losses import Negative, Views, gather_with_grad, rank, world_size
from methods.matryoshka import Matryoshka
from methods.matryoshka import refusal as matryoshka_refusal
from methods.prompt import (COTBERT_ANCHOR, COTBERT_NEGATIVE, COTBERT_POSITIVE, SNCSE_ANCHOR, SNCSE_POSITIVE,
                            PromptEncoder, PromptPooling, PromptState)
from methods.registry import INGREDIENTS

MULTIPLE = ("negatives", "aux")  # kinds that take a comma-separated list (possibly empty)


@dataclasses.dataclass
class SharedParams(Params):
    """Settings every ingredient of a recipe reads."""

    temperature: float = cited(0.05, (
        "Softmax temperature of the contrastive loss (tau1 of HiNCE); 0.05 in SimCSE (Gao et al., 2021, Sec. 3 / "
        "Appendix A), UNA, SAN (tau1), AugCSE and VaSCL."))
    pooler: str = cited("cls", (
        "Training pooler; 'cls' is [CLS] followed by SimCSE's MLP. Default: the aux term's choice (VaSCL avg, AugCSE "
        "cls_before_pooler), else SimCSE's 'cls'."))
    mlp_only_train: bool = cited(True, (
        "Use the MLP in training only and evaluate [CLS] before it (SimCSE, Sec. 6.3, Table 6)."))
    fidelity: str = cited("paper", (
        "'paper' follows the paper; 'authors_code' the authors' released code where the two differ."))
    replicas: int = cited(1, (
        "Replica losses per step: the global batch cut into this many consecutive groups of rows, each its own "
        "contrastive loss with no gather between them (and its own template bias), the step's loss their mean: the "
        "authors' nn.DataParallel on that many GPUs, whatever devices the run has (CoT-BERT's code-for-BERT/train.py: "
        "2 GPUs x 128). 1: one loss over the whole global batch (DDP's all-gather)."))
    matryoshka_dims: str = cited("", (
        "Matryoshka prefixes (Kusupati et al., 2022, Sec. 3): the contrastive loss summed over the first m "
        "coordinates of each vector for every m listed (e.g. 768,512,256,128,64); empty: the whole vector alone."))
    matryoshka_weights: str = cited("", (
        "One weight c_m per matryoshka_dims entry; empty: all 1, the paper's (Kusupati et al., 2022, Sec. 3) and "
        "sentence-transformers' MatryoshkaLoss default."))

    def validate(self) -> None:
        check([
            (self.temperature > 0, f"temperature must be > 0, got {self.temperature}"),
            (self.replicas >= 1, f"replicas must be >= 1, got {self.replicas}"),
            (self.pooler in POOLERS, f"unknown pooler {self.pooler!r}; choose one of {', '.join(POOLERS)}"),
            (self.fidelity in ("paper", "authors_code"), f"fidelity must be 'paper' or 'authors_code', got {self.fidelity!r}"),
        ])
        self.matryoshka()

    def matryoshka(self) -> Matryoshka | None:
        """The Matryoshka prefixes and weights these keys name (None: the whole vector alone)."""
        return Matryoshka.parse(self.matryoshka_dims, self.matryoshka_weights)


def check_replicas(spec: "RecipeSpec", shared: SharedParams) -> None:
    """Replica losses split the contrastive loss only: an aux term, or a queue of embeddings, sees
    the whole batch."""
    embedded = [n for n in spec.negatives if INGREDIENTS["negatives"][n].embedded]
    check([(shared.replicas == 1 or not spec.aux,
            f"replicas={shared.replicas} splits the contrastive loss into replica losses; aux={','.join(spec.aux)} "
            "sees the whole batch, so the two do not combine: use replicas=1"),
           (shared.replicas == 1 or not embedded,
            f"replicas={shared.replicas} splits the contrastive loss into replica losses; negatives={','.join(embedded)} "
            "queues the whole batch, so the two do not combine: use replicas=1")])


@dataclasses.dataclass(frozen=True)
class RecipeSpec:
    """The ingredient names of a recipe, one per kind (negatives and aux: zero or more)."""

    encoder: str = "plain"
    positives: str = "dropout"
    negatives: tuple[str, ...] = ()
    loss: str = "infonce"
    aux: tuple[str, ...] = ()

    @classmethod
    def parse(cls, values: dict[str, Any]) -> "RecipeSpec":
        """From ``{"negatives": "una,san", ...}`` (``--set`` strings, YAML lists or tuples)."""
        fields: dict[str, Any] = {}
        for kind, raw in values.items():
            items = [x.strip() for x in (raw.split(",") if isinstance(raw, str) else raw or []) if x.strip()]
            choices = INGREDIENTS[kind]
            for item in items:
                if item not in choices:
                    raise InvalidParams(f"unknown {kind} {item!r}; choose from {', '.join(choices)}")
            if kind in MULTIPLE:
                if len(set(items)) != len(items):
                    raise InvalidParams(f"{kind}={','.join(items)} names an ingredient twice")
                fields[kind] = tuple(items)
            elif len(items) != 1:
                raise InvalidParams(f"invalid recipe: {kind} takes exactly one of {', '.join(choices)}, got {raw!r}")
            else:
                fields[kind] = items[0]
        return cls(**fields)

    def validate(self) -> None:
        projections = [a for a in self.aux if INGREDIENTS["aux"][a].brings_projection]
        check([
            (not INGREDIENTS["loss"][self.loss].needs_negatives or bool(self.negatives),
             f"invalid recipe: loss={self.loss} needs negatives (negatives={' or '.join(INGREDIENTS['negatives'])} "
             "or both); use loss=infonce or ntxent without them"),
            (INGREDIENTS["loss"][self.loss].takes_negatives or not self.negatives,
             f"invalid recipe: loss={self.loss} has no place for negatives (negatives={','.join(self.negatives)}); "
             "use loss=infonce, hince or ntxent with them"),
            (len(projections) <= 1,
             f"invalid recipe: aux={','.join(projections)} each bring their own projection head; choose one of them"),
        ] + [(issubclass(INGREDIENTS["encoder"][self.encoder], PromptEncoder),
              f"invalid recipe: negatives={n} is the sentence in a prompt's negative template; it needs encoder=prompt")
             for n in self.negatives if INGREDIENTS["negatives"][n].view == "negative"]
          + [(refusal is None, refusal or "") for refusal in (c.refusal(self) for c in self.classes())])

    def describe(self) -> str:
        encoder = f"encoder={self.encoder} " if self.encoder != "plain" else ""  # plain: the names runs had before
        return (f"{encoder}positives={self.positives} negatives={','.join(self.negatives) or 'none'} loss={self.loss} "
                f"aux={','.join(self.aux) or 'none'}")

    def default_pooler(self) -> str:
        """The encoder's pooling (a prompt's [MASK]), else that of the aux term that brings the
        projection, else SimCSE's [CLS] + MLP."""
        if INGREDIENTS["encoder"][self.encoder].pooler:
            return INGREDIENTS["encoder"][self.encoder].pooler
        return next((INGREDIENTS["aux"][a].default_pooler for a in self.aux if INGREDIENTS["aux"][a].default_pooler), "cls")

    def classes(self) -> Iterator[type[Ingredient]]:
        yield INGREDIENTS["encoder"][self.encoder]
        yield INGREDIENTS["positives"][self.positives]
        yield from (INGREDIENTS["negatives"][n] for n in self.negatives)
        yield INGREDIENTS["loss"][self.loss]
        yield from (INGREDIENTS["aux"][a] for a in self.aux)


@dataclasses.dataclass(frozen=True)
class NamedRecipe:
    """A paper's recipe: its ingredients, and parameter values that differ from the ingredients'
    defaults. ``loss_by_fidelity`` names the loss where paper and authors' code differ."""

    spec: RecipeSpec
    paper: str
    params: dict = dataclasses.field(default_factory=dict)
    loss_by_fidelity: dict = dataclasses.field(default_factory=dict)
    source: str = ""  # where ``params`` come from (the authors' script), shown by --print-config
    adds: str = ""  # what it adds to SimCSE, in a line (the README's methods table)
    keys: tuple[str, ...] = ()  # the parameters that matter most (the same table)

    @property
    def authors(self) -> str:
        """``Gao et al. (2021)``: the paper's first part."""
        return self.paper.split(", ")[0]

    def resolve(self, fidelity: str, kinds: dict[str, Any] | None = None) -> RecipeSpec:
        """The spec for this fidelity, with ``kinds`` (``{"loss": "hince", ...}``) replacing its choices."""
        loss = self.loss_by_fidelity.get(fidelity)
        spec = dataclasses.replace(self.spec, loss=loss) if loss else self.spec
        if kinds:
            parsed = RecipeSpec.parse(kinds)
            spec = dataclasses.replace(spec, **{k: getattr(parsed, k) for k in kinds})
        return spec


NAMED: dict[str, NamedRecipe] = {
    "simcse": NamedRecipe(RecipeSpec(), "Gao et al. (2021), SimCSE, unsupervised",
                          adds="the baseline: two dropout views, InfoNCE",
                          keys=("temperature", "dropout", "lr", "batch_size")),
    "una": NamedRecipe(RecipeSpec(negatives=("una",)), "Shu et al., UNA",
                       loss_by_fidelity={"authors_code": "ntxent"},  # the authors' 4N x 4N loss
                       adds="TF-IDF-driven hard negatives every alpha-th batch; optional paraphrase positives",
                       keys=("alpha", "beta", "r", "positives=paraphrase")),
    "san": NamedRecipe(RecipeSpec(negatives=("san",), loss="hince"), "Cai et al., SAN + HiNCE",
                       adds="POS-importance MLM negatives with their own dropout; HiNCE's tau1/tau2 loss",
                       keys=("tau2", "p2", "scale")),
    # App. A.14: the contrastive term is symmetric, "similar to CLIP" (the authors' code too).
    "augcse": NamedRecipe(RecipeSpec(loss="symmetric", aux=("augcse",)), "Tang et al. (2022), AugCSE",
                          adds="diverse augmentations and an antagonistic discriminator behind gradient reversal; "
                               "symmetric loss", keys=("lambda_disc", "augmentations", "grl_multiplier")),
    # Eq. 1: each of the 2M views classified among the 2M-1 others, i.e. NT-Xent.
    "vascl": NamedRecipe(RecipeSpec(loss="ntxent", aux=("vascl",)), "Zhang et al. (2021), VaSCL",
                         adds="virtual adversarial augmentation within each instance's K nearest in-batch neighbours",
                         keys=("delta", "k")),
    # ESimCSE's run.sh (BERT-base): SimCSE's batch 64 and lr 3e-5, dropout 0.1, the [CLS] + MLP pooler.
    "esimcse": NamedRecipe(RecipeSpec(positives="repetition", negatives=("momentum_queue",)),
                           "Wu et al. (2022), ESimCSE",
                           adds="positives with repeated sub-words (a pair no longer shares its length) and a momentum "
                                "encoder's queue of earlier sentences as extra negatives",
                           keys=("dup_rate", "queue_size", "momentum")),
    # The prompt encoder's defaults are PromptBERT's BERT templates and denoising (run.sh, unsup-bert).
    "promptbert": NamedRecipe(RecipeSpec(encoder="prompt"), "Jiang et al. (2022), PromptBERT, unsupervised",
                              adds="the sentence in a template, embedded at its [MASK]; positives in another template; "
                                   "the template's bias subtracted", keys=("template", "positive_template", "denoise")),
    # train_SNCSE.py (Different_Prompt_Negation): BERT's templates; the RoBERTa profile's are the same text.
    "sncse": NamedRecipe(RecipeSpec(encoder="prompt", aux=("bml",)), "Wang et al. (2022), SNCSE", params={
        "template": SNCSE_ANCHOR, "positive_template": SNCSE_POSITIVE, "denoise": "none",
        "truncation": "with_template", "end_punctuation": True, "test_period": False, "dev_tokens": "joined"},
        source=("Sense-GVT/SNCSE: train_SNCSE.py's prepare_features (Different_Prompt_Negation); its dev selection "
                "(bert_evaluation.py, roberta_evaluation.py) and test (*_prediction.py) fill the template as one string"),
        adds="PromptBERT's representation, each sentence's negation as a soft negative and a bidirectional margin "
             "loss on it", keys=("lambda_bml", "bml_alpha", "bml_beta")),
    # code-for-BERT/train.py: the two-stage templates, the negative template, denoising with [PAD]s.
    "cotbert": NamedRecipe(RecipeSpec(encoder="prompt", negatives=("template_negative",), loss="cot"),
                           "Zhang et al. (2023), CoT-BERT", params={
        "template": COTBERT_ANCHOR, "positive_template": COTBERT_POSITIVE, "negative_template": COTBERT_NEGATIVE,
        "denoise": "pad", "dev_denoise": False}, source=(
            "ZBWpro/CoT-BERT: code-for-BERT/train.py's args_list (--mask_embedding_sentence_delta_no_delta_eval: "
            "dev not denoised), models.py's denoising, code-for-BERT/evaluation.py's test text"),
        adds="a two-stage template, the sentence in a negating template as a negative, and a denominator extended "
             "over it", keys=("positive_negatives", "denoise", "negative_template")),
}
CUSTOM = "recipe"  # the method name of a recipe put together with --set


# ------------------------------------------------------------------------------------------------
# The model


class ProjectionMLP(nn.Module):
    """SimCSE's ``MLPLayer``: Linear(d, d) + Tanh on the [CLS] vector, BERT-style init."""

    def __init__(self, hidden: int, init_std: float = 0.02):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.activation = nn.Tanh()
        nn.init.normal_(self.dense.weight, std=init_std)
        nn.init.zeros_(self.dense.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(x))


class RecipeModel(nn.Module):
    """The encoder, the projection the loss sees, the aux terms' own heads and the ingredients'
    state across steps (``states``). ``forward`` returns
    the pooled embeddings ``e`` of a tokenised batch; ``project`` gives their projections ``z``."""

    def __init__(self, encoder: Encoder, pooler: str, projection: nn.Module | None, heads: dict[str, nn.Module],
                 prompt: PromptState | None = None, states: dict[str, nn.Module] | None = None):
        super().__init__()
        self.encoder = encoder
        self.projection = projection
        self.heads = nn.ModuleDict(heads)
        self.prompt = prompt
        # Ingredients' state across steps (a momentum encoder and its queue): checkpointed, not trained.
        self.states = nn.ModuleDict(states or {})
        # SimCSE's MLP replaces BERT's pooler layer on [CLS] (and is folded into it on export).
        self.pool_with = "cls_before_pooler" if isinstance(projection, ProjectionMLP) and pooler == "cls" else pooler
        backbone_pooler = getattr(encoder.backbone, "pooler", None)
        if backbone_pooler is not None and self.pool_with != "cls":
            # Unused in training; frozen so DDP sees no trainable parameter without a gradient.
            backbone_pooler.requires_grad_(False)

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        e = self.encoder(inputs, pooler=self.pool_with)
        if self.prompt is not None:
            e = self.prompt.denoised(self.encoder.backbone, e, inputs)
        return e

    def project(self, e: dict[str, torch.Tensor], reference: list[str]) -> dict[str, torch.Tensor]:
        """``z`` of every role's embeddings. A projection with batch statistics (AugCSE's g) takes
        them from the ``reference`` roles' rows (the step's own batch) and applies them to every
        row: negatives encoded apart, or beside the batch, do not move them."""
        if self.projection is None:
            return dict(e)
        roles = list(e)
        x = torch.cat([e[r] for r in roles])
        if getattr(self.projection, "uses_batch_statistics", False) and set(reference) != set(roles):
            mask = torch.cat([torch.full((len(e[r]),), r in reference, device=x.device) for r in roles])
            z = self.projection(x, mask)
        else:
            z = self.projection(x)
        return dict(zip(roles, torch.split(z, [len(e[r]) for r in roles])))


def unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)  # DDP keeps the model in .module


# ------------------------------------------------------------------------------------------------
# The recipe


class Recipe:
    """The ingredients of a run, built from a spec and their typed parameters."""

    def __init__(self, spec: RecipeSpec, params: dict[str, Params], shared: SharedParams | None = None,
                 seed: int = 0):
        spec.validate()
        self.spec, self.seed = spec, seed  # every random draw of the run's ingredients derives from seed
        self.shared = shared or SharedParams(pooler=spec.default_pooler())
        self.shared.validate()

        def make(cls):
            return cls(params.get(cls.name), self.shared)

        self.encoder: EncoderIngredient = make(INGREDIENTS["encoder"][spec.encoder])
        self.positives = make(INGREDIENTS["positives"][spec.positives])
        self.negatives = [make(INGREDIENTS["negatives"][n]) for n in spec.negatives]
        self.text_negatives = [n for n in self.negatives if not n.embedded]  # encoded in the step's passes
        self.embedded_negatives = [n for n in self.negatives if n.embedded]  # kept across steps
        self.loss_fn = make(INGREDIENTS["loss"][spec.loss])
        self.aux = [make(INGREDIENTS["aux"][a]) for a in spec.aux]
        prompt = isinstance(self.encoder, PromptEncoder)
        check([
            ((self.shared.pooler == "mask") == prompt,
             f"pooler=mask is the prompt's [MASK] state: it goes with encoder=prompt and only with it (encoder="
             f"{spec.encoder}, pooler={self.shared.pooler})"),
            (not prompt or self.shared.mlp_only_train,
             "encoder=prompt evaluates the [MASK] state before the MLP (the authors' --mlp_only_train): "
             "mlp_only_train must be true"),
        ])
        check_replicas(spec, self.shared)
        self.matryoshka = self.shared.matryoshka()
        projector = self._projector()
        if self.matryoshka is not None and (refused := matryoshka_refusal(self.shared.pooler, self.shared.mlp_only_train,
                                                                          projector and projector.name)):
            raise InvalidParams(refused)

    @classmethod
    def named(cls, name: str, **values: Any) -> "Recipe":
        """A paper's recipe, with ``values`` overriding any ingredient's or shared parameter."""
        named = NAMED[name]
        spec = named.resolve(values.get("fidelity", "paper"), {k: values.pop(k) for k in KINDS if k in values})
        shared = SharedParams(pooler=spec.default_pooler())
        params = {c.name: c.Params() for c in spec.classes()}
        for key, value in {**named.params, **values}.items():
            owners = [p for p in (shared, *params.values()) if key in {f.name for f in dataclasses.fields(p)}]
            if not owners:
                raise InvalidParams(f"unknown parameter {key!r} for recipe {name!r}")
            for owner in owners:
                setattr(owner, key, value)
        return cls(spec, params, shared)

    @property
    def ingredients(self) -> list[Ingredient]:
        return [self.encoder, self.positives, *self.negatives, self.loss_fn, *self.aux]

    @property
    def supervision(self) -> str:
        """``unsupervised``, or ``teacher-assisted (MODEL)`` when an ingredient learns from a model
        (mined negatives' teacher): the label every table of results carries beside the recipe."""
        teachers = list(dict.fromkeys(t for i in self.ingredients if (t := i.teacher())))
        return f"teacher-assisted ({', '.join(teachers)})" if teachers else "unsupervised"

    # -- data pipeline --------------------------------------------------------------------------

    def preflight(self) -> None:
        for ingredient in self.ingredients:
            ingredient.preflight()

    def generated_columns(self):
        return [c for ingredient in self.ingredients for c in ingredient.generated_columns(self.seed)]

    def with_statistics(self) -> list[Ingredient]:
        """The ingredients that fit corpus statistics (their state is keyed by ingredient name)."""
        return [i for i in self.ingredients if i.statistics() is not None]

    def check_corpus(self, sentences: list[str]) -> None:
        for ingredient in self.ingredients:
            ingredient.check_corpus(sentences)

    def check_statistics(self, statistics: dict[str, Any]) -> None:
        for ingredient in self.with_statistics():
            ingredient.check_statistics(statistics[ingredient.name])

    def space_limits(self, statistics: dict[str, Any]) -> dict[str, tuple[float, float]]:
        limits: dict[str, tuple[float, float]] = {}
        for ingredient in self.with_statistics():
            limits.update(ingredient.space_limits(statistics[ingredient.name]))
        return limits

    @property
    def augments_per_epoch(self) -> bool:
        return any(i.augments_per_epoch for i in self.ingredients)

    def augment(self, batch: dict[str, Any], statistics: dict[str, Any], epoch: int) -> dict[str, Any]:
        """Every epoch's columns (UNA's negatives, AugCSE's drawn augmentation) for a batch whose
        ``row`` column holds its corpus rows: the draws are a function of the seed, epoch and rows."""
        draws = Draws(self.seed, epoch)
        for ingredient in self.ingredients:
            if ingredient.augments_per_epoch:
                batch = ingredient.augment(batch, statistics.get(ingredient.name), draws)
        return batch

    @property
    def text_columns(self) -> tuple[str, ...]:
        columns = ["sentence"]
        for ingredient in self.ingredients:
            columns += [c for c in ingredient.text_columns() if c not in columns]
        return tuple(columns)

    def tensor_columns(self, batch: dict[str, Any], device) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for ingredient in self.ingredients:
            out.update(ingredient.tensor_columns(batch, device))
        return out

    # -- model ----------------------------------------------------------------------------------

    def build(self, encoder: Encoder, max_len: int = 32, batch_size: int = 0) -> RecipeModel:
        """The model a step trains; ``max_len`` is the run's (a prompt's truncation counts by it),
        ``batch_size`` its global batch (with ``replicas``: which replicas this worker's rows are in)."""
        hidden = encoder.hidden_size
        projector = self._projector()
        projection = projector.projection(hidden) if projector else None
        if projection is None and self.shared.pooler in ("cls", "mask"):
            projection = ProjectionMLP(hidden, getattr(encoder.backbone.config, "initializer_range", 0.02))
        heads = {a.name: head for a in self.aux if (head := a.heads(hidden)) is not None}
        width = _width(projection, hidden)
        if self.matryoshka is not None:
            self.matryoshka.check_width(width)
        states = {n.name: n.state(encoder, width) for n in self.embedded_negatives}
        prompt = None
        if isinstance(self.encoder, PromptEncoder):
            encoder.prompt = self.encoder.pooling()
            negatives = any(n.view == "negative" for n in self.negatives)
            groups = tuple(range(self.shared.replicas))  # the global batch unknown: a bias for each replica
            if batch_size:
                groups = tuple(sorted(set(self._replica_rows(batch_size).tolist())))
            prompt = PromptState.build(self.encoder, encoder.tokenizer, max_len, negatives, groups)
        return RecipeModel(encoder, self.shared.pooler, projection, heads, prompt, states)

    def _replica_rows(self, batch_size: int) -> torch.Tensor:
        """The replica of each of this worker's rows of a global batch: rank r holds the global rows
        ``[r * n, (r + 1) * n)`` (``gather_with_grad``'s order), replica k the rows ``[k * B / R, (k + 1) * B / R)``."""
        local = batch_size // world_size()
        return (rank() * local + torch.arange(local)) * self.shared.replicas // batch_size

    def param_groups(self, model: nn.Module, lr: float) -> list[dict]:
        """One group at the base learning rate, and the projection's at its aux term's scale
        (VaSCL: the head at 100x, Appendix A)."""
        model = unwrap(model)
        projector = self._projector()
        scale = projector.projection_lr_scale if projector else 1.0
        if scale == 1.0 or model.projection is None:
            return [{"params": [p for p in model.parameters() if p.requires_grad], "lr": lr}]
        head = [p for p in model.projection.parameters() if p.requires_grad]
        ids = {id(p) for p in head}
        rest = [p for p in model.parameters() if p.requires_grad and id(p) not in ids]
        return [{"params": rest, "lr": lr}, {"params": head, "lr": lr * scale}]

    def eval_pooler(self) -> str:
        """The pooler to evaluate with: [CLS] before the MLP when the MLP is training-only; a
        prompt's [MASK] state (``mask``) is always evaluated before the MLP and without denoising,
        as the authors evaluate."""
        if self.shared.pooler == "cls" and self.shared.mlp_only_train and self._projector() is None:
            return "cls_before_pooler"
        return self.shared.pooler

    def eval_prompt(self) -> dict | None:
        """The template and rules the final test embeds with (``PromptPooling``'s fields), None without a prompt."""
        pooling = self.encoder.pooling()
        return dataclasses.asdict(pooling) if pooling is not None else None

    def dev_prompt(self) -> "PromptPooling | None":
        """The rules STS-B dev is scored with in training (PromptBERT's: denoised), None without a prompt."""
        return self.encoder.pooling("dev")

    def _projector(self) -> Ingredient | None:
        """The aux term that brings the projection head (at most one: ``RecipeSpec.validate``)."""
        return next((a for a in self.aux if a.brings_projection), None)

    def export_encoder(self, model: nn.Module) -> Encoder:
        """The encoder to save and evaluate. SimCSE's trained MLP is folded into the backbone's
        pooler layer (SimCSE's simcse_to_huggingface), so pooler 'cls' of the export is [CLS] + MLP."""
        model = unwrap(model)
        encoder = model.encoder
        pooler = getattr(encoder.backbone, "pooler", None)
        if (isinstance(model.projection, ProjectionMLP) and self.shared.pooler == "cls" and pooler is not None
                and hasattr(pooler, "dense")):
            with torch.no_grad():
                pooler.dense.weight.copy_(model.projection.dense.weight)
                pooler.dense.bias.copy_(model.projection.dense.bias)
        return encoder

    # -- the training step ----------------------------------------------------------------------

    def loss(self, model: nn.Module, batch: dict[str, Any], step: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """``(loss, metrics)`` of one step; ``loss`` is the global loss, identical on every worker.
        ``batch``: the tokenised text columns and the tensor columns of this worker's rows.
        ``metrics`` are numbers or detached 0-d tensors: the loop reads them back to the host
        only when it logs, so a step never waits for the device to report them."""
        passes = self._passes(model, batch, step)
        e: dict[str, torch.Tensor] = {}
        for p in passes:
            with _dropout(model, p.dropout):
                e.update(_split(model(p.inputs), p.roles, p.size))
        return self._objective(model, batch, step, passes, e)

    def after_step(self, model: nn.Module) -> None:
        """After the optimiser's step: each ingredient's state across steps brought up to date."""
        inner = unwrap(model)
        for n in self.embedded_negatives:
            n.after_step(inner.states[n.name], inner)

    def cached_step(self, model: nn.Module, batch: dict[str, Any], step: int, mini_batch_size: int,
                    backward: Callable[[torch.Tensor], None],
                    autocast: Any = None) -> tuple[torch.Tensor, dict[str, Any]]:
        """``loss``'s step and its gradients, the encoder run on at most ``mini_batch_size`` rows at
        a time: the cached contrastive step of Gao, Zhang, Han and Callan (2021), "Scaling Deep
        Contrastive Learning Batch Size under Memory Limited Setup" (GradCache), Sec. 3.2-3.3:

        1. each chunk of rows is encoded without a graph, its RNG state recorded first;
        2. the objective runs on the whole batch's embeddings, made leaves, and ``backward(loss)``
           gives their gradients (the representation gradient cache, Eq. 5-6) and the heads' own;
        3. each chunk is encoded again from its recorded RNG state (the same dropout masks) and
           backpropagated from its rows' cached gradients (Eq. 7); the encoder's gradients sum
           over the chunks to the whole batch's.

        Every recipe's objective is a function of the pooled embeddings, the projection and the
        heads, so every recipe admits it. ``autocast`` (a context manager, entered for each
        forward) is the step's mixed precision; ``backward`` runs outside it. Under DDP the
        caller runs this in ``no_sync`` and averages the gradients after it: the objective's
        backward, which gives the heads' gradients, follows no graph-building DDP forward.
        Returns ``loss``'s pair, the loss detached."""
        autocast = autocast if autocast is not None else contextlib.nullcontext()
        passes = self._passes(model, batch, step)
        device = passes[0].inputs["input_ids"].device
        cached: list[list[tuple[dict[str, torch.Tensor], Any]]] = []
        leaves: list[torch.Tensor] = []
        e: dict[str, torch.Tensor] = {}
        for p in passes:
            chunks, outs = _chunks(p.inputs, mini_batch_size), []
            cached.append([])
            for chunk in chunks:
                cached[-1].append((chunk, _rng_state(device)))
                with torch.no_grad(), autocast, _dropout(model, p.dropout):
                    outs.append(model(chunk))
            leaves.append(torch.cat(outs).requires_grad_(True))
            e.update(_split(leaves[-1], p.roles, p.size))
        with autocast:
            loss, metrics = self._objective(model, batch, step, passes, e)
        backward(loss)
        after = _rng_state(device)
        for p, leaf, chunks in zip(passes, leaves, cached):
            start = 0
            for chunk, state in chunks:
                n = chunk["input_ids"].shape[0]
                if leaf.grad is not None:  # a pass the objective did not use (none today) has none
                    _set_rng_state(state)
                    with autocast, _dropout(model, p.dropout):
                        out = model(chunk)
                    out.backward(leaf.grad[start : start + n])
                start += n
        _set_rng_state(after)  # the stream goes on from where the first encoding left it
        return loss.detach(), metrics

    def _passes(self, model: nn.Module, batch: dict[str, Any], step: int) -> list["EncoderPass"]:
        """The step's encoder passes: [anchors; positives; negatives that share the anchors'
        dropout; the aux terms' rows], then one pass per negative with a dropout of its own. With a
        prompt, each block of rows is first put in its view's template."""
        twice = 2 if self.loss_fn.pairs_negatives else 1
        active = [n for n in self.text_negatives if n.active(step)]
        prompt = unwrap(model).prompt

        groups = None
        if prompt is not None and len(prompt.groups) > 1:  # each row's replica, for its template bias
            size = batch["sentence"]["input_ids"].shape[0]
            groups = self._replica_rows(size * world_size()).to(batch["sentence"]["input_ids"].device)

        def view(rows: dict[str, torch.Tensor], role: str) -> dict[str, torch.Tensor]:
            return prompt.wrap(rows, self.encoder.template_of(role), groups) if prompt is not None else rows

        roles = ["anchor", "positive"]
        rows = [view(batch["sentence"], "anchor"), view(self.positives.rows(batch, step, self.seed), "positive")]
        for n in active:
            if n.dropout is None:
                roles += [f"{n.name}:{i}" for i in range(twice)]
                rows += [view(batch[n.column], n.view)] * twice
        for a in self.aux:
            extra = a.extra_rows(batch)
            roles += [a.name] * len(extra)
            rows += [view(x, "positive") for x in extra]
        size = batch["sentence"]["input_ids"].shape[0]
        passes = [EncoderPass(pad_cat(rows), roles, size, None)]
        for n in active:
            if n.dropout is not None:
                passes.append(EncoderPass(pad_cat([view(batch[n.column], n.view)] * twice),
                                          [f"{n.name}:{i}" for i in range(twice)], size, n.dropout))
        return passes

    def _objective(self, model: nn.Module, batch: dict[str, Any], step: int, passes: list["EncoderPass"],
                   e: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        """The contrastive loss and the aux terms over the step's pooled embeddings ``e``."""
        twice = 2 if self.loss_fn.pairs_negatives else 1
        active = [n for n in self.text_negatives if n.active(step)]
        roles = [r for p in passes for r in p.roles]
        negative_roles = {f"{n.name}:{i}" for n in active for i in range(twice)}
        z = unwrap(model).project(e, reference=[r for r in dict.fromkeys(roles) if r not in negative_roles])

        negatives = []
        for n in active:
            # An empty negative tokenises to [CLS] [SEP]: it exists for no anchor.
            valid = gather_with_grad((batch[n.column]["attention_mask"].sum(1) > 2).float()) > 0.5
            second = gather_with_grad(z[f"{n.name}:1"]) if twice == 2 else None
            negatives.append(Negative(gather_with_grad(z[f"{n.name}:0"]), valid, second))
        inner = unwrap(model)
        queued = [n.negatives(inner.states[n.name]) for n in self.embedded_negatives]
        for n in self.embedded_negatives:
            n.observe(inner.states[n.name], inner, batch)
        views = Views(gather_with_grad(z["anchor"]), gather_with_grad(z["positive"]), negatives,
                      torch.cat(queued) if queued else None)
        replicas = self.shared.replicas
        loss_fn = self.loss_fn if self.matryoshka is None else lambda v: self.matryoshka.loss(self.loss_fn, v)
        if replicas == 1:
            contrastive = loss_fn(views)
        else:  # the authors' DataParallel: each replica's loss over its own rows, then their mean
            contrastive = torch.stack([loss_fn(v) for v in views.split(replicas)]).mean()
        metrics: dict[str, Any] = {"contrastive_loss": contrastive.detach()}  # read back once per log step
        metrics.update({f"{n.name}_negatives": float(n in active) for n in self.text_negatives})
        metrics.update({f"{n.name}_negatives": float(len(q)) for n, q in zip(self.embedded_negatives, queued)})
        total = contrastive
        outputs = StepOutputs(unwrap(model), step, e, z, batch, seed=self.seed)
        for a in self.aux:
            term, extra = a.forward(outputs)
            total = total + term
            metrics.update(extra)
        return total, metrics


def _width(projection: nn.Module | None, hidden: int) -> int:
    """The size of the vectors the loss sees: the projection's output (run once, in eval mode, on
    zeros: a projection with batch statistics uses its running ones), else the encoder's."""
    if projection is None:
        return hidden
    was = projection.training
    projection.eval()
    with torch.no_grad():
        width = projection(torch.zeros(2, hidden)).shape[-1]
    projection.train(was)
    return width


def _split(x: torch.Tensor, roles: list[str], n: int) -> dict[str, torch.Tensor]:
    """Rows of consecutive blocks of ``n`` by role; a role named several times (an aux term's
    rows) gets all its blocks."""
    out: dict[str, list[torch.Tensor]] = {}
    for i, role in enumerate(roles):
        out.setdefault(role, []).append(x[i * n : (i + 1) * n])
    return {role: parts[0] if len(parts) == 1 else torch.cat(parts) for role, parts in out.items()}


@dataclasses.dataclass
class EncoderPass:
    """One forward pass of the encoder in a step: its padded rows, the role of each block of
    ``size`` rows, and its dropout (None: the model's own)."""

    inputs: dict[str, torch.Tensor]
    roles: list[str]
    size: int
    dropout: float | None


def _dropout(model: nn.Module, p: float | None):
    return dropout_override(model, p) if p is not None else contextlib.nullcontext()


def _chunks(inputs: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    """Row chunks of at most ``size`` rows at the pass's width (static shapes; no host read)."""
    total = inputs["input_ids"].shape[0]
    return [{k: v[start : start + size] for k, v in inputs.items()} for start in range(0, total, size)]


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None, torch.device]:
    """The generator states dropout draws from on ``device``: CPU's, and the GPU's when on one."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None, device


def _set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None, torch.device]) -> None:
    cpu, cuda, device = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)


__all__ = ["INGREDIENTS", "KINDS", "NAMED", "CUSTOM", "Recipe", "RecipeSpec", "SharedParams", "RecipeModel"]
