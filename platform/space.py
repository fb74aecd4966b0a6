"""Search spaces: ``tune_spaces/<method>.yaml`` read, validated against the run's configuration,
combined for recipes, clipped to the corpus and translated to Ray Tune's, all here.

A space file holds the sweep's settings (``metric``, ``mode``, ``search``: optuna | grid,
``num_samples``, ``max_concurrent_trials``, ``seed``, ``scheduler``: asha | none), its ``space``
(``name: {loguniform|uniform|randint|choice|grid: [...]}``), per-profile overrides of the settings
(``profiles``) and the paper's one-parameter grids (``grids``, for ``--grid NAME``).

A combined recipe (``python -m platform.tune recipe --set ...``) searches the union of the spaces
of the papers its ingredients come from (the SimCSE file for the shared settings; UNA's for
``negatives=una``; SAN's for ``san`` and ``hince``; VaSCL's; AugCSE's), keeping the parameters
the recipe has. A parameter in several files gets the union of their ranges (or values).
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

from methods.recipe import CUSTOM
from platform.config import TrainConfig, profile_lineage, read_yaml
from platform.errors import ConfigError
from platform.tracking.names import BEST_PREFIX

SPACES_DIR = Path(__file__).resolve().parent.parent / "tune_spaces"
DISTRIBUTIONS = ("loguniform", "uniform", "choice", "randint", "grid")
SETTINGS = ("metric", "mode", "search", "num_samples", "max_concurrent_trials", "seed", "scheduler")
MAX_SAMPLES = 10_000  # trials of one sweep: a bound that catches a typo, not a budget
# What every trial reports and the sweep ranks on (the best of it: best_<metric>).
METRICS = ("stsb_dev_spearman",)
SCHEDULER_KEYS = ("type", "grace_period", "reduction_factor")
# Keys a trial cannot change: the sweep prepares one corpus and writes to one place.
FIXED = {"corpus": "the sweep reads its corpus once, before the trials",
         "max_sentences": "the sweep reads its corpus once, before the trials",
         "output_dir": "the sweep keeps every trial's checkpoints in its own folder",
         "runtime": "a sweep's trials run on Ray"}
TOP_KEYS = {*SETTINGS, "space", "profiles", "grids"}


@dataclasses.dataclass
class SearchSpace:
    space: dict[str, tuple[str, list]]  # name -> (distribution, arguments)
    metric: str = "stsb_dev_spearman"
    mode: str = "max"
    search: str = "optuna"
    num_samples: int = 4
    max_concurrent_trials: int = 1
    seed: int = 0
    scheduler: dict = dataclasses.field(default_factory=dict)
    grids: dict[str, list] = dataclasses.field(default_factory=dict)
    source: str = ""

    @property
    def score(self) -> str:
        """What the sweep ranks its trials by: each trial's best ``metric`` (``best_<metric>``)."""
        return BEST_PREFIX + self.metric

    def expected_trials(self) -> int:
        expected = self.num_samples
        for kind, args in self.space.values():
            if kind == "grid":
                expected *= len(args)
        return expected

    def use_grid(self, name: str) -> None:
        """The paper's one-parameter grid: every value, each run to the end (no early stopping)."""
        if name not in self.grids:
            raise ConfigError(f"{self.source}: no grid {name!r}; grids: {', '.join(self.grids) or 'none'}")
        self.space = {name: ("grid", list(self.grids[name]))}
        self.search, self.num_samples, self.scheduler = "grid", 1, {"type": "none"}

    def check(self, base: TrainConfig) -> None:
        """Every searched key must be a config key of the run that a trial can change, and each
        end point a valid value."""
        for name, (kind, args) in self.space.items():
            if name in FIXED:
                raise ConfigError(f"{self.source}: {name} cannot be searched: {FIXED[name]}; set it with --set")
            for value in args if kind in ("choice", "grid") else args[:2]:
                base.with_values({name: value}, source=f"tune space {name}")

    def clip(self, limits: dict[str, tuple[float, float]]) -> None:
        """Clip ranges and values to what the corpus allows (UNA: r below half the vocabulary)."""
        for name, (lo, hi) in limits.items():
            if name not in self.space:
                continue
            kind, args = self.space[name]
            if kind in ("choice", "grid"):
                clipped = list(dict.fromkeys(min(max(v, lo), hi) for v in args))
            else:
                clipped = [max(args[0], lo), min(args[1], hi)]
                if clipped[0] >= clipped[1]:
                    clipped = [min(clipped[0], hi) - 1, hi] if kind == "randint" else [hi * 0.5, hi]
            if clipped != args:
                print(f"note: {name} {kind} {args} clipped to {clipped} for this corpus", flush=True)
                self.space[name] = (kind, clipped)

    def generation_values(self, base: TrainConfig) -> dict[str, list]:
        """The searched parameters that change a generated column (SAN's ``scale``, AugCSE's
        ``augmentations``), with every value a trial can draw: each is generated once, before the
        trials. They must be a choice or a grid: a range would need a new generation per trial."""
        varying = {}
        for name, (kind, args) in self.space.items():
            values = args if kind in ("choice", "grid") else args[:2]
            made = [base.with_values({name: v}, source=f"tune space {name}").build_recipe().generated_columns()
                    for v in values]
            if all(m == made[0] for m in made):
                continue
            if kind not in ("choice", "grid"):
                columns = ", ".join(c.column for c in made[0])
                raise ConfigError(f"{self.source}: {name} changes the generated column(s) {columns}, made once "
                                  f"before the trials: search it over a choice of values, not a {kind} range")
            varying[name] = list(values)
        return varying

    @staticmethod
    def generation_configs(base: TrainConfig, varying: dict[str, list]) -> list[TrainConfig]:
        """``base`` with every combination of ``varying`` (``generation_values``)."""
        return [base.with_values(dict(zip(varying, combo)), source="search space")
                for combo in itertools.product(*varying.values())] if varying else []

    def to_ray(self) -> dict[str, Any]:
        from ray import tune

        make = {
            "loguniform": lambda a: tune.loguniform(*a),
            "uniform": lambda a: tune.uniform(*a),
            "randint": lambda a: tune.randint(a[0], a[1] + 1),
            "choice": tune.choice,
            "grid": tune.grid_search,
        }
        return {name: make[kind](args) for name, (kind, args) in self.space.items()}

    def as_params(self) -> dict[str, str]:
        return {f"space.{name}": f"{kind} {args}" for name, (kind, args) in self.space.items()}


