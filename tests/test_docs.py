"""The README and the documentation site: the site builds with no warning (every internal link and
anchor checked by MkDocs), the README stays short and its links land, the commands' flags and the
docs agree, the defaults the docs name are the code's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_main

DOCS = ROOT / "docs"
COMMANDS = ("train", "tune", "evaluate", "report", "compare", "augment", "data", "cluster")
# Subcommands whose flags live in their own parsers (``python -m platform.data fetch --help``).
SUBCOMMANDS = {"data": [("fetch",)], "cluster": [("up",), ("down",), ("node-env",), ("slurm",), ("slurm", "logs")]}


def _pages() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(DOCS.glob("*.md"))}


def _all_text() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8") + "\n".join(_pages().values())


def _slug(heading: str) -> str:
    """The anchor MkDocs' toc (and GitHub) gives a heading: lowercased, punctuation dropped, spaces as -."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return re.sub(r"\s+", "-", text).strip("-")


def test_the_site_builds_with_no_warning(tmp_path):
    """``mkdocs build --strict``: a broken link, a missing anchor or a page outside the nav fails it."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WARNING" not in proc.stderr, proc.stderr
    assert (tmp_path / "site" / "mlflow" / "index.html").is_file()


def test_the_readme_is_short_and_its_links_land():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", readme)
    assert links, "the README links to no page"
    for target, anchor in links:
        if target.startswith("http"):
            continue
        path = ROOT / target
        assert path.is_file(), target
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
            assert anchor in {_slug(h) for h in headings}, f"{target}#{anchor}"
    # Every page of the site is one the README's table names.
    assert {p.name for p in DOCS.glob("*.md")} - {"index.md"} <= {Path(t).name for t, _ in links}


def _help_flags(command: str, *sub: str) -> set[str]:
    out = run_main(command, *sub, "--help")
    assert out.returncode == 0, out.stderr
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", out.stdout)) - {"--help"}


def test_every_flag_the_docs_name_exists_and_every_flag_is_documented():
    """A flag written on a line with ``platform.<command>`` is one of that command's (or its
    subcommands'); each command's flags are all named somewhere in the README or the docs."""
    text = _all_text()
    for command in COMMANDS:
        flags = _help_flags(command)
        for sub in SUBCOMMANDS.get(command, []):
            flags |= _help_flags(command, *sub)
        named = set()
        for line in text.splitlines():
            for match in re.finditer(rf"platform\.{command}\b", line):
                # the command's own words: up to the end of its code span, shell list or comment
                words = re.split(r"`|&&|;|\|| #", line[match.end():], maxsplit=1)[0]
                named |= set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", words))
        unknown = named - flags
        assert not unknown, f"platform.{command}: the docs name {sorted(unknown)}, its --help does not"
        undocumented = {f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)}
        assert not undocumented, f"platform.{command}: {sorted(undocumented)} are in --help but in no doc"


def _documented_defaults() -> dict[str, str]:
    """``{variable: default}`` from the environment-variable table of docs/development.md."""
    section = _pages()["development.md"].split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        match = re.search(r"\(default `?([^`;)]+)`?", cells[1])
        if match:
            for name in re.findall(r"`([A-Z_]+)`", cells[0]):
                out[name] = match.group(1).strip()
    return out


def test_the_defaults_the_docs_name_are_the_codes(monkeypatch):
    from platform import settings, storage
    from platform.tracking import store

    documented = _documented_defaults()
    for name, value in settings.READ_DEFAULTS.items():
        assert name in documented, f"{name}'s default is not documented"
        want = float(documented[name]) if isinstance(value, float) else documented[name]
        assert want == value, (name, documented[name], value)
    for name in (settings.CACHE_DIR, settings.TRACKING_URI, settings.NLTK_DATA, settings.DATA_DIR):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(settings.DATA_DIR, "/data")
    assert str(storage.cache_root()) == documented[settings.CACHE_DIR].replace("<repo>", str(ROOT))
    assert store.tracking_uri() == documented[settings.TRACKING_URI].replace("<repo>", str(ROOT))
    assert documented[settings.NLTK_DATA] == "$PLATFORM_DATA_DIR/nltk_data"
    # The values set when a command starts.
    section = _pages()["development.md"].split("Set when a command starts", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[1].startswith("`"):
            name, value = cells[0].strip("`"), cells[1].strip("`")
            assert settings.DEFAULTS[name] == value.replace("\\\\", "\\"), name


def test_every_config_key_the_docs_name_exists():
    """``key=value`` and the papers' tables' config keys are keys of the typed config or of an
    ingredient (what ``--set`` takes)."""
    from platform.config import TrainConfig
    from methods.registry import INGREDIENTS

    import dataclasses

    keys = set(TrainConfig().fields())
    keys |= {f.name for f in dataclasses.fields(TrainConfig().shared)}
    for kind in INGREDIENTS.values():
        for cls in kind.values():
            keys |= {f.name for f in dataclasses.fields(cls.Params)}
    keys |= {"method", "encoder", "positives", "negatives", "loss", "aux"}
    text = _pages()["papers.md"] + _pages()["commands.md"]
    named = set()
    for row in re.findall(r"^\|.*\|\s*([^|]*`[^|]*)\|\s*$", text, re.M):  # the last column of a table row
        named |= {m.split("=")[0] for m in re.findall(r"`([a-z_0-9]+(?:=[^`]*)?)`", row)}
    named |= set(re.findall(r"--set ([a-z_0-9]+)=", text)) - {"key"}  # "--set key=value", the syntax
    assert named, "no config key found in the docs"
    assert named - keys == set()


def test_the_report_folder_is_ignored():
    """``platform.report`` writes ``report/`` in the repository by default: git ignores it."""
    proc = subprocess.run(["git", "check-ignore", "-q", "report/report.md"], cwd=ROOT)
    assert proc.returncode == 0


OPTIONS = {"positives=paraphrase"}  # a row naming an option of the recipe, not its default


def _table_method(header: str) -> str | None:
    """The named recipe a papers' table is of: its first header cell starts with the recipe's name
    (``SAN + HiNCE (Cai et al.)`` is ``san``, ``CoT-BERT (...)`` is ``cotbert``); None for no recipe."""
    from methods.recipe import NAMED

    word = re.sub(r"[^a-z]", "", header.split()[0].lower()) if header.split() else ""
    return word if word in NAMED else None


def _paper_tables() -> list[tuple[str, list[list[str]]]]:
    """docs/papers.md's tables, each with its recipe; a table whose header names no recipe fails."""
    tables, method = [], None
    for line in _pages()["papers.md"].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            method = None
            continue
        if method is None:
            method = _table_method(cells[0])
            assert method, f"docs/papers.md: a table headed {cells[0]!r} names no recipe of methods.recipe.NAMED"
            tables.append((method, []))
        elif not set(cells[0]) <= {"-", ""}:
            tables[-1][1].append(cells)
    return tables


