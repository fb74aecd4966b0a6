"""What an ingredient of a recipe is, and the typed contracts between ingredients and the platform.

A recipe (``methods.recipe``) is one choice per kind:

- ``encoder``: how a sentence becomes a vector (the pooler alone, or a prompt's [MASK]);
- ``positives``: what a sentence is contrasted *with* (a second dropout view, or a paraphrase);
- ``negatives``: zero or more sources of hard negatives (UNA's TF-IDF replacements, SAN's MLM fills),
  each with its own schedule and the dropout of its forward pass;
- ``loss``: the one contrastive loss over anchors, positives and negatives (InfoNCE, HiNCE, NT-Xent);
- ``aux``: zero or more auxiliary terms with their own heads (VaSCL's neighbourhood term, AugCSE's
  discriminator behind gradient reversal).

Every ingredient has a typed ``Params`` dataclass holding its paper's hyperparameters and defaults;
its keys share one flat namespace with the run's configuration (a key two ingredients both declare,
such as ``spacy_model``, is one shared setting). What an ingredient needs from the data pipeline is
declared with the dataclasses below, never with untyped dicts.

Each kind has its interface: ``EncoderIngredient``, ``Positives``, ``NegativesSource`` and ``AuxTerm`` below, and
``methods.losses.Loss``. An ingredient is a subclass of its kind's interface in a module of its own,
registered with one line in ``methods/registry.py`` (``docs/recipes.md`` walks through one).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
from typing import Any, Callable, ClassVar

import numpy as np

from methods.errors import InvalidParams

KINDS = ("encoder", "positives", "negatives", "loss", "aux")


def import_by_name(spec: str) -> Any:
    """``"package.module:Attribute"`` -> the attribute (generators, ingredients, trainables)."""
    module, _, attribute = spec.partition(":")
    if not module or not attribute:
        raise ValueError(f"expected 'module:Attribute', got {spec!r}")
    return getattr(importlib.import_module(module), attribute)


def check(conditions: list[tuple[bool, str]]) -> None:
    """Raise ``InvalidParams`` with the first failed condition's message."""
    for ok, message in conditions:
        if not ok:
            raise InvalidParams(message)


def cited(default: Any, source: str) -> Any:
    """A dataclass field with its default and where that default comes from (paper and section,
    the authors' script, or our choice and why), read back by ``sources_of``."""
    return dataclasses.field(default=default, metadata={"source": source})


def sources_of(cls: type) -> dict[str, str]:
    """Each field's cited source, by field name."""
    return {f.name: f.metadata["source"] for f in dataclasses.fields(cls) if "source" in f.metadata}


