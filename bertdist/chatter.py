"""What a person sees: bertdist's own lines on the console; the libraries' chatter in a log, or shown with -v.

DeepSpeed prints its checkpoint conversion (`Processing zero checkpoint ...`, `Reconstructed fp32 state
dict ...`) after every export and every fine-tuning epoch, MLflow logs deprecation notes in colour, Ray warns
about its token on every start. None of it tells a user anything they act on. Such output goes to the
`bertdist.chatter` logger at DEBUG: inside `quiet()` (a library call) all of it, and inside `logged()` (a whole
command: train, finetune, export) the libraries' log records and warnings, with LOGGER written to the run's
`logs/libraries.log` (`bertdist demo`: its demo.log). `bertdist -v` (BERTDIST_VERBOSE=1) leaves it on the console
as the libraries print it. Errors are not chatter: log records at ERROR and above and exceptions pass through.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Iterator

VERBOSE_ENV = "BERTDIST_VERBOSE"
LOGGER = logging.getLogger("bertdist.chatter")
NOISY_LOGGERS = ("DeepSpeed", "mlflow", "ray", "alembic", "torch.distributed")
LIBRARY_LOG = Path("logs") / "libraries.log"
"""Where `logged()` writes a command's chatter, relative to its output directory."""
_OURS = Path(__file__).resolve().parent


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


class _ToChatter(logging.Handler):
    """Records below ERROR become chatter; errors reach stderr (the one of before `quiet()` redirected it)."""

    def __init__(self) -> None:
        super().__init__()
        self.stderr = sys.stderr

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.stderr.write(f"{record.levelname} {record.name}: {record.getMessage()}\n")
        else:
            LOGGER.debug("%s %s: %s", record.levelname, record.name, record.getMessage())


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The block's prints, progress bars and warnings (stdout and stderr) and its libraries' log records below
    ERROR go to LOGGER (unless verbose). Wrap library calls only: a warning of bertdist's own stays outside."""
    if verbose():
        yield
        return
    printed = io.StringIO()
    try:
        with _libraries_logging_to_chatter(), contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            yield  # prints, progress bars, warnings
    finally:
        if printed.getvalue().strip():
            LOGGER.debug(printed.getvalue().rstrip())


@contextlib.contextmanager
def logged(log_file: str | os.PathLike | None = None) -> Iterator[None]:
    """A whole command's run: its libraries' log records below ERROR and the warnings raised outside bertdist go
    to LOGGER, and LOGGER to `log_file` (appended, created with its first line; None: LOGGER's own handlers),
    unless verbose. Prints stay on the console, since the command's own lines are prints: a library call that
    prints is wrapped in `quiet()` where it is made. Every rank of a run appends to the same file."""
    if verbose():
        yield
        return
    sink = _LogFile(log_file) if log_file else None
    level, configure = LOGGER.level, os.environ.get(_MLFLOW_CONFIGURE_LOGGING)
    # MLflow puts its own console handler on its loggers when it is first imported, unless told not to.
    os.environ[_MLFLOW_CONFIGURE_LOGGING] = "false"
    if sink:
        LOGGER.addHandler(sink)
        LOGGER.setLevel(logging.DEBUG)
    shown = warnings.showwarning
    warnings.showwarning = _warning_shower(shown)
    try:
        with _libraries_logging_to_chatter():
            yield
    finally:
        warnings.showwarning = shown
        if configure is None:
            os.environ.pop(_MLFLOW_CONFIGURE_LOGGING, None)
        else:
            os.environ[_MLFLOW_CONFIGURE_LOGGING] = configure
        if sink:
            LOGGER.removeHandler(sink)
            LOGGER.setLevel(level)
            sink.close()


_MLFLOW_CONFIGURE_LOGGING = "MLFLOW_CONFIGURE_LOGGING"


@contextlib.contextmanager
def _libraries_logging_to_chatter() -> Iterator[None]:
    handler = _ToChatter()
    saved = []
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate))
        logger.handlers, logger.propagate = _OnlyChatter([handler]), False
    try:
        yield
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate


class _OnlyChatter(list):
    """A routed logger's handlers: the console handler that DeepSpeed adds to its logger when it is imported (at
    the first DeepSpeed call, wherever that is) is not added while the logger is routed."""

    def append(self, handler: logging.Handler) -> None:
        pass


def _warning_shower(shown):
    """warnings.showwarning that sends a warning raised outside bertdist to LOGGER and shows bertdist's own."""

    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        if file is None and not Path(filename).resolve().is_relative_to(_OURS):
            LOGGER.debug(warnings.formatwarning(message, category, filename, lineno, line).rstrip())
        else:
            shown(message, category, filename, lineno, file, line)

    return show


class _LogFile(logging.FileHandler):
    """A FileHandler that creates its file, and the directory, with the first record: a run without chatter
    leaves nothing behind, and the directory's ownership checks see it as it was."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(path, encoding="utf-8", delay=True)
        self.setFormatter(logging.Formatter("%(asctime)s [pid %(process)d] %(message)s"))

    def _open(self):  # type: ignore[no-untyped-def]
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()