def test_a_papers_table_is_matched_by_its_header_or_refused():
    assert _table_method("SAN + HiNCE (Cai et al.)") == "san" and _table_method("CoT-BERT (Zhang et al., 2023)") == "cotbert"
    assert _table_method("Setting") is None and _table_method("SimCSE-like (ours)") is None


def _first_number(text: str):
    for token in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", text):
        return float(token)
    return None


def test_the_papers_tables_are_the_paper_profiles_values():
    """Each row of the papers' tables: a ``key=value`` it names is the value ``--profile paper``
    resolves for that recipe, and where a row gives as many numbers as keys (``64, 3e-5`` for
    ``batch_size``, ``lr``), each number is its key's value."""
    from platform.config import TrainConfig

    from methods.recipe import NAMED

    tables = _paper_tables()
    assert sorted(m for m, _ in tables) == sorted(NAMED)  # one table a recipe
    checked = 0
    for method, rows in tables:
        flat = TrainConfig.build(method, "paper").flat()
        for cells in rows:
            keys = re.findall(r"`([a-z_0-9]+(?:=[^`]*)?)`", re.sub(r"\(.*?\)", "", cells[-1]))  # (notes): options
            if set(keys) & OPTIONS:
                continue
            for pair in (k for k in keys if "=" in k and k not in OPTIONS):
                key, value = pair.split("=", 1)
                got = flat[key]
                assert str(got).lower() == value.lower() or _first_number(value) == got, (method, pair, got)
                checked += 1
            plain = [k for k in keys if "=" not in k]
            parts = [p for p in re.split(r",(?![^(]*\))", re.sub(r"\(.*?\)", "", cells[1]))]
            numbers = [_first_number(p) if re.match(r"\s*-?\d", p) else None for p in parts]
            if plain and len(plain) == len(parts) and all(n is not None for n in numbers):
                for key, number in zip(plain, numbers):
                    assert float(flat[key]) == number, (method, key, flat[key], number)
                    checked += 1
    assert checked >= 25, checked