def derive_seed(seed: int, *keys: object) -> int:
    """A 63-bit seed that is a fixed function of the run's ``seed`` and ``keys`` (a purpose, a rank,
    a step): every random draw of a run derives from its seed, and draws for different purposes
    are independent."""
    digest = hashlib.sha256(repr((int(seed), *keys)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order of the corpus' ``n`` rows in ``epoch``: drawn from (seed, epoch) hashed together,
    so no two (seed, epoch) pairs share an order (``seed + epoch`` gave seed 42's second epoch to
    seed 43's first, and multi-seed spreads of multi-epoch runs were not independent)."""
    return np.random.default_rng(derive_seed(seed, "epoch-order", int(epoch))).permutation(n)


def _mix(x: np.ndarray) -> np.ndarray:
    # SplitMix64's finaliser (Steele et al., 2014): a counter to 64 well-mixed bits.
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def counter_uniforms(seed: int, *keys: np.ndarray) -> np.ndarray:
    """Uniforms in [0, 1), one per element of the (broadcast) ``keys``, each a fixed function of
    ``seed`` and its keys: draws that can be recomputed rather than stored, and that do not depend
    on the order or the batches they are drawn in."""
    arrays = np.broadcast_arrays(*[np.asarray(k, dtype=np.int64) for k in keys])
    with np.errstate(over="ignore"):
        x = _mix(np.full(arrays[0].shape, seed & (2**64 - 1), dtype=np.uint64))
        for a in arrays:
            x = _mix(x ^ a.astype(np.uint64))
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


@dataclasses.dataclass(frozen=True)
class Draws:
    """The random numbers of one epoch of a run, keyed by corpus row: ``uniform(rows, *keys,
    stream=)`` is a fixed function of (the run's seed, the epoch, the stream, each row and key).
    An ingredient's per-epoch columns (UNA's negatives) are then the same whatever the batches,
    the workers or the pipeline that made them: a function of the seed."""

    seed: int
    epoch: int = 0

    def uniform(self, rows: np.ndarray, *keys: np.ndarray, stream: int) -> np.ndarray:
        return counter_uniforms(derive_seed(self.seed, "draws", self.epoch, stream), rows, *keys)


@dataclasses.dataclass
class Params:
    """An ingredient's hyperparameters (subclasses add fields with their paper's defaults)."""

    def validate(self) -> None:
        """Raise ``InvalidParams`` for values outside their valid range."""

    def validate_batch(self, batch_size: int) -> None:
        """Checks that involve the global batch size (e.g. in-batch neighbourhoods)."""


@dataclasses.dataclass(frozen=True)
class GeneratedColumn:
    """A column made once per corpus (not per epoch) by ``generator``, a class ``"module:Class"``
    whose instances are callables over ``{"sentence": [...]}`` batches (Ray Data runs them as
    actors), built with ``kwargs``; cached on disk keyed by the corpus and ``kwargs``.

    ``file``: the column comes from a user's Parquet file (columns ``sentence`` and the column)
    instead. ``group``: the missing columns of one generator with the same group are made in one
    pass by ``Class(columns=[...], **group)`` (one spaCy parse for many augmentations).
    ``cpu_bound``: one actor per CPU rather than per two CPUs (pure-Python generators).
    ``models``: the pretrained models the generator loads (their weights size the memory each of
    its actors asks Ray for)."""

    column: str
    generator: str = ""
    kwargs: dict = dataclasses.field(default_factory=dict)
    file: str = ""
    group: dict | None = None
    cpu_bound: bool = False
    models: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class CorpusStatistics:
    """Corpus-level statistics an ingredient computes once (e.g. UNA's TF-IDF table). ``fit`` takes
    the sentences (plus paraphrases where the recipe has them) and returns a picklable state;
    ``save``/``load`` write it to and read it from a cache folder keyed by the corpus, ``kind``
    and ``version`` (a code version: bump it when ``fit`` changes). ``encodes``: ``fit(text,
    embed)`` also takes the platform's ``methods.teachers.Embed`` (a teacher's embeddings of texts,
    made across the cluster on Ray)."""

    kind: str
    version: int
    fit: Callable[..., Any]  # (a sized iterable of the sentences, in order[, embed])
    save: Callable[[Any, Any], None]
    load: Callable[[Any], Any]
    encodes: bool = False


@dataclasses.dataclass
class StepOutputs:
    """What an auxiliary term sees of a training step: the unwrapped model (its projection and
    heads), the step, this worker's pooled embeddings ``e`` and projections ``z`` by role
    (``anchor``, ``positive``, and the rows an aux term added under its own name), and the batch
    (tokenised text columns and tensor columns)."""

    model: Any
    step: int
    e: dict[str, Any]
    z: dict[str, Any]
    batch: dict[str, Any]
    seed: int = 0  # the run's: a term's random draws derive from it (and the step)


class Ingredient:
    """One named part of a recipe. Subclasses set ``kind``, ``name`` and ``Params`` and override
    the hooks their paper needs; the defaults do nothing."""

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    Params: ClassVar[type[Params]] = Params
    # The paper and section the ingredient implements, shown by ``--print-config`` and the docs.
    cites: ClassVar[str] = ""
    # The search space its parameters come from: ``tune_spaces/<space>.yaml`` ("" for none).
    space: ClassVar[str] = ""
    # Run-level settings (``TrainConfig``'s) its authors use where the paper is silent, each with
    # why: ``{"max_grad_norm": (0.0, "their code steps without clipping")}``.
    config_defaults: ClassVar[dict[str, tuple[Any, str]]] = {}

    @classmethod
    def refusal(cls, spec) -> str | None:
        """Why this ingredient cannot work in the recipe ``spec`` (a ``RecipeSpec``), in one line; None
        when it can. Each ingredient says what it needs of the others here."""
        return None

    def teacher(self) -> str | None:
        """The model this ingredient learns from, if any (a recipe with one is teacher-assisted)."""
        return None

    def __init__(self, params: Params | None = None, shared=None):
        self.params = params if params is not None else self.Params()
        self.params.validate()
        self.shared = shared  # the recipe's SharedParams (temperature, pooler, fidelity)

    # -- data pipeline --------------------------------------------------------------------------

    def preflight(self) -> None:
        """Cheap checks of external resources (models, taggers) before any distributed work."""

    def notes(self, batch_size: int) -> list[str]:
        """Lines worth a user's attention about this run (printed before it starts)."""
        return []

    def run_tags(self) -> dict[str, str]:
        """MLflow tags of a run with this ingredient (e.g. an offline substitution it made)."""
        return {}

    def generated_columns(self, seed: int = 0) -> list[GeneratedColumn]:
        """Columns made once per corpus and ``seed`` (the run's: a generator's random draws derive
        from it and the corpus row, and it is part of the columns' cache key where it matters)."""
        return []

    def statistics(self) -> CorpusStatistics | None:
        return None

    def check_corpus(self, sentences: list[str]) -> None:
        """Raise ``InvalidParams`` if no statistics or columns can be made from this corpus at all
        (checked on the driver before Ray starts; what depends on the statistics: ``check_statistics``)."""

    def check_statistics(self, state: Any) -> None:
        """Raise ``InvalidParams`` if these parameters cannot work with this corpus' statistics."""

    def space_limits(self, state: Any) -> dict[str, tuple[float, float]]:
        """Bounds the corpus puts on searchable parameters (a sweep clips its ranges to them)."""
        return {}

    # True when ``augment`` adds columns to every epoch's batches (e.g. UNA's fresh negatives).
    augments_per_epoch: ClassVar[bool] = False

    def augment(self, batch: dict[str, Any], state: Any, draws: Draws) -> dict[str, Any]:
        """The epoch's columns for a batch (its rows' corpus indices in ``batch["row"]``); random
        draws come from ``draws``."""
        return batch

    def text_columns(self) -> tuple[str, ...]:
        """Columns the training step needs tokenised."""
        return ()

    def tensor_columns(self, batch: dict[str, Any], device) -> dict[str, Any]:
        """Non-text columns the training step needs as tensors."""
        return {}


class Positives(Ingredient):
    """``positives``: what each sentence is contrasted with, the text of the column ``column``
    (``rows``: the step's tokenised positives, made from the batch)."""

    kind = "positives"
    column: ClassVar[str] = "sentence"

    def rows(self, batch: dict[str, Any], step: int, seed: int) -> dict[str, Any]:
        return batch[self.column]


class NegativesSource(Ingredient):
    """``negatives``: one hard negative per sentence in the column ``column`` ("" where there is
    none), used on the steps ``active`` says; encoded in the anchors' forward pass (``dropout``
    None: the same dropout) or in a pass of its own at ``dropout``.

    An ``embedded`` source has no column: it keeps embeddings across steps in a state module it
    makes with the model (``state(encoder, dim)``: saved in state checkpoints, never exported),
    sees each step's batch (``observe``), gives its embeddings as extra columns of the loss's
    denominator (``negatives(state)``: ``Views.columns``) and is updated after each optimiser
    step (``after_step``)."""

    kind = "negatives"
    column: ClassVar[str] = ""
    # The prompt template its rows go in under encoder=prompt: the positives' ("positive") or the
    # prompt's negative template ("negative": CoT-BERT's, which needs encoder=prompt).
    view: ClassVar[str] = "positive"
    embedded: ClassVar[bool] = False

    def state(self, encoder, dim: int):
        raise NotImplementedError

    def observe(self, state, model, batch: dict[str, Any]) -> None:
        """The step's batch, seen once its loss is computed (no gradient)."""

    def negatives(self, state):
        raise NotImplementedError

    def after_step(self, state, model) -> None:
        """After the optimiser's step: the state brought up to date."""

    @property
    def dropout(self) -> float | None:
        return None

    def active(self, step: int) -> bool:
        return True

    def text_columns(self) -> tuple[str, ...]:
        return (self.column,)


class AuxTerm(Ingredient):
    """``aux``: a term added to the contrastive loss, with its own heads. One aux term of a recipe
    may bring the projection the loss sees (``brings_projection``: ``projection(hidden)``, its
    learning-rate scale and the pooling under it) instead of SimCSE's MLP."""

    kind = "aux"
    brings_projection: ClassVar[bool] = False
    default_pooler: ClassVar[str] = ""

    def projection(self, hidden: int):
        """The projection head (an ``nn.Module``) when ``brings_projection``."""
        return None

    @property
    def projection_lr_scale(self) -> float:
        return 1.0

    def heads(self, hidden: int):
        """The term's own training heads (an ``nn.Module``), if any."""
        return None

    def extra_rows(self, batch: dict[str, Any]) -> list:
        """Tokenised rows the term adds to the shared forward pass (AugCSE's augmentations)."""
        return []

    def forward(self, out: StepOutputs) -> tuple[Any, dict[str, Any]]:
        """``(term, metrics)`` of a step: the term is added to the loss (identical on every worker);
        metrics as numbers or detached 0-d tensors (read back only when the loop logs)."""
        raise NotImplementedError


class EncoderIngredient(Ingredient):
    """``encoder``: how a sentence becomes the vector the loss sees. ``plain``: the pooler alone;
    ``prompt``: the template's mask state. ``template_of(view)`` is the index of the template of a
    step's rows by view (``anchor``, ``positive``: every other row, ``negative``)."""

    kind = "encoder"
    pooler: ClassVar[str] = ""  # the pooling this encoder fixes ("": the recipe's)

    def template_of(self, view: str) -> int:
        return 0

    def prepare(self, sentence: str) -> str:
        return sentence

    def token_width(self, max_len: int) -> int:
        """The width the data pipeline tokenises each sentence to."""
        return max_len

    def pooling(self, stage: str = "test") -> Any:
        """What evaluation at ``stage`` (``test``, ``dev``) needs to embed as the authors do
        (``methods.prompt.PromptPooling``), or None."""
        return None
