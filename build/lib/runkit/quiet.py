"""Third-party start-up chatter kept out of a run's output, without hiding what matters.

Libraries print from native code (a C++ ``TORCH_WARN`` goes straight to file descriptor 2), from their own loggers and
through ``warnings``. ``filtered_native_output`` catches what a block writes to the process's stdout and stderr at the
file-descriptor level and passes on every line but those matching the given patterns; if the block raises, everything
it wrote is passed on, so a failure keeps its context.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


@contextlib.contextmanager
def filtered_native_output(noise: Sequence[str]) -> Iterator[None]:
    """Run the block with file descriptors 1 and 2 redirected to a temporary file; afterwards write its lines to
    stderr, except those matching a regular expression of ``noise`` (all of them if the block raised)."""
    pattern = re.compile("|".join(f"(?:{p})" for p in noise)) if noise else None
    _flush()
    saved = [os.dup(1), os.dup(2)]
    failed = False
    with tempfile.TemporaryFile(mode="w+b") as capture:
        try:
            os.dup2(capture.fileno(), 1)
            os.dup2(capture.fileno(), 2)
            yield
        except BaseException:
            failed = True
            raise
        finally:
            _flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            capture.seek(0)
            text = capture.read().decode(errors="replace")
            kept = [line for line in text.splitlines()
                    if line.strip() and (failed or pattern is None or not pattern.search(line))]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")
                sys.stderr.flush()
