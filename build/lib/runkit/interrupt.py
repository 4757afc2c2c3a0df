"""Graceful Ctrl-C for long runs: the first finishes the current step and saves, a second aborts."""

from __future__ import annotations

import signal
import threading


class GracefulStop:
    """First Ctrl-C: set ``requested`` (the loop finishes its step, checkpoints, exits). Second: abort at once.

    Installs its SIGINT handler only in the main thread; ``restore`` puts the previous handler back.
    """

    def __init__(self, log=print):
        self.requested = False
        self._log = log
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self._log("Ctrl-C: finishing this step, then saving a checkpoint (Ctrl-C again to abort)")

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
