"""What every host trainer's watcher shares (``llm.integrations.trl.TRLWatcher`` for TRL's GRPOTrainer,
``llm.integrations.async_grpo.AsyncWatcher`` for its AsyncGRPOTrainer): the wrapping of a host's methods on the one
instance, the guard that turns an error of ours into one line, one optimiser step's readings into the host's own
metrics sink before it logs, the per-lag table and the run's summary."""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from pathlib import Path

from llm.integrations.readings import LagTable, MicroBatch, RangeWatch, WatchOptions, heldout_metrics, step_metrics
from llm.step.monitors import Warnings

#: The attribute a watched trainer carries its watcher under (``trainer.offpolicy_watch.summary()``).
ATTRIBUTE = "offpolicy_watch"
PREFIX = "offpolicy-grpo watch: "


def say_to(options: WatchOptions):
    """Where the watcher's lines go: the user's ``log``, or standard error above any progress bar (tqdm's, TRL's)."""
    if options.log is not None:
        return options.log
    from tqdm import tqdm

    return lambda line: tqdm.write(line, file=sys.stderr)


def summary_path(summary_file: str | None, base: Path, who: str) -> Path | None:
    """``summary_file`` as a path (a relative one under ``base``), refused in one line, ``who``'s, when it cannot be
    written there (a directory in its place, a file in its path, a folder without write permission); None: no file."""
    if not summary_file:
        return None
    path = Path(summary_file).expanduser()
    if not path.is_absolute():
        path = base / path
    if path.is_dir():
        raise ValueError(f"{who}: summary_file: {str(path)!r} is a directory")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ValueError(f"{who}: summary_file: {str(path)!r} cannot be written ({str(parent)!r} is "
                         f"{'not a directory' if not parent.is_dir() else 'not writable'})")
    return path


def guard(observer, where, fn, *args):
    """``fn(*args)`` for an ``observer`` (its ``stopped`` and ``say``), unless it has stopped: an error in it is one
    line naming ``where()`` (the host's step), and the observer stops; the host's training never pays for it."""
    if observer.stopped:
        return None
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the host must never pay for the observer
        observer.stopped = f"{type(exc).__name__}: {exc}"
        observer.say(f"{PREFIX}stopped observing at {where()} ({observer.stopped}); training goes on unobserved")
        return None


class Watcher:
    """One host trainer's watcher: ``wrap`` its methods, ``attach`` the step callback, and at every optimiser step
    ``end_step`` turns the micro-batches ``parts`` recorded into its readings (``heldout`` and ``sampler`` stay None
    where a host has no held-out draw). Subclasses say which methods they wrap and how they record."""

    def __init__(self, trainer, options: WatchOptions, sync_dtype: str):
        self.trainer, self.options = trainer, options
        self.say = say_to(options)
        self.summary_path = self.check_summary_path()
        self.parts: list[MicroBatch] = []
        self.table = LagTable()
        self.ranges = RangeWatch(options.reward_range)
        self.warnings = Warnings(sync_dtype, float(getattr(trainer.args, "temperature", 1.0) or 1.0))  # the host's
        self.heldout = None
        self.sampler = None
        self.stopped: str | None = None
        self.steps = 0

    def check_summary_path(self) -> Path | None:
        """Where the run's summary goes (``summary_file``: relative to the host's output directory), refused in one
        line now, before training, when it cannot be written there (``summary_path``)."""
        return summary_path(self.options.summary_file, Path(self.trainer.args.output_dir), "watch")

    def wrap(self, *names: str) -> None:
        """Each named method of the trainer instance, wrapped by this watcher's ``_<name>`` (the original first)."""
        for name in names:
            original = getattr(self.trainer, name)
            handler = getattr(self, "_" + name.lstrip("_"))
            setattr(self.trainer, name, functools.wraps(original)(functools.partial(handler, original)))

    def attach(self, what: list[str]) -> None:
        """The step callback, the trainer's ``offpolicy_watch`` attribute, and the start line (``what`` it logs)."""
        from transformers import TrainerCallback

        watcher = self

        class _Step(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                watcher.guarded(watcher.end_step, state.global_step - 1)

            def on_train_end(self, args, state, control, **kwargs):
                watcher.guarded(watcher.end_train)

        self.trainer.add_callback(_Step())
        setattr(self.trainer, ATTRIBUTE, self)
        rng = self.options.reward_range
        self.say(PREFIX + "logging " + ", ".join(what) + "; reward range "
                 + (f"[{rng[0]:g}, {rng[1]:g}] (declared)" if rng else "not declared (the certificate abstains)"))

    def guarded(self, fn, *args):
        """Run an observation; an error in it is one line and ends the watching, never the host's training."""
        return guard(self, lambda: f"step {self.trainer.state.global_step}", fn, *args)

    def gathered(self, parts: list[MicroBatch]) -> list[MicroBatch]:
        """Every rank's micro-batches (TRL's processes each train on their own rows)."""
        if self.trainer.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            return gather_object(parts)
        return parts

    def end_step(self, step: int) -> None:
        """Step k's readings into the host's metrics, before it logs them."""
        parts, self.parts = self.gathered(self.parts), []
        if not parts:
            return
        row, by_lag = step_metrics(parts)
        self.table.add(by_lag)
        if self.heldout is not None:
            held = self.heldout
            logp_new = self.sampler.logprobs(held.input_ids, held.attention_mask, held.extra["logits_to_keep"])
            row.update(heldout_metrics(held, logp_new, self.options, self.ranges))
            held.logp_k = logp_new  # pi_{k+1} is the next step's pi_k
            self.ranges.record(step, row.get("heldout/improvement_lcb", math.nan))
            row["heldout/lag"] = float(step - held.step)
        if self.ranges.void_step is not None:
            row["bound/certificates_void"] = 1.0
        row["bound/range_declared"] = float(self.ranges.declared is not None)
        synced = bool(row.get("lag", 1) == 0 and "sampling/logp_diff_max" in row)
        self.warnings.see({"step": step, **row}, synced=synced,
                          write=lambda line: self.say(PREFIX + line))
        sink = self.trainer._metrics["train"]
        for key, value in row.items():
            sink[key].append(float(value))
        self.steps += 1

    def summary(self) -> dict:
        """The run's readings: the per-lag table (``LagTable``), the certificates under the declared range, and
        whether the watcher stopped (why)."""
        return {"steps": self.steps, "per_lag": self.table.rows(), "certificates": self.ranges.summary(),
                "stopped": self.stopped}

    def end_train(self) -> None:
        s = self.summary()
        self.say(PREFIX + "readings by lag\n" + self.table.markdown())
        c = s["certificates"]
        if self.sampler is not None:
            self.say(f"{PREFIX}certificates: {c['steps_certified']} of {c['steps_logged']} steps certified"
                     + (f"; void from step {c['void_from_step']}" if c["void_from_step"] is not None else "")
                     + ("" if c["declared"] else " (no declared range: abstained)"))
        if self.summary_path is not None and self.trainer.accelerator.is_main_process:
            try:
                self.summary_path.parent.mkdir(parents=True, exist_ok=True)
                self.summary_path.write_text(json.dumps(s, indent=1, default=float))
            except OSError as exc:
                self.say(f"{PREFIX}could not write the summary to {str(self.summary_path)!r} "
                         f"({type(exc).__name__}: {exc}); it was printed above")