def load_space(base: TrainConfig, path: Path | None = None, grid: str | None = None) -> SearchSpace:
    """The sweep of ``base``'s method (or ``path``), for its profile; checked against ``base``."""
    if path is not None or base.method != CUSTOM:
        spec = read_file(path or SPACES_DIR / f"{base.method}.yaml", base.profile)
    else:
        spec = recipe_space(base)
    if grid is not None:
        spec.use_grid(grid)
    spec.check(base)
    return spec


def recipe_space(base: TrainConfig) -> SearchSpace:
    # The shared settings' space (SimCSE's), then the one each ingredient names (``Ingredient.space``).
    names = ["simcse"] + [c.space for c in base.recipe.classes() if c.space]
    files = [read_file(SPACES_DIR / f"{name}.yaml", base.profile) for name in dict.fromkeys(names)]
    combined = dataclasses.replace(files[0], space={}, grids={}, source=", ".join(f.source for f in files))
    keys = set(base.fields())
    for f in files:
        for name, (kind, args) in f.space.items():
            if name in keys:
                combined.space[name] = union(name, combined.space.get(name), (kind, args), combined.source)
        combined.grids.update({k: v for k, v in f.grids.items() if k in keys})
    return combined


def union(name: str, a: tuple[str, list] | None, b: tuple[str, list], source: str) -> tuple[str, list]:
    if a is None:
        return b
    if a[0] != b[0]:
        raise ConfigError(f"{source}: {name} is {a[0]} in one space file and {b[0]} in another; they cannot be combined")
    if a[0] in ("choice", "grid"):
        return a[0], list(dict.fromkeys([*a[1], *b[1]]))
    return a[0], [min(a[1][0], b[1][0]), max(a[1][1], b[1][1])]


