"""A child process's output, read while it runs and until it has exited: not until the end of its pipe.

The pipe ends when every process holding its write end has closed it, and a child's children hold it too. One
that outlives the child (a loader worker orphaned by a hung fork, seen in `bertdist demo`) held it open after the
launcher had exited, and a reader waiting for the end of the pipe waited forever.
"""

from __future__ import annotations

import codecs
import io
import os
import selectors
import subprocess
import sys
import time
from typing import IO, Iterator

OUTPUT_DRAIN_S = 10.0
"""How long the output of a command that has exited is still read: what it wrote just before its exit arrives
within milliseconds; a process it left may hold the pipe for good."""


def output_lines(proc: subprocess.Popen, name: str, log: IO[str]) -> Iterator[str]:
    """The lines `proc` (`name` to the user) writes to its stdout pipe (decoded, undecodable bytes replaced),
    until it has exited and the pipe is drained, or OUTPUT_DRAIN_S after its exit if another process still holds
    the pipe: that is said on stderr and in `log`."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    # As a text-mode pipe reads: \r\n and \r (a progress bar's) end lines too.
    decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")(errors="replace"), translate=True)
    pending, exited_at = "", None
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while exited_at is None or time.monotonic() - exited_at < OUTPUT_DRAIN_S:
            if exited_at is None and proc.poll() is not None:
                exited_at = time.monotonic()
            if not selector.select(timeout=0.2):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # EOF: every holder of the pipe has closed it
                break
            *lines, pending = (pending + decoder.decode(chunk)).split("\n")
            yield from (line + "\n" for line in lines)
        else:
            held = (
                f"bertdist: {name} exited with {proc.returncode}, but a process it started still holds "
                f"its output; stopped reading it after {OUTPUT_DRAIN_S:.0f} s\n"
            )
            log.write(held)
            print(held, end="", file=sys.stderr, flush=True)
    rest = pending + decoder.decode(b"", final=True)
    if rest:
        yield rest
    proc.stdout.close()
