"""Records, in every Python process started with this folder on ``PYTHONPATH``, the first call of
each function defined in the project's packages: one line ``pid module function host`` appended to
``$PLATFORM_TRACE_OUT``. Ray's workers run a packed copy of the repository, so a file is named by
its path from the package folder on. Used by ``tests/platform/cluster/test_cluster_join.py`` to check the README's
Code map against what a sweep runs, and by ``tests/platform/cluster/test_cluster_slurm.py`` to see which node ran what.

Each process also appends, to ``$PLATFORM_TRACE_OUT.stacks``, the project's frames on the stack
(``module:function``, outermost first) at each distinct call of where the sweep crosses into
Ray or reaches the loss: Tune's ``Tuner.fit`` (the driver), Ray Train's ``fit`` (a trial),
``F.cross_entropy`` (a worker). ``tests/platform/cluster/test_cluster_join.py`` joins the three
into the path from ``python -m platform.tune`` to the loss.

The project's modules are compiled with one call added at the top of each function body (after
its docstring); nothing else is traced. (A global ``sys.settrace`` function, called on every
Python call of every library once a process had imported the project, made the sweep's workers
and generation actors 20-55% slower.)"""

import ast
import builtins
import importlib.abc
import importlib.machinery
import json
import os
import re
import socket
import sys
import threading
import traceback

_OUT = os.environ.get("PLATFORM_TRACE_OUT")
_MODULE = re.compile(r"/((?:platform|methods)/[\w/]+\.py)$")
_seen: set = set()
_lock = threading.Lock()


def _hit(module: str, name: str) -> None:
    if (module, name) in _seen:
        return
    with _lock:
        if (module, name) in _seen:
            return
        _seen.add((module, name))
        with open(_OUT, "a", encoding="utf-8") as out:
            out.write(f"{os.getpid()} {module} {name} {socket.gethostname()}\n")


class _RecordCalls(ast.NodeTransformer):
    """``_platform_trace_hit(module, name)`` as the first statement of every function body."""

    def __init__(self, module: str):
        self.module = module

    def _function(self, node):
        self.generic_visit(node)
        body = node.body
        docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str)
        at = 1 if docstring else 0
        call = ast.Expr(ast.Call(ast.Name("_platform_trace_hit", ast.Load()),
                                 [ast.Constant(self.module), ast.Constant(node.name)], []))
        body.insert(at, ast.copy_location(call, body[min(at, len(body) - 1)]))
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = _function


class _RecordingLoader(importlib.machinery.SourceFileLoader):
    """A project module compiled from its source with the calls added (never from, or into, its
    bytecode cache: ``path_stats`` failing makes the import system skip both)."""

    def path_stats(self, path):
        raise OSError("compiled with the tracer's calls")

    def source_to_code(self, data, path, *, _optimize=-1):
        tree = _RecordCalls(_MODULE.search(path).group(1)).visit(ast.parse(data, filename=path))
        return compile(ast.fix_missing_locations(tree), path, "exec", dont_inherit=True, optimize=_optimize)


class _ProjectFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if not (name in ("platform", "methods") or name.startswith(("platform.", "methods."))):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        origin = getattr(spec, "origin", None) or ""
        if not _MODULE.search(origin) or "site-packages" in origin:
            return None  # the standard library's platform, an installed package: found as usual
        spec.loader = _RecordingLoader(name, origin)
        return spec


# Where the sweep crosses into Ray, or reaches the loss: module -> (class or None, function).
_CROSSINGS = {"ray.tune.tuner": ("Tuner", "fit"), "ray.train.v2.api.data_parallel_trainer": ("DataParallelTrainer", "fit"),
              "torch.nn.functional": (None, "cross_entropy")}
_stacks: set = set()


def _record_stack(target: str) -> None:
    frames = [(_MODULE.search(f.filename), f.name) for f in traceback.extract_stack()[:-2]]
    stack = [f"{found.group(1)}:{name}" for found, name in frames if found and "site-packages" not in found.string]
    with _lock:
        if (target, tuple(stack)) in _stacks:
            return
        _stacks.add((target, tuple(stack)))
        with open(_OUT + ".stacks", "a", encoding="utf-8") as out:
            out.write(json.dumps({"pid": os.getpid(), "target": target, "stack": stack}) + "\n")


def _traced(owner, attr: str, target: str) -> None:
    real = getattr(owner, attr)

    def call(*args, **kwargs):
        _record_stack(target)
        return real(*args, **kwargs)

    setattr(owner, attr, call)


class _CrossingFinder(importlib.abc.MetaPathFinder):
    """The modules of ``_CROSSINGS`` imported as usual, then their function wrapped to record its stack."""

    def find_spec(self, name, path=None, target=None):
        if name not in _CROSSINGS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module
        cls, attr = _CROSSINGS[name]

        def exec_module(module):
            run(module)
            _traced(getattr(module, cls) if cls else module, attr, f"{cls}.{attr}" if cls else attr)

        spec.loader.exec_module = exec_module
        return spec


if _OUT:
    builtins._platform_trace_hit = _hit
    sys.meta_path.insert(0, _ProjectFinder())
    sys.meta_path.insert(0, _CrossingFinder())
