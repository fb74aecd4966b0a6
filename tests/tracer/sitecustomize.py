"""Records, in every Python process started with this folder on ``PYTHONPATH``, the first call of
each function defined in the project's packages: one line ``pid module function`` appended to
``$PLATFORM_TRACE_OUT``. Ray's workers run a packed copy of the repository, so a file is named by
its path from the package folder on. Used by ``tests/test_cluster_join.py`` to check the README's
Code map against what a sweep runs.

Tracing starts when a process first imports a project module: Ray's own processes (dashboard,
agents, idle workers) never pay for it."""

import importlib.abc
import inspect
import os
import re
import sys
import threading

_OUT = os.environ.get("PLATFORM_TRACE_OUT")
_MODULE = re.compile(r"/((?:platform|methods)/[\w/]+\.py)$")
_seen: set = set()
_lock = threading.Lock()


def _record(frame, event, arg):  # a global trace function: called once per call, returns no local one
    code = frame.f_code
    if code in _seen:
        return
    _seen.add(code)
    # Functions only: a class body or a comprehension at module level runs on import.
    if not code.co_flags & inspect.CO_OPTIMIZED or code.co_name.startswith("<") or "site-packages" in code.co_filename:
        return
    found = _MODULE.search(code.co_filename)
    if found:
        with _lock, open(_OUT, "a", encoding="utf-8") as out:
            out.write(f"{os.getpid()} {found.group(1)} {code.co_name}\n")


class _StartOnProjectImport(importlib.abc.MetaPathFinder):
    started = False

    def find_spec(self, name, path=None, target=None):
        if not self.started and (name.startswith(("platform.", "methods.")) or name == "methods"):
            self.started = True
            sys.settrace(_record)
            threading.settrace(_record)
        return None  # the normal finders import it


if _OUT:
    sys.meta_path.insert(0, _StartOnProjectImport())
