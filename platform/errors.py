"""The one root of the platform's user errors, and how a CLI reports them: one ``error:`` line on
stderr and exit code 2, never a traceback. This module imports nothing else of the platform, so
every module can raise these.

``UserError`` and its kinds (``ConfigError``, ``DataError``) are bad input detected by the
platform; the errors ``methods/`` raises for bad parameters or backbones are user errors too.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import re
import signal
import sys
from pathlib import Path
from typing import NoReturn

from platform.settings import apply_defaults
from methods.errors import BackboneNotFound, InvalidParams, WeightLoadError


class UserError(Exception):
    """Bad input; the message says what is wrong and, where it can, what to do."""


class ConfigError(UserError):
    """A configuration value, key, profile, recipe or search space is invalid."""


class DataError(UserError):
    """Input data is missing or malformed; the message names the file and what is wrong."""


class ClusterError(UserError):
    """The Ray cluster named by ``RAY_ADDRESS`` does not answer, or a local Ray cannot start."""


USER_ERRORS = (UserError, InvalidParams, BackboneNotFound, WeightLoadError)


def writable_dir(path, what: str = "output folder") -> Path:
    """Create ``path`` and prove it takes a file (``os.access`` says yes to root on read-only
    mounts); a full or read-only disk becomes one clear line instead of a failure mid-run."""
    path = Path(path).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"{what} {path} is not writable ({exc.strerror or exc})") from None
    return path


# The user part of a URI with a password (``scheme://user:password@``): never printed.
_CREDENTIALS = re.compile(r"(?<=://)[^\s/@:]*:[^\s/@]*@")


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's message on one line, cut at ``limit`` characters (its type when it has none)."""
    return " ".join(str(exc).split())[:limit] or type(exc).__name__


def redact(text: str) -> str:
    """``text`` with the credentials of every URI in it masked (``s3://***@bucket``)."""
    return _CREDENTIALS.sub("***@", str(text))


def check_uri(location: str, what: str = "output_dir") -> None:
    """A storage URI names no credentials: they would be logged with the configuration, written
    into every checkpoint's state and printed in messages."""
    if "://" in location and redact(location) != location:
        raise UserError(f"{what} {redact(location)} carries credentials; give them the way the storage client reads "
                        "them (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, an instance role, "
                        "GOOGLE_APPLICATION_CREDENTIALS), not in the URI")


def fail(message: str) -> NoReturn:
    print(f"error: {redact(message)}", file=sys.stderr)
    raise SystemExit(2)


_terminating = []


def stopping() -> bool:
    """Whether this command was asked to stop (SIGTERM): what fails from then on (a trial, the Ray
    cluster a scheduler is taking down) ends as interrupted, not as an error of its own."""
    return bool(_terminating)


def _terminate_as_interrupt(signum, frame) -> None:
    """SIGTERM (``ray job stop``, a scheduler, ``kill``) does what Ctrl-C does: whatever handles
    SIGINT now (Tune's graceful stop, else Python's KeyboardInterrupt) handles it. Only the first
    one: a scheduler signals a job's every process and its job script passes it on too, and a second
    Ctrl-C would make Tune abort without saving its state."""
    if _terminating:
        return
    _terminating.append(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def _dump_stacks_on_sigusr2() -> None:
    """``kill -USR2 PID``: every thread's stack to the process's own stderr (``sys.__stderr__``: a
    captured ``sys.stderr`` has no descriptor). SIGUSR1 is Tune's; Ray's dashboard dumps on USR2 too."""
    if not hasattr(signal, "SIGUSR2") or sys.__stderr__ is None:
        return
    try:
        faulthandler.register(signal.SIGUSR2, file=sys.__stderr__, all_threads=True, chain=False)
    except (AttributeError, OSError, ValueError):  # no descriptor at all (an embedding host)
        pass


def cli_main(fn):
    """A command's ``main``: bad input is one ``error:`` line and exit 2; Ctrl-C and SIGTERM
    end it with exit 130 after its runs are closed (KILLED, resumable). ``kill -USR2 PID`` prints
    every thread's stack to stderr and the command goes on: what a command that seems stuck is
    waiting on."""
    @functools.wraps(fn)
    def wrapper(argv=None):
        apply_defaults()  # before anything imports Ray, which reads some of them then
        _dump_stacks_on_sigusr2()
        previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt)
        try:
            return fn(argv)
        except USER_ERRORS as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise SystemExit(130) from None
        finally:
            signal.signal(signal.SIGTERM, previous)

    return wrapper