def test_the_benchmark_results_page_is_written_from_the_records():
    """benchmarks/RESULTS.md is ``python -m benchmarks report``'s output for the records in
    benchmarks/results/: a record added or a case renamed without writing it again fails here."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "report", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    assert "do not edit by hand" in page and "## train-step" in page


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_docs_state_the_present_no_commit_and_one_date_a_figure():
    """How a figure got where it is lives in git and in the benchmark records: the README and the
    docs name no commit of this repository, and a paragraph (a figure with its date and machine)
    carries at most one date. (Pins of other repositories, such as a model's revision, are not
    commits of this one.)"""
    hexes = re.compile(r"(?<![\w/.@-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/-])")
    dates = re.compile(r"\b20\d\d-\d\d-\d\d\b")
    commits, crowded = [], []
    for path in _doc_files():
        text = path.read_text(encoding="utf-8")
        for token in set(hexes.findall(text)):
            found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{token}^{{commit}}"], cwd=ROOT,
                                   capture_output=True, text=True)
            if found.returncode == 0:
                commits.append(f"{path.name}: {token}")
        crowded += [f"{path.name}: {p[:80]!r}" for p in re.split(r"\n\s*\n", text) if len(dates.findall(p)) > 1]
    assert not commits, commits
    assert not crowded, crowded
    # The check can fail: a commit of this repository is found when it is named.
    recent = subprocess.run(["git", "rev-list", "--max-count=50", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.split()
    named = next(c[:8] for c in recent if hexes.fullmatch(c[:8]))
    assert hexes.findall(f"measured at {named}.") == [named]


def test_every_test_module_the_docs_cite_exists():
    cited = {m for path in _doc_files() for m in re.findall(r"tests/((?:\w+/)*test_\w+\.py)", path.read_text(encoding="utf-8"))}
    assert cited and not [m for m in sorted(cited) if not (ROOT / "tests" / m).is_file()]


def test_the_ingredient_table_is_written_from_the_ingredients_docstrings():
    from methods.registry import ingredient_table

    page = _pages()["recipes.md"]
    block = page.split("<!-- ingredients:", 1)[1].split("\n", 1)[1].split("<!-- /ingredients -->", 1)[0]
    assert block.strip() == ingredient_table().strip(), "docs/recipes.md: run `python -m methods.registry`"


def test_every_ingredient_documents_itself_in_one_form_with_an_example_that_runs():
    """Each registered ingredient's docstring has every field, and its example's ``--set`` values
    make a valid configuration of ``recipe`` (what ``python -m platform.train recipe`` builds)."""
    import shlex

    from methods.registry import FIELDS, INGREDIENTS, described
    from platform.config import TrainConfig, parse_sets

    for kind, found in INGREDIENTS.items():
        for name, cls in found.items():
            fields = described(cls)
            assert set(FIELDS) <= set(fields) and len(fields["adds"]) > 20, (kind, name, fields)
            assert "Combines with: " in fields["Requires"], (kind, name)
            words = shlex.split(fields["Example"])
            assert words[::2] == ["--set"] * (len(words) // 2) and f"{kind}={name}" in words[1::2], (name, words)
            cfg = TrainConfig.build("recipe", "local", parse_sets(words[1::2]))
            assert name in {cfg.recipe.encoder, cfg.recipe.positives, cfg.recipe.loss, *cfg.recipe.negatives, *cfg.recipe.aux}, (name, cfg.recipe)


def test_the_readme_methods_table_is_made_from_the_recipe_table_and_the_published_rows():
    """README's methods table is ``methods.published.methods_table()``: a recipe added to
    ``methods.recipe.NAMED`` or a published row changed without the README fails here."""
    from methods.published import methods_table

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert methods_table() in readme, "README's methods table is stale: paste `python -m methods.published`"


def _name_pattern() -> str:
    """A recipe's name as the docs write it: its id, or its paper's spelling (``SAN + HiNCE``,
    ``CoT-BERT``: the id's letters, any case, a hyphen between any two), from the recipe table."""
    from methods.recipe import NAMED

    names = sorted(NAMED, key=len, reverse=True)  # ESimCSE before SimCSE
    return rf"`?(?:{'|'.join('-?'.join(name) for name in names)})`?(?: \+ HiNCE)?"


_NAME = _name_pattern()
_LIST = re.compile(rf"\b{_NAME}(?:(?:,\s*(?:and\s+|or\s+)?|\s+(?:and|or)\s+){_NAME}){{3,}}", re.I)


def _method_lists(text: str) -> list[set[str]]:
    """Every list of four or more recipe names in ``text`` (fewer: a remark on some of them, such as
    "SimCSE, SAN and AugCSE train with fp16"), as the set of names it gives."""
    return [{re.sub(r"[^a-z]", "", n.lower().replace("+ hince", "")) for n in re.findall(_NAME, m.group(0), re.I)}
            for m in _LIST.finditer(text)]


def test_every_list_of_methods_in_the_docs_and_the_help_is_the_whole_recipe_table():
    """A list of the recipes in the README, the docs, the code or either command's --help names every
    recipe of ``NAMED``: none goes stale when a recipe is added."""
    from methods.recipe import NAMED

    assert _method_lists("SimCSE, UNA, SAN + HiNCE and AugCSE") == [{"simcse", "una", "san", "augcse"}]
    assert _method_lists("fp16 for SimCSE, SAN and AugCSE") == []
    texts = {"README.md": (ROOT / "README.md").read_text(encoding="utf-8"), **_pages()}
    texts.update({str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
                  for folder in ("platform", "methods") for p in (ROOT / folder).rglob("*.py")})
    for command in ("train", "tune"):
        texts[f"{command} --help"] = run_main(command, "--help").stdout
    found = 0
    for where, text in texts.items():
        for names in _method_lists(text):
            assert names == set(NAMED), (where, sorted(set(NAMED) - names))
            found += 1
    assert found >= 4, found


def test_the_named_recipes_table_is_the_recipe_table():
    """docs/recipes.md's "Named recipes" table: a row for every recipe of ``NAMED``, with its paper
    fidelity's ingredients."""
    from methods.recipe import NAMED

    section = _pages()["recipes.md"].split("## Named recipes", 1)[1].split("\n## ", 1)[0]
    rows = {cells[0].strip("`"): cells[1:5] for line in section.splitlines() if line.startswith("| `")
            for cells in [[c.strip() for c in line.strip().strip("|").split("|")]]}
    assert set(rows) == set(NAMED)
    for name, (positives, negatives, loss, aux) in rows.items():
        spec = NAMED[name].resolve("paper")
        assert positives == spec.positives and negatives == (",".join(spec.negatives) or "-"), name
        assert loss.split(" (")[0] == spec.loss and aux == (",".join(spec.aux) or "-"), name


@pytest.mark.parametrize("profile", ["local", "paper", "paper-roberta"])
def test_every_named_recipe_has_a_search_space_and_a_reference_case(profile):
    """The checklist of "Adding a named recipe": ``python -m platform.tune NAME`` finds a space for
    every recipe of the table under every profile, and every recipe has its recorded reference case."""
    from methods.recipe import NAMED
    from platform.config import TrainConfig
    from platform.space import load_space
    from tests.recipe_reference import CASES

    for name in NAMED:
        assert load_space(TrainConfig.build(name, profile)).space, name
    assert set(NAMED) <= {method for method, _, _ in CASES.values()}


def test_every_name_the_glossary_gives_exists():
    """docs/development.md's glossary: each word's code names (``module.attribute``) resolve, so
    the glossary cannot outlive a rename."""
    import importlib

    section = _pages()["development.md"].split("## Glossary", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) >= 20
    for word, _, where in rows:
        names = re.findall(r"`([\w.]+)`", where)
        assert names, word
        for name in names:
            parts, obj, i = name.split("."), None, 1
            while i < len(parts):  # the longest importable prefix is the module
                try:
                    obj = importlib.import_module(".".join(parts[:i + 1]))
                    i += 1
                except ModuleNotFoundError:
                    break
            obj = obj or importlib.import_module(parts[0])
            for attr in parts[i:]:
                assert hasattr(obj, attr), f"glossary: {word.strip()!r} names {name}, which does not exist"
                obj = getattr(obj, attr)


# Definitions in platform/ whose names hold a glossary word in another sense, each with the reason
# it is that word's sense after all, or a different one a reader cannot mistake.
GLOSSARY_EXCEPTIONS = {
    "platform/run/unit.py:_fit_seed": "one fit, of one of several seeds",
    "platform/run/unit.py:_fit_result": "a finished fit's result read back from its run",
    "platform/evaluation/classifier.py:fit_and_score": "a transfer task's classifier fitted (scikit-learn's verb)",
    "platform/evaluation/classifier.py:fit_pytorch": "a transfer task's classifier fitted (scikit-learn's verb)",
    "platform/evaluation/classifier_fits.py:fit_and_score": "a transfer task's classifiers fitted (scikit-learn's verb)",
    "platform/checkpoint.py:save_train_state": "a state checkpoint's training state (TRAIN_STATE)",
    "platform/checkpoint.py:load_train_state": "a state checkpoint's training state (TRAIN_STATE)",
    "platform/checkpoint.py:read_state": "a checkpoint's state.json (STATE)",
    "platform/checkpoint.py:read_state_at": "a checkpoint's state.json (STATE)",
    "platform/checkpoint.py:wrote_state": "a state checkpoint written",
    "platform/run/unit.py:save_state": "the run state (RUN_STATE)",
    "platform/run/unit.py:load_state": "the run state (RUN_STATE)",
    "platform/slurm_status.py:slurm_state": "Slurm's own word for a job's state",
    "platform/tracking/names.py:BEST_PREFIX": "the prefix of a run's best (best_stsb_dev_spearman)",
    "platform/tracking/names.py:BEST_STEP_TAG": "the step of a run's best",
    "platform/tracking/recorder.py:name_best": "a best checkpoint named on its run",
    "platform/run/fit.py:name_best": "a fit's best checkpoint named on its run",
    "platform/run/unit.py:best_seed": "the seed whose fit reached the configuration's best",
    "platform/report.py:best_per_recipe": "each recipe's run with the best STS-B dev",
    "platform/sweep_summary.py:best_backbone": "the backbone of a best checkpoint",
    "platform/evaluation/uncertainty.py:_best_of_pivot": "statistics: the better of two intervals",
    "platform/sweep_summary.py:winner_note": "the sweep's winner's description",
    "platform/checkpoint.py:POINTS": "the file of a state checkpoint's points",
    "platform/checkpoint.py:save_points": "a state checkpoint's points",
    "platform/checkpoint.py:load_points": "a state checkpoint's points",
    "platform/tracking/writer.py:points_in": "the points a report carries",
    "platform/checkpoint.py:ModelWriter": "writes a checkpoint's model, not a run",
    "platform/storage.py:writer_id": "who wrote a storage folder",
    "platform/sweep_runs.py:writer": "a trial's run writer",
}
GLOSSARY_TOKENS = {"fit": "fit", "release": "release", "replay": "replay", "state": ("run state", "sweep state", "checkpoint"),
                   "best": ("a run's best", "best checkpoint"), "winner": "the sweep's winner", "point": "point",
                   "points": "point", "writer": "run writer"}


def test_each_glossary_word_means_one_thing_in_the_platform():
    """A function, class, method or module constant of ``platform/`` whose name holds a glossary
    word (fit, release, replay, state, best, winner, point, writer) is one the glossary names for
    that word, or an exception above with its reason: ``sweep_state()`` that returned an identity,
    a classifier's ``Fit`` or a third ``release`` would fail here."""
    import ast

    section = _pages()["development.md"].split("## Glossary", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(): set(re.findall(r"`([\w.]+)`", line.split("|")[3]))
            for line in section.splitlines() if line.startswith("| ") and "---" not in line}
    misused, excepted = [], set()
    for path in sorted((ROOT / "platform").rglob("*.py")):
        tree, module = ast.parse(path.read_text(encoding="utf-8")), path.relative_to(ROOT).with_suffix("").as_posix()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign) and node in tree.body:
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            else:
                continue
            for name in names:
                tokens = {t.lower() for t in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", name)}
                for token in tokens & set(GLOSSARY_TOKENS):
                    words = GLOSSARY_TOKENS[token]
                    dotted = module.replace("/", ".") + "."
                    named = {part for w in ([words] if isinstance(words, str) else words) for n in rows[w]
                             if n.startswith(dotted) for part in n[len(dotted):].split(".")}
                    where = f"{module}.py:{name}"
                    if name in named:
                        continue
                    if where in GLOSSARY_EXCEPTIONS:
                        excepted.add(where)
                    else:
                        misused.append(f"{where} ({token})")
    assert not misused, misused
    assert excepted == set(GLOSSARY_EXCEPTIONS), sorted(set(GLOSSARY_EXCEPTIONS) - excepted)  # none outlives its definition
