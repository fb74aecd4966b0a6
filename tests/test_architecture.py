"""The shape of the code: imports go one way (no cycles, ``methods/`` without Ray or MLflow, the run
layer below the commands, tests and benchmarks apart), the repository stands alone, functions
stay short, and the path of a sweep is the README's code map."""

from __future__ import annotations

import ast
import functools
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, code_map

# The commands (``python -m platform.<name>``) and what only they use: nothing below them imports these.
COMMANDS = {"platform.train", "platform.tune", "platform.evaluate", "platform.augment", "platform.report",
            "platform.data.fetch", "platform.data.__main__", "platform.sweep_summary"}

PACKAGES = ("platform", "methods")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Project modules imported anywhere in the file (top level or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name.split(".")[0] in PACKAGES:
                out.add(name)
    return out


def test_no_import_cycles():
    known = _modules()
    graph = {m: _imports(p, known) - {m} for m, p in known.items()}
    # A package's __init__ that only re-exports (platform) is no edge of its own.
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n):] + [n] if n in stack else [m, n])
            elif n not in state:
                visit(n, stack + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_methods_import_neither_ray_nor_mlflow_nor_platform():
    for path in (ROOT / "methods").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] not in ("ray", "mlflow", "platform"), (path, name)


def test_errors_is_the_bottom_of_the_platform():
    """errors imports only settings, which imports nothing of the platform."""
    known = _modules()
    assert {m for m in _imports(known["platform.errors"], known) if m.startswith("platform")} <= {"platform.settings"}
    assert not {m for m in _imports(known["platform.settings"], known) if m.startswith("platform")}


def test_project_modules_import_each_other_only_at_the_top():
    """An import inside a function hides a layer that points the wrong way; libraries (torch, Ray,
    MLflow) may still be imported late, where a command or runtime does without them."""
    known = _modules()
    late = []
    for module, path in known.items():
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and _imports_of(node) & set(PACKAGES):
                        late.append(f"{module}:{node.lineno}")
    assert not late, late


def _imports_of(node: ast.Import | ast.ImportFrom) -> set[str]:
    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    return {name.split(".")[0] for name in names}


# A tag or metric read, written or searched by a literal name: every such name is in names.py.
_LITERAL_KEY = re.compile(r"""\.tags(\.get)?[\[(]\s*f?["']|set_tags\(\{\s*f?["']|set_tag\([^,(){]+,\s*f?["']"""
                          r"""|\.metrics(\.get)?[\[(]\s*f?["']|["']f?(tags|metrics)\.[a-z_]+\s*=|["'](tags|metrics)\.[a-z_]+ (ASC|DESC)"""
                          r"""|["']vs_backbone/""")


def test_mlflow_keys_are_named_in_one_module():
    """``platform/tracking/names.py`` names every metric and tag; elsewhere in ``platform/`` a run's
    tags and metrics are read, written and searched by those names, never by a literal."""
    offenders = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}" for p in sorted((ROOT / "platform").rglob("*.py"))
                 if p.name != "names.py" for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                 if _LITERAL_KEY.search(line)]
    assert not offenders, "\n".join(offenders)
    assert all(_LITERAL_KEY.search(line) for line in ('run.data.tags.get("seed")', 'c.set_tag(run_id, "hub_repo", url)',
                                                      'run.set_tags({"seeds": n})', "f\"tags.trial_id = '{t}'\"",
                                                      'run.data.metrics.get(f"sts_{task}")', 'm[f"vs_backbone/baseline_sts_{t}"]'))


def test_the_configuration_is_below_the_run_layer():
    known = _modules()
    assert not {m for m in _imports(known["platform.config"], known) if m.startswith("platform.run")}


def test_the_repository_stands_alone():
    """No file points at material outside the repository; the one exception is the default data
    folder the tests and CI use (the README's commands and the test fixture's hint)."""
    pattern = re.compile(r"\.\./shared|STACK-NOTES|METHODS\.md|DESIGN\.md")
    allowed = re.compile(r"PLATFORM_DATA_DIR=\.\./shared/data|\(e\.g\. \.\./shared/data\)|`\.\./shared/data`")
    offenders = []
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    for rel in map(Path, files):
        path = ROOT / rel
        if not path.is_file() or path.suffix in (".json", ".parquet") or rel == Path("tests/test_architecture.py"):
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if pattern.search(allowed.sub("", line)):
                offenders.append(f"{rel}:{lineno}: {line.strip()[:100]}")
    assert not offenders, "\n".join(offenders)


