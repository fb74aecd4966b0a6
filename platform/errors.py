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
