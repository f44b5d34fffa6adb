"""What a person sees: bertdist's own lines on the console; the libraries' chatter in a log, or shown with -v.

DeepSpeed prints its checkpoint conversion (`Processing zero checkpoint ...`, `Reconstructed fp32 state
dict ...`) after every export and every fine-tuning epoch, MLflow logs deprecation notes in colour, Ray warns
about its token on every start. None of it tells a user anything they act on. Inside `quiet()` such output
goes to the `bertdist.chatter` logger at DEBUG: `bertdist demo` writes it to its log file, and `bertdist -v`
(BERTDIST_VERBOSE=1) leaves it on the console as the libraries print it. Errors are not chatter: log records
at ERROR and above and exceptions pass through unchanged.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from typing import Iterator

VERBOSE_ENV = "BERTDIST_VERBOSE"
LOGGER = logging.getLogger("bertdist.chatter")
NOISY_LOGGERS = ("DeepSpeed", "mlflow", "ray", "alembic", "torch.distributed")


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


class _ToChatter(logging.Handler):
    """Records below ERROR become chatter; errors reach stderr as the library wrote them."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            sys.stderr.write(f"{record.levelname} {record.name}: {record.getMessage()}\n")
        else:
            LOGGER.debug("%s %s: %s", record.levelname, record.name, record.getMessage())


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The block's prints, progress bars and warnings (stdout and stderr) and its libraries' log records below
    ERROR go to LOGGER (unless verbose). Wrap library calls only: a warning of bertdist's own stays outside."""
    if verbose():
        yield
        return
    handler = _ToChatter()
    saved = []
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate))
        logger.handlers, logger.propagate = [handler], False
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):  # prints, progress bars, warnings
            yield
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate
        if printed.getvalue().strip():
            LOGGER.debug(printed.getvalue().rstrip())