def test_train_loop_fits_on_one_screen():
    from platform.run.loop import train_loop_per_worker

    lines = inspect.getsource(train_loop_per_worker).splitlines()
    assert len(lines) <= 62, len(lines)


def test_no_function_of_the_platform_is_over_60_lines():
    long = []
    for path in (ROOT / "platform").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})")
    assert not long, long


def test_the_run_layer_imports_no_command():
    known = _modules()
    upward = {m: _imports(p, known) & COMMANDS for m, p in known.items()
              if m.startswith(("platform.run.", "platform.tracking", "platform.data", "platform.evaluation"))
              and m not in COMMANDS}
    assert not {m: c for m, c in upward.items() if c}


def _python_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


# What the whole project is tested for, beside the packages' own tests.
PROJECT_TESTS = {"test_architecture", "test_docs", "test_lock"}


def test_the_tests_mirror_the_packages():
    """A module's tests sit in the folder named after it (``tests/platform/run/`` for
    ``platform/run/``, ``tests/platform/cluster/`` for ``platform/cluster*.py``); only the tests of
    the project as a whole sit in ``tests/``. Module names stay unique: pytest imports each test
    module by its name (no ``__init__.py``; a ``tests/platform`` package would shadow ``platform``)."""
    found = sorted((ROOT / "tests").rglob("test_*.py"))
    assert len({p.stem for p in found}) == len(found)
    assert not list((ROOT / "tests").rglob("__init__.py"))
    assert {p.stem for p in found if p.parent == ROOT / "tests"} == PROJECT_TESTS
    for path in found:
        folder = path.parent.relative_to(ROOT / "tests")
        if path.parent != ROOT / "tests":
            assert (ROOT / folder).is_dir() or list((ROOT / folder.parent).glob(f"{folder.name}*.py")), path


def test_tests_and_benchmarks_do_not_import_each_other_nor_tests_other_tests():
    """Each runs the other as a command at most (the suite runs every benchmark case's smoke)."""
    offenders = []
    for path in (ROOT / "benchmarks").rglob("*.py"):
        offenders += [f"{path.name}: {n}" for n in _python_imports(path) if n.split(".")[0] == "tests"]
    for path in (ROOT / "tests").rglob("*.py"):
        offenders += [f"{path.name}: {n}" for n in _python_imports(path)
                      if n.split(".")[0] == "benchmarks" or re.match(r"tests(\.\w+)*\.(test_|conftest)", n)]
    assert not offenders, offenders


def test_every_file_of_the_readme_code_map_is_imported_on_the_sweeps_path():
    """the "Code map" of docs/development.md lists the modules ``python -m platform.tune una`` runs (checked against
    a traced sweep in ``tests/platform/cluster/test_cluster_join.py``); each exists and is imported along that path."""
    path = list(code_map())
    assert len(path) >= 3, path
    from methods.registry import REGISTERED

    known = _modules()
    reached, frontier = {"platform.tune"}, ["platform.tune"]
    while frontier:
        module = frontier.pop()
        registered = {e.partition(":")[0] for e in REGISTERED} if module == "methods.registry" else set()
        for name in _imports(known[module], known) | registered:
            if name not in reached:
                reached.add(name)
                frontier.append(name)
    for rel in path:
        assert (ROOT / rel).is_file(), rel
        assert _module_name(ROOT / rel) in reached, rel