def read_file(path: Path, profile: str) -> SearchSpace:
    if not path.is_file():
        raise ConfigError(f"no search space {path} (a YAML file; see tune_spaces/)")
    raw = read_yaml(path, str(path))
    unknown = set(raw) - TOP_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(TOP_KEYS))}")
    per_profile = raw.get("profiles") or {}
    # A profile that extends another (paper-roberta: paper) takes its settings, then its own on top.
    for name in reversed(profile_lineage(profile)):
        raw = {**raw, **(per_profile.get(name) or {})}
    settings = {k: raw[k] for k in SETTINGS if k in raw}
    spec = SearchSpace(space={}, grids=dict(raw.get("grids") or {}), source=str(path), **settings)
    if spec.mode not in ("max", "min"):
        raise ConfigError(f"{path}: mode must be max or min")
    if spec.metric not in METRICS:
        raise ConfigError(f"{path}: metric {spec.metric!r} is not one the trials report; use {' or '.join(METRICS)}")
    check_scheduler(spec.scheduler, path)
    if spec.search not in ("optuna", "grid"):
        raise ConfigError(f"{path}: search must be optuna or grid, got {spec.search!r}")
    for key in ("num_samples", "max_concurrent_trials"):
        value = getattr(spec, key)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SAMPLES:
            raise ConfigError(f"{path}: {key} must be an integer between 1 and {MAX_SAMPLES}, got {value!r}")
    if isinstance(spec.seed, bool) or not isinstance(spec.seed, int) or spec.seed < 0:
        raise ConfigError(f"{path}: seed must be an integer >= 0, got {spec.seed!r}")
    space = raw.get("space")
    if not isinstance(space, dict) or not space:
        raise ConfigError(f"{path}: 'space' must map parameter names to distributions")
    for name, dist in space.items():
        if not isinstance(dist, dict) or len(dist) != 1 or next(iter(dist)) not in DISTRIBUTIONS:
            raise ConfigError(f"{path}: {name}: expected one of {{{', '.join(DISTRIBUTIONS)}: ...}}, got {dist!r}")
        kind, args = next(iter(dist.items()))
        if kind in ("loguniform", "uniform", "randint"):
            if not (isinstance(args, list) and len(args) == 2 and all(isinstance(a, (int, float)) for a in args)):
                raise ConfigError(f"{path}: {name}: {kind} takes [low, high]")
            if not args[0] < args[1] or (kind == "loguniform" and args[0] <= 0):
                raise ConfigError(f"{path}: {name}: {kind} needs 0 < low < high" if kind == "loguniform"
                                  else f"{path}: {name}: needs low < high")
        elif not (isinstance(args, list) and args):
            raise ConfigError(f"{path}: {name}: {kind} takes a non-empty list")
        spec.space[name] = (kind, list(args))
    return spec


def check_scheduler(scheduler: Any, path: Path) -> None:
    """``scheduler``: ``{type: asha | none, grace_period: int >= 1, reduction_factor: > 1}``."""
    if not isinstance(scheduler, dict) or scheduler.get("type", "asha") not in ("asha", "none"):
        raise ConfigError(f"{path}: scheduler must be a mapping with type asha or none, got {scheduler!r}")
    unknown = set(scheduler) - set(SCHEDULER_KEYS)
    if unknown:
        raise ConfigError(f"{path}: scheduler: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(SCHEDULER_KEYS)}")
    grace = scheduler.get("grace_period", 1)
    if isinstance(grace, bool) or not isinstance(grace, int) or grace < 1:
        raise ConfigError(f"{path}: scheduler: grace_period must be an integer >= 1 (evaluations), got {grace!r}")
    factor = scheduler.get("reduction_factor", 2)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1:
        raise ConfigError(f"{path}: scheduler: reduction_factor must be a number > 1, got {factor!r}")
