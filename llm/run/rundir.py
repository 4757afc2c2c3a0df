"""Run directory: config.json, metrics.jsonl, atomic checkpoints, resume.

Layout of ``output_dir``:
    config.json       the options as given (None stays None), written before step 0
    plan.json         what the run decided from them (``llm.run.plan``), written beside it
    metrics.jsonl     one JSON object per completed step, flushed per line
    checkpoint.pt     latest checkpoint (written to a temporary file, then renamed: atomic)
    samples.jsonl     a few decoded completions at every checkpoint
    final_model/      the trained model and tokenizer (transformers format)
    .lock             held (flock) by the trainer using the directory; the kernel drops it when the process
                      ends, however it ends, so a killed run never leaves a stale lock

A write that fails (a full disk, a read-only directory) raises a one-line error naming the file; the
checkpoint write goes to a temporary file that is removed, so the previous checkpoint stays intact.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import shutil
from pathlib import Path

import torch

from runkit.cli import RunError, first_line
from runkit.runio import MetricsWriter, atomic_write_text, write_config
from runkit.runio import read_metrics as read_rows

from llm.config import RESUMABLE_FIELDS, GRPOConfig
from llm.run.plan import PLAN_FILE, Plan, read_plan, resolve_plan

#: Options whose value the run resolves (``llm.run.plan``): a resume compares the resolved values.
DERIVED = ("max_completion_length", "reward_range")

__all__ = ["RunDir", "read_metrics", "RESUMABLE_FIELDS"]


def read_metrics(run_dir) -> list[dict]:
    """A run's metrics.jsonl as readers take it: its step rows, each marked void where the run stopped on a reward
    outside its declared range (``llm.tensors.metrics.fold_void``)."""
    from llm.tensors.metrics import fold_void

    return fold_void(read_rows(run_dir))


def tensor_bytes(obj) -> int:
    """Bytes of the tensor storages in a nested dict/list, each storage once (tied weights share one), which is
    what ``torch.save`` writes, give or take its index of a few kB."""
    storages: dict[int, int] = {}

    def visit(x):
        if isinstance(x, torch.Tensor):
            st = x.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
        elif isinstance(x, dict):
            for v in x.values():
                visit(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                visit(v)

    visit(obj)
    return sum(storages.values())


@contextlib.contextmanager
def writing(what: Path, during_run: bool = True):
    """Turn an OSError of writing ``what`` into one line: a ``RunError`` during the run (exit 1), a ``ValueError``
    naming output_dir before it starts (exit 2)."""
    try:
        yield
    except OSError as exc:
        reason = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
                  errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
                  errno.EPERM: "permission denied", errno.EFBIG: "the file is larger than allowed"}.get(
                      exc.errno, exc.strerror or str(exc))
        if during_run:
            raise RunError(f"cannot write {what}: {reason}; the last checkpoint in {what.parent} is intact "
                           "(free space or fix the directory, then run the same command to resume)") from None
        raise ValueError(f"output_dir: cannot write {what}: {reason}") from None


class RunDir:
    """A run directory, locked while a trainer uses it (``with RunDir(config) as run:``). ``plan``: the run's
    (``llm.run.plan``; None: resolved from ``config``)."""

    def __init__(self, config: GRPOConfig, plan: Plan | None = None):
        self.path = Path(config.output.output_dir)
        self.config = config
        self.plan = plan or resolve_plan(config)
        self.notice = ""  # what ``open`` found worth saying (a run it replaces)
        self._lock_fd: int | None = None

    def __enter__(self) -> "RunDir":
        self.lock()
        return self

    def __exit__(self, *exc) -> None:
        self.unlock()

    def lock(self) -> None:
        """Take the directory's lock, or refuse in one line if another process holds it."""
        lock_path = self.path / ".lock"
        with writing(lock_path, during_run=False):
            self.path.mkdir(parents=True, exist_ok=True)
            os.close(os.open(lock_path, os.O_WRONLY | os.O_CREAT, 0o644))
        fd = os.open(lock_path, os.O_RDONLY)  # held read-only: no file stays open for writing during the run
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ValueError(f"output_dir: {self.path} is in use by another trainer (pid {holder}); wait for it to "
                             "finish or use another output_dir") from None
        self._lock_fd = fd
        try:
            with writing(lock_path, during_run=False):
                lock_path.write_text(str(os.getpid()))
        except ValueError:
            self.unlock()
            raise

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoint.pt"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    def open(self) -> dict | None:
        """Create the directory, check a previous run is compatible (``incompatible``), write config.json and
        plan.json.

        Returns the checkpoint to resume from, or None for a fresh start.
        """
        with writing(self.path, during_run=False):
            self.path.mkdir(parents=True, exist_ok=True)
        ckpt = None
        if self.checkpoint_path.is_file():
            old_path = self.path / "config.json"
            if old_path.is_file():
                diff = self.incompatible(old_path)
                if diff:
                    raise ValueError(
                        f"output_dir: {self.path} holds a run with a different config ({', '.join(diff)}); "
                        "use a new output_dir or the same settings to resume")
            ckpt = self.load_checkpoint()
            with writing(self.metrics_path, during_run=False):
                self._truncate_metrics(ckpt["step"])
        elif (self.path / "config.json").is_file():  # a run stopped before its first checkpoint: nothing to resume
            try:
                diff = self.incompatible(self.path / "config.json")
            except ValueError:  # not a config this version reads
                diff = ["config.json"]
            self.notice = (f"{self.path} held a run that saved no checkpoint"
                           + (f", with other options ({', '.join(diff)})" if diff else "") + ": starting afresh")
        if ckpt is None:
            for name in ("metrics.jsonl", "samples.jsonl"):
                (self.path / name).unlink(missing_ok=True)
        with writing(self.path / "config.json", during_run=False):
            write_config(self.path, self.config.to_dict())  # flat: config.json keeps one level
        with writing(self.path / PLAN_FILE, during_run=False):
            atomic_write_text(self.path / PLAN_FILE, json.dumps(self.plan.to_dict(), indent=1, sort_keys=True))
        return ckpt

    def incompatible(self, old_path: Path) -> list[str]:
        """The options that differ from the stored run's (``old_path``: its config.json), but for those a resume may
        change (``RESUMABLE_FIELDS``); the values the run derives (``DERIVED``) are compared as its plan resolved
        them, so the task's budget of 6 and ``--max-completion-length 6`` are the same run."""
        new = json.loads(self.config.to_json())
        # A field the stored config lacks was added after that run started, which ran with its default; a renamed
        # value (improvement_lcb_method's t and cantelli) reads as its new name.
        stored = GRPOConfig.from_json_file(old_path)
        old = json.loads(stored.to_json())
        diff = [k for k in set(old) | set(new)
                if k not in RESUMABLE_FIELDS and k not in DERIVED and old.get(k) != new.get(k)]
        # a run written before plans recorded the budget and range it resolved in config.json (or, before the range
        # was an option, none): resolving its options gives them
        old_plan = read_plan(self.path) or resolve_plan(stored).to_dict()
        new_plan = self.plan.to_dict()
        diff += [k for k in DERIVED if old_plan.get(k) != new_plan[k]]
        return sorted(diff)

    def load_checkpoint(self) -> dict:
        """The checkpoint, loaded with ``weights_only=True`` (tensors and plain containers only: loading it
        runs no code from the file)."""
        try:
            return torch.load(self.checkpoint_path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same advice
            raise ValueError(f"output_dir: {self.checkpoint_path} cannot be loaded ({type(exc).__name__}: "
                             f"{first_line(exc)}); move it away to start afresh") from None

    def _truncate_metrics(self, next_step: int) -> None:
        """Keep exactly the rows of steps < next_step (rows written after the checkpoint are redone)."""
        if not self.metrics_path.is_file():
            return
        keep = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash
            if row.get("step", math.inf) < next_step:
                keep.append(line)
        atomic_write_text(self.metrics_path, "".join(k + "\n" for k in keep))

    def append_metrics(self, row: dict) -> None:
        with writing(self.metrics_path):
            MetricsWriter(self.path, fresh=False).write(row)

    def append_completions(self, rows: list[dict]) -> None:
        """``log_completions``: its rows (``llm.step.step.completion_row``) into completions.jsonl."""
        path = self.path / "completions.jsonl"
        with writing(path), path.open("a") as f:
            for row in rows:
                f.write(json.dumps(row, default=str) + "\n")

    def append_samples(self, rows: list[dict]) -> None:
        path = self.path / "samples.jsonl"
        with writing(path), path.open("a") as f:
            for row in rows:
                f.write(json.dumps(row, default=str) + "\n")

    def save_checkpoint(self, state: dict) -> None:
        """Write to checkpoint.pt.tmp, then rename over checkpoint.pt (atomic: a crash or a failed write at any
        point leaves the previous checkpoint or the new one, whole). Refused before writing when the disk has
        less free space than the checkpoint's tensors take."""
        tmp = self.checkpoint_path.with_name("checkpoint.pt.tmp")
        need = tensor_bytes(state)
        free = shutil.disk_usage(self.path).free
        if free < need:
            raise RunError(f"cannot write {self.checkpoint_path}: the checkpoint needs {need / 1e6:.1f} MB and the "
                           f"disk has {free / 1e6:.1f} MB free; the last checkpoint in {self.path} is intact (free "
                           "space, then run the same command to resume)")
        try:
            with writing(self.checkpoint_path), tmp.open("wb") as f:
                self._torch_save(state, f)
            with writing(self.checkpoint_path):
                os.replace(tmp, self.checkpoint_path)
        finally:
            tmp.unlink(missing_ok=True)

    def _torch_save(self, state: dict, f) -> None:
        """``torch.save`` into the open file ``f``, flushed to disk. torch's writer reports a failed write as a
        RuntimeError ("unexpected pos ..."): it becomes the OSError it was (ENOSPC when the disk is now full)."""
        try:
            torch.save(state, f)
        except RuntimeError as exc:
            if shutil.disk_usage(self.path).free < (1 << 20):
                raise OSError(errno.ENOSPC, "No space left on device") from None
            raise OSError(errno.EIO, first_line(exc)) from None
        f.flush()
        os.fsync(f.fileno())

    def save_final_model(self, model, tokenizer) -> None:
        path = self.path / "final_model"
        from llm.models.model import quiet_transformers

        with writing(path), quiet_transformers():
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