def test_every_environment_variable_is_named_in_settings_and_the_readme():
    """The platform reads and sets the environment only through ``platform/settings.py`` (the
    cluster launcher's ``cluster.env`` keys and Slurm's job variables aside), and docs/development.md's table lists
    every name there."""
    allowed = {"settings.py", "cluster.py", "cluster_aws.py", "cluster_slurm.py", "slurm_job.py"}
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "platform").rglob("*.py") if p.name not in allowed
                 for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                 if "os.environ" in line or "getenv(" in line]
    assert not offenders, offenders
    from platform import settings

    names = {v for k, v in vars(settings).items() if k.isupper() and isinstance(v, str)}
    names |= {n for k, v in vars(settings).items() if k.isupper() and isinstance(v, tuple) for n in v}
    names |= set(settings.DEFAULTS)
    readme = (ROOT / "docs" / "development.md").read_text(encoding="utf-8").split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    assert {n for n in names if f"`{n}`" not in readme} == set()


def test_importing_the_platform_sets_no_environment_variable():
    """Importing any module of the package changes nothing in the environment; a command's start
    (``settings.apply_defaults``) does, keeping what the user set."""
    script = """
import os, sys, pkgutil, importlib
import torch, ray, mlflow, transformers  # what the libraries themselves set on import is theirs
sys.modules.pop("platform", None)
before = dict(os.environ)
import platform
for m in pkgutil.walk_packages(platform.__path__, "platform."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
print(sorted(k for k in set(os.environ) | set(before) if os.environ.get(k) != before.get(k)))
os.environ["RAY_AIR_NEW_OUTPUT"] = "1"
from platform import settings
settings.apply_defaults()
print(os.environ["RAY_AIR_NEW_OUTPUT"], os.environ["TOKENIZERS_PARALLELISM"])
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in __import__("os").environ.items() if k not in ("TOKENIZERS_PARALLELISM", "RAY_AIR_NEW_OUTPUT")})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["[]", "1 false"], out.stdout


def test_the_modules_every_command_imports_load_no_torch():
    """``platform.console``, ``platform.errors`` and ``platform.data``, which every command imports
    for its constants and its error line, import no torch (0.7 s of a command's start)."""
    script = "import sys, platform.console, platform.errors, platform.data; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


@functools.cache
def _top_level_names(path: Path) -> frozenset[str]:
    """What ``from <module> import name`` can take from a module: its top-level definitions,
    assignments and imports (``if``/``try`` blocks included)."""
    names: set[str] = set()

    def collect(body) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                collect(node.body + node.orelse + getattr(node, "finalbody", [])
                        + [s for h in getattr(node, "handlers", []) for s in h.body])

    collect(ast.parse(path.read_text(encoding="utf-8")).body)
    return frozenset(names)


def test_what_the_benchmarks_import_from_the_project_exists():
    """A rename in ``platform/`` or ``methods/`` that leaves a benchmark importing a name that is
    gone (``from m import name``, or ``module.name`` of a project module it imported) fails here,
    in the fast tier, before the suite's smokes of every case (``tests/benchmarks/test_benchmarks.py``)."""
    known = _modules()
    missing = []
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases: dict[str, str] = {}  # a name bound to a project module in this file -> that module
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                missing += [f"{path.name}: import {a.name}" for a in node.names
                            if a.name.split(".")[0] in PACKAGES and a.name not in known]
                aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in known})
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] in PACKAGES:
                folder = ROOT.joinpath(*node.module.split("."))
                if node.module not in known and not folder.is_dir():
                    missing.append(f"{path.name}: from {node.module}")
                    continue
                defined = _top_level_names(known[node.module]) if node.module in known else frozenset()
                for a in node.names:
                    if f"{node.module}.{a.name}" in known:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                    elif a.name not in defined:
                        missing.append(f"{path.name}: from {node.module} import {a.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                module = aliases[node.value.id]
                if node.attr not in _top_level_names(known[module]) and f"{module}.{node.attr}" not in known:
                    missing.append(f"{path.name}: {module}.{node.attr}")
    assert not missing, missing


def _outside_this_pytest() -> dict[str, str]:
    """This environment without what pytest-xdist and the caller's options give this run: a pytest
    started from a test runs as a user's would."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS"))}


@pytest.mark.parametrize("tier", ["suite", "scenario"])
def test_the_suites_slowest_modules_are_handed_out_first(tmp_path, tier):
    """``tests/suite_order.py`` orders the modules slowest first, one list for the suite and one for
    the scenarios (``-m scenario``), so that each run's two processes finish together;
    pytest-xdist's own re-sorting (by number of tests) must not undo it. A module named as the
    slowest with one test runs before two modules of many under ``--dist loadfile`` (the README's;
    one process, so that the queue's order is the order run), and every name in the lists is a
    module of the suite."""
    from tests.suite_order import SCENARIOS_SLOWEST_FIRST, SLOWEST_FIRST

    for order in (SLOWEST_FIRST, SCENARIOS_SLOWEST_FIRST):
        assert sorted(set(order)) == sorted(order)
        assert not [m for m in order if not list((ROOT / "tests").rglob(f"{m}.py"))]
    first = (SLOWEST_FIRST if tier == "suite" else SCENARIOS_SLOWEST_FIRST)[0]
    log = tmp_path / "order.txt"
    (tmp_path / "conftest.py").write_text(
        f"import os, sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.suite_order import pytest_collection_modifyitems, pytest_configure  # noqa: F401\n"
        "def pytest_runtest_logstart(nodeid, location):\n"
        "    if os.environ.get('PYTEST_XDIST_WORKER'):\n"
        f"        open({str(log)!r}, 'a').write(nodeid.split('::')[0] + '\\n')\n")
    head = "import pytest\npytestmark = pytest.mark.scenario\n" if tier == "scenario" else ""
    (tmp_path / f"{first}.py").write_text(head + "def test_one():\n    pass\n")
    for name in ("test_many_a", "test_many_b"):
        (tmp_path / f"{name}.py").write_text(head + "".join(f"def test_{i}():\n    pass\n" for i in range(6)))
    marks = ["-m", "scenario", "-W", "ignore::pytest.PytestUnknownMarkWarning"] if tier == "scenario" else []
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "1", "--dist", "loadfile", "-p", "no:cacheprovider",
                           *marks, "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=_outside_this_pytest())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    order = log.read_text().split()
    assert len(order) == 13 and order[:1] == [f"{first}.py"], order


def test_ci_runs_the_suite_then_the_scenarios_and_every_failure_counts(tmp_path):
    """``.ci/run`` runs the README's test command (every test but the scenarios), then its scenario
    command (the scenarios), the same pytest line but for the marker: together every test, once. A
    failure of the first does not skip the second, and the exit status is the first failure's."""
    printed = subprocess.run(["bash", str(ROOT / ".ci" / "run"), "--print"], capture_output=True, text=True, timeout=30)
    assert printed.returncode == 0, printed.stderr
    suite, scenarios = printed.stdout.splitlines()
    assert f"```bash\n{suite}\n```" in (ROOT / "README.md").read_text().split("<!-- test-command", 1)[1]
    pytest_line = suite.split(" && ")[-1]
    everything = pytest_line.removesuffix(' -m "not scenario"')
    assert everything != pytest_line and " -n 2 --dist loadfile" in everything
    assert scenarios == f". .venv/bin/activate && {everything} -m scenario"

    ci = tmp_path / ".ci" / "run"
    ci.parent.mkdir()
    ci.write_text((ROOT / ".ci" / "run").read_text())
    log = tmp_path / "log"
    (tmp_path / "README.md").write_text(
        f"<!-- test-command -->\n```bash\necho suite >> {log}; exit 3\n```\n"
        f"<!-- scenario-command -->\n```bash\necho scenarios $PLATFORM_REQUIRE_MULTINODE >> {log}; exit 4\n```\n")
    proc = subprocess.run(["bash", str(ci)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 3 and log.read_text().split("\n") == ["suite", "scenarios 1", ""], proc.stderr


_MARKS_OF_THE_TIERS = """
import json, sys
import pytest

class Marks:
    def __init__(self, path):
        self.path = path

    def pytest_collection_finish(self, session):
        with open(self.path, "w") as out:
            json.dump({i.nodeid: sorted({m.name for m in i.iter_markers()}) for i in session.items}, out)

for tier in json.loads(sys.argv[1]):  # one process: the imports that collection pays for, paid once
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-W", "error::pytest.PytestUnknownMarkWarning",
                        *tier["args"]], plugins=[Marks(tier["out"])])
    if code:
        sys.exit(int(code))
"""


def test_a_bare_pytest_runs_the_fast_tier_and_the_two_commands_run_the_rest(tmp_path):
    """Two markers make the tiers: a bare ``pytest`` runs neither ``e2e`` nor ``scenario`` tests
    (pyproject's addopts); the README's test command (``-m "not scenario"``) adds the ``e2e`` ones and
    its scenario command (``-m scenario``) runs the rest, every test once. Collected by pytest
    itself, so that a mark spelt wrong fails here."""
    marks = {"bare": [], "suite": ["-m", "not scenario"], "scenarios": ["-m", "scenario"]}
    asked = [{"args": args, "out": str(tmp_path / f"{name}.json")} for name, args in marks.items()]
    proc = subprocess.run([sys.executable, "-c", _MARKS_OF_THE_TIERS, json.dumps(asked)], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, env=_outside_this_pytest())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    tiers = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in marks}
    assert len(tiers["bare"]) >= 400 and not [t for t, m in tiers["bare"].items() if {"e2e", "scenario"} & set(m)]
    assert len(tiers["scenarios"]) >= 20 and all("scenario" in m for m in tiers["scenarios"].values())
    assert not [t for t, m in tiers["suite"].items() if "scenario" in m]
    assert set(tiers["bare"]) < set(tiers["suite"]) and not set(tiers["suite"]) & set(tiers["scenarios"])
    every = {m for tier in tiers.values() for marks in tier.values() for m in marks}
    assert every <= {"e2e", "scenario", "parametrize", "skipif", "usefixtures", "timeout"}, every
    # One tier a test: a scenario is not also e2e (the tier's name says where it runs).
    assert not [t for tier in tiers.values() for t, m in tier.items() if {"e2e", "scenario"} <= set(m)]


# The project's calls from ``python -m platform.train una`` (the process runtime) down to the loss's
# ``F.cross_entropy``; the path may shrink, not grow.
MOST_HOPS_TO_THE_LOSS = 8
_FIRST_LOSS_STACK = """
import json, sys, traceback
import torch.nn.functional as F
real = F.cross_entropy
def traced(*args, **kwargs):
    if not traced.seen:
        traced.seen = [f"{f.filename}:{f.name}" for f in traceback.extract_stack()[:-1]]
    return real(*args, **kwargs)
traced.seen = None
F.cross_entropy = traced
from platform import train
code = train.main(sys.argv[2:])
json.dump(traced.seen, open(sys.argv[1], "w"))
sys.exit(code)
"""


@pytest.mark.e2e
def test_the_path_from_the_command_to_the_loss_is_short(tiny_model, small_corpus, tmp_path, mlflow_uri):
    """A reader follows ``python -m platform.train una`` to ``F.cross_entropy`` through the project's
    own functions: counted as the calls between the command's ``main`` and the loss on the stack of
    its first step (the process runtime; a Ray Train worker starts the same loop), at most
    ``MOST_HOPS_TO_THE_LOSS``."""
    from tests.helpers import sets

    out = tmp_path / "stack.json"
    args = sets(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=1, eval_steps=1, num_workers=1,
                runtime="process", final_eval="false", r=100, alpha=1, output_dir=tmp_path / "runs")
    proc = subprocess.run([sys.executable, "-c", _FIRST_LOSS_STACK, str(out), "una", *args], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri},
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = [f.split(str(ROOT) + "/", 1)[1] for f in json.loads(out.read_text()) if f.startswith(str(ROOT) + "/")
            and not f.startswith(str(ROOT / ".venv")) and "/tests/" not in f and "<" not in f]
    start = next(i for i, f in enumerate(ours) if f == "platform/train.py:main")
    path = [f for f in ours[start:] if not f.endswith(":wrapper")]  # cli_main's wrapper is the command itself
    assert path[-1].startswith("methods/losses.py:"), path
    hops = len(path) - 1
    print(f"{hops} hops over {len({f.split(':')[0] for f in path})} files:\n  " + "\n  ".join(path))
    assert hops <= MOST_HOPS_TO_THE_LOSS, path
