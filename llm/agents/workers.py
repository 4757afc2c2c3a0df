"""Where a user's agent code runs: one worker thread per episode, one deadline per round (``Workers``).

An episode's environment is made, reset, called and asked for its reward on one worker, so state bound to a thread
(an sqlite connection opened in ``reset``, a client made in ``__init__``) works in every call. The episodes of a
round run their calls concurrently, each on its own worker, and the round waits for all of them until one deadline:
a round with k hung calls costs one timeout, not k. A coroutine (an ``async def`` tool, ``reset`` or ``get_reward``)
is run to completion on the worker's own event loop, which lives as long as the worker, so an async client made in
one call is usable in the next.

A call still running at the deadline is abandoned: its worker is set aside, and its episode goes on without it (the
call's answer is an error) until the call returns, when the worker rejoins the pool. A call that never returns keeps
its thread; the threads are daemons, so they never keep the process from exiting, and ``abandoned`` counts them. An
idle worker's thread ends after ``IDLE_SECONDS`` without work, and ``close`` (the run's end) ends them all.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass


#: Seconds an idle worker waits for work before its thread ends (the pool makes a new one when it needs one).
IDLE_SECONDS = 30.0


class Worker:
    """A daemon thread running jobs in order, with its own event loop for coroutines (made at the first one)."""

    def __init__(self, pool: "Workers", index: int):
        self.pool, self.jobs = pool, queue.SimpleQueue()
        self.busy = 0  # jobs submitted and not finished
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._loop, name=f"agent-worker-{index}", daemon=True)
        self.thread.start()

    def submit(self, fn: Callable, *args, **kwargs) -> Future:
        future: Future = Future()
        with self.pool.lock:
            self.busy += 1
        self.jobs.put((future, fn, args, kwargs))
        return future

    def _loop(self) -> None:
        try:
            while True:
                try:
                    job = self.jobs.get(timeout=IDLE_SECONDS)
                except queue.Empty:
                    if self.pool.retire(self):
                        return
                    continue
                if job is None:
                    return
                self._run(*job)
        finally:
            if self.loop is not None:
                self.loop.close()

    def _run(self, future: Future, fn: Callable, args, kwargs) -> None:
        try:
            out = fn(*args, **kwargs)
            if inspect.isawaitable(out):
                self.loop = self.loop or asyncio.new_event_loop()
                out = self.loop.run_until_complete(_awaited(out))
            future.set_result(out)
        except BaseException as exc:  # noqa: BLE001 - the user's code: its exception is its result
            future.set_exception(exc)
        finally:
            self.pool.finished(self)


async def _awaited(awaitable):
    return await awaitable


@dataclass
class Outcome:
    """What one call gave: its value, or the exception it raised, or ``timed_out``."""

    value: object = None
    error: BaseException | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out


class Workers:
    """A pool of ``Worker`` threads, handed out one per episode (``acquire``) and given back after it (``release``);
    ``run`` submits a round's calls and waits for them with one deadline of ``timeout`` seconds (0: none)."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.lock = threading.Lock()
        self.idle: list[Worker] = []
        self.set_aside: set[Worker] = set()  # abandoned at a deadline; back in the pool when their call returns
        self.made = 0
        self.closed = False

    @property
    def abandoned(self) -> int:
        """Workers still running a call abandoned at a deadline."""
        with self.lock:
            return len(self.set_aside)

    def acquire(self) -> Worker:
        with self.lock:
            if self.idle:
                return self.idle.pop()
            self.made += 1
            index = self.made
        return Worker(self, index)

    def release(self, worker: Worker) -> None:
        """Give back an episode's worker; one still running an abandoned call is set aside until it returns."""
        with self.lock:
            if worker.busy:
                self.set_aside.add(worker)
            elif self.closed:
                worker.jobs.put(None)
            elif worker not in self.idle:
                self.idle.append(worker)

    def finished(self, worker: Worker) -> None:
        with self.lock:
            worker.busy -= 1
            if not worker.busy and worker in self.set_aside:
                self.set_aside.discard(worker)
                if self.closed:
                    worker.jobs.put(None)
                else:
                    self.idle.append(worker)

    def retire(self, worker: Worker) -> bool:
        """An idle worker's thread ends after ``IDLE_SECONDS`` without work (True: it left the pool)."""
        with self.lock:
            if worker in self.idle and not worker.busy:
                self.idle.remove(worker)
                return True
            return False

    def close(self) -> None:
        """End every idle worker's thread, and each abandoned one's when its call returns."""
        with self.lock:
            self.closed = True
            idle, self.idle = self.idle, []
        for worker in idle:
            worker.jobs.put(None)

    def run(self, calls: list[tuple[Worker, Callable, tuple]]) -> list[Outcome]:
        """Each (worker, fn, args) submitted at once (a worker runs its own in order), then waited for until one
        deadline; the outcomes in order."""
        futures = [worker.submit(fn, *args) for worker, fn, args in calls]
        wait_futures(futures, timeout=self.timeout or None)
        out = []
        for future in futures:
            if not future.done():
                out.append(Outcome(timed_out=True))
            elif future.exception() is not None:
                out.append(Outcome(error=future.exception()))
            else:
                out.append(Outcome(future.result()))
        return out

