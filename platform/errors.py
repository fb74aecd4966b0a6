"""One clear line and exit code 2 for bad input, instead of a traceback.

Every CLI's ``main`` runs inside ``cli_main``: the exception types below are user errors (bad
data, bad configuration, a model that cannot be found, an unreachable tracking server); anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import sys
from typing import NoReturn

from methods.base import InvalidParams
from methods.encoder import BackboneNotFound, WeightLoadError
from platform.config import ConfigError
from platform.data import DataError


class UserError(Exception):
    """Any other bad input detected by the platform."""


USER_ERRORS = (UserError, ConfigError, DataError, InvalidParams, BackboneNotFound, WeightLoadError)


def writable_dir(path, what: str = "output folder"):
    """Create ``path`` and prove it takes a file (``os.access`` says yes to root on read-only
    mounts); a full or read-only disk becomes one clear line instead of a failure mid-run."""
    import os
    from pathlib import Path

    path = Path(path).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"{what} {path} is not writable ({exc.strerror or exc})") from None
    return path


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def cli_main(fn):
    @functools.wraps(fn)
    def wrapper(argv=None):
        try:
            return fn(argv)
        except USER_ERRORS as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise SystemExit(130) from None

    return wrapper
