"""The project's orchestration package, named ``platform`` so ``python -m platform.tune`` works.

The name shadows the standard library's ``platform`` module for the whole process, and torch, ray,
mlflow and transformers all call ``platform.system()`` and friends. So this file executes the
standard library's ``platform.py`` in this package's namespace (re-exporting all of it) and does
nothing else. No submodule may be named like a function of the standard module (``system``,
``node``, ``release``, ``version``, ``machine``, ``uname``, ...): it would replace that function.
"""

import os as _os
import sysconfig as _sysconfig

_STDLIB_PLATFORM = _os.path.join(_sysconfig.get_paths()["stdlib"], "platform.py")
with open(_STDLIB_PLATFORM, encoding="utf-8") as _f:
    exec(compile(_f.read(), _STDLIB_PLATFORM, "exec"), globals())
del _f
