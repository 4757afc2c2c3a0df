"""This project's readings inside verl 0.9.1's actor update: one line of a verl user's configuration,

    actor_rollout_ref.model.external_lib=llm.integrations.verl_watch

or, for a ``TrainingWorker`` built by hand (verl's Tinker-like API), one call on it:

    from llm.integrations.verl import watch
    watch(worker)

It observes and never trains. verl's ``TrainingWorker.train_mini_batch`` splits a rollout's batch into mini-batches
(``ppo_mini_batch_size``, ``ppo_epochs``) and runs one optimiser step on each (``train_batch``), whose loss function
``ppo_loss`` sees, per micro-batch, the policy's log-probs at the current weights and the batch's ``old_log_probs``
(the actor's forward at the weights the update began with), ``rollout_log_probs`` (the engine's own, with
``rollout.calculate_log_probs=True``), ``response_mask`` and ``uid`` (the prompt). The watcher wraps that loss
function (the loss, its gradient and its metrics are returned untouched; it keeps detached copies) and the worker's
``train_batch``, after which it adds one optimiser step's readings to the step's metrics, which verl prefixes with
``actor/`` and averages over the update's optimiser steps:

- ``lag``: optimiser steps since the update began (the mini-batch's index over the epochs); the ``k``-th optimiser
  step of an update trains on completions ``k`` steps stale;
- ``tv/pi_k_alpha`` ± ``tv/pi_k_alpha_se``, ``ess/pi_k_alpha``, ``is_weight_seq/*`` (alpha: the engine's
  ``rollout_log_probs`` where verl has them, else ``old_log_probs``), and ``tv/pi_k_alpha_lag{k}``,
  ``ess/pi_k_alpha_lag{k}`` for each lag, so the average over the update does not hide the stalest step;
- with ``rollout_log_probs``: ``tv/staleness`` (TV(pi_k, pi_old)), ``tv/engine_mismatch`` (TV(pi_old, alpha)), and
  at lag 0 the sync check ``sampling/logp_diff_mean|max`` with ``llm.train``'s warning.

In verl's synchronous trainer the rollout holds the weights the update begins with, so ``lag`` is alpha's full lag
and ``tv/engine_mismatch`` is the engine's own disagreement. In its asynchronous recipes (one-step off-policy, fully
async) the rollout is older than the update: ``tv/engine_mismatch`` then holds that staleness too, and the lag-0
sync check compares weights verl never synced (docs/integrations.md). The per-lag table (``LagTable``) is written to
``summary_file`` after every update. Each data-parallel rank reads its own shard (verl averages the ranks' metrics);
the summary file is rank 0's. Nothing the watcher computes can stop verl: an error in it is one line, and it stops
observing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from llm.integrations.readings import (LagTable, MicroBatch, WatchOptions, sequence_log_weights, step_metrics,
                                       watch_options)
from llm.integrations.watcher import PREFIX, guard, say_to, summary_path
from llm.step.monitors import Warnings

__all__ = ["watch", "install", "VerlWatcher", "OPTIONS_ENV"]

#: Environment variable with the options of ``install`` as a JSON object (``llm.integrations.verl_watch`` reads it in
#: each of verl's workers, which inherit it from the shell that starts Ray).
OPTIONS_ENV = "OFFPOLICY_GRPO_WATCH"
#: The attribute a watched worker carries its watcher under (``worker.offpolicy_watch.summary()``).
ATTRIBUTE = "offpolicy_watch"
#: verl's rollout dtype by default (``actor_rollout_ref.rollout.dtype``): the sync check's rule when not told.
VERL_ROLLOUT_DTYPE = "bfloat16"


#: The options the verl watcher reads; the others serve the held-out certificate, which needs generations the
#: actor's worker cannot draw (verl's rollout lives in other workers).
VERL_OPTIONS = ("engine_dtype", "summary_file", "log")


def verl_options(**options) -> WatchOptions:
    """``WatchOptions`` for verl (``VERL_OPTIONS``), in one line when wrong: an option of the held-out certificate
    given a value is refused, as the verl watcher would silently not use it."""
    try:
        opts = watch_options(**options)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"watch (verl): {exc}") from None
    if opts.heldout_prompts:
        raise ValueError("watch (verl): heldout_prompts: verl's rollout runs in its own workers, so the actor's "
                         "watcher cannot draw held-out completions; in-sample readings only (leave it at 0)")
    if opts.reward_range is not None:
        raise ValueError("watch (verl): reward_range: the declared range serves the held-out certificate, which the "
                         "verl watcher does not compute (leave it unset)")
    unused = sorted(k for k in options if k not in VERL_OPTIONS)
    if unused:
        raise ValueError(f"watch (verl): {', '.join(unused)}: options of the held-out certificate, which the verl "
                         f"watcher does not compute; it reads {', '.join(VERL_OPTIONS)}")
    return opts


def _labels(uids) -> np.ndarray:
    """Each completion's prompt label from verl's ``uid`` (one per prompt of a rollout), as int64."""
    out = np.empty(len(uids), dtype=np.int64)
    for i, uid in enumerate(uids):
        out[i] = int.from_bytes(hashlib.blake2b(str(uid).encode(), digest_size=8).digest(), "little", signed=True)
    return out


def micro_batch(lag: int, logp_k: torch.Tensor, old: torch.Tensor | None, rollout: torch.Tensor | None,
                mask: torch.Tensor, uids, first_label: int = 0) -> tuple[MicroBatch, int]:
    """One micro-batch's completions as verl trained on them, from padded (B, T) tensors: log pi_k (the loss's
    forward), ``old_log_probs``, ``rollout_log_probs`` (None where verl has none), the response mask and the uids
    (None: each completion its own prompt, labelled ``first_label`` on). alpha is the engine's where known, else the
    actor's at the update's start. A completion with no response token is not trained on, and one with a log-prob
    that is not finite (nan, -inf) on its response tokens leaves every reading alike; their count comes second."""
    alpha = rollout if rollout is not None else old
    if alpha is None:
        if lag > 0:
            raise RuntimeError(f"lag {lag} without old_log_probs or rollout_log_probs in verl's batch")
        alpha = logp_k
    mask = mask.float()
    on = mask > 0
    finite = torch.ones(mask.shape[0], dtype=torch.bool)
    for t in (logp_k, old, rollout):
        if t is not None:
            finite &= (torch.isfinite(t) | ~on).all(dim=1).cpu()
    has_tokens = (mask.sum(dim=1) > 0).cpu()
    keep = (has_tokens & finite).numpy()
    clean = lambda t: torch.where(on, t, torch.zeros_like(t)) if t is not None else None  # noqa: E731
    logp_k, old, rollout, alpha = clean(logp_k), clean(old), clean(rollout), clean(alpha)
    log_w_k = sequence_log_weights(logp_k, torch.nan_to_num(alpha), mask)[keep]
    log_w_gen = gap = None
    if rollout is not None and old is not None:
        log_w_gen = sequence_log_weights(torch.nan_to_num(old), torch.nan_to_num(rollout), mask)[keep]
        if lag == 0 and keep.any():
            rows = torch.from_numpy(keep)
            gap = (rollout[rows].detach().float().cpu(), old[rows].detach().float().cpu(), mask[rows].cpu())
    labels = np.arange(first_label, first_label + mask.shape[0], dtype=np.int64) if uids is None else _labels(uids)
    dropped = int((has_tokens & ~finite).sum())
    return MicroBatch(np.full(int(keep.sum()), lag), labels[keep], log_w_k, log_w_gen, gap), dropped


def padded(model_output, data) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor,
                                       list | None, float]:
    """From the arguments of verl's loss function: (log pi_k, old_log_probs, rollout_log_probs, response_mask, uids,
    temperature) as padded (B, T) float32 tensors on the host, as ``ppo_loss`` pads them."""
    from verl.workers.utils.padding import no_padding_2_padding

    logp_k = no_padding_2_padding(model_output["log_probs"].detach(), data)
    keys = [k for k in ("response_mask", "old_log_probs", "rollout_log_probs") if k in data.keys()]
    if "response_mask" not in keys:
        raise RuntimeError("verl's batch has no response_mask")
    tensors = data.select(*keys).to_padded_tensor()
    get = lambda k: tensors[k].detach().float().cpu() if k in keys else None  # noqa: E731
    uids = list(data["uid"]) if "uid" in data.keys() else None
    temperature = data["temperature"] if "temperature" in data.keys() else 1.0
    return logp_k.float().cpu(), get("old_log_probs"), get("rollout_log_probs"), get("response_mask"), uids, \
        float(temperature or 1.0)


class VerlWatcher:
    """One verl ``TrainingWorker``'s watcher (module docstring): ``loss`` wraps its loss function, ``train_batch`` and
    ``train_mini_batch`` wrap its optimiser step and its update."""

    def __init__(self, worker, options: WatchOptions):
        self.worker, self.options = worker, options
        self.say = say_to(options)
        self.engine_dtype = VERL_ROLLOUT_DTYPE if options.engine_dtype == "auto" else options.engine_dtype
        self.summary_path = summary_path(options.summary_file, Path.cwd(), "watch (verl)")  # the worker's cwd
        self.in_update = False
        self.direct_said = self.no_uid_said = False
        self.next_label = 0
        self.nonfinite = 0
        self.table = LagTable()
        self.parts: list[MicroBatch] = []
        self.warnings: Warnings | None = None
        self.lag = 0
        self.training = False
        self.updates = self.steps = 0
        self.stopped: str | None = None
        self.no_rollout_said = False

    def sync_rule(self) -> str:
        """The sync check's rule: bfloat16's when the engine or the actor computes in bfloat16 or float16 (verl's
        FSDP actor autocasts to its mixed precision's param_dtype, bfloat16 by default), float32's otherwise."""
        actor = getattr(getattr(self.worker, "engine", None), "_autocast_dtype", torch.bfloat16)
        half = actor in (torch.bfloat16, torch.float16) or self.engine_dtype in ("bfloat16", "float16")
        return "bfloat16" if half else "float32"

    # -- the wrapped methods ------------------------------------------------------------------------------------
    def loss(self, original):
        """verl's loss function, observed: its loss and metrics returned as they are."""
        @functools.wraps(original)
        def observed(*args, **kwargs):
            out = original(*args, **kwargs)
            if self.training and not self.stopped:
                self.guarded(self.record, kwargs.get("model_output", args[0] if args else None),
                             kwargs.get("data", args[1] if len(args) > 1 else None))
            return out
        observed.offpolicy_observed = original
        return observed

    def train_batch(self, original, data, *args, **kwargs):
        if not self.in_update and not self.direct_said:
            self.direct_said = True
            self.say(f"{PREFIX}train_batch called outside train_mini_batch: lag counts the optimiser steps since the "
                     "worker's last infer_batch (verl's forward of old_log_probs) or train_mini_batch")
        self.training, self.parts = True, []
        try:
            out = original(data, *args, **kwargs)
        finally:
            self.training = False
        self.guarded(self.end_step, out)
        self.lag += 1
        if not self.in_update:
            self.guarded(self.write_summary)
        return out

    def train_mini_batch(self, original, data, *args, **kwargs):
        self.lag, self.in_update = 0, True
        try:
            out = original(data, *args, **kwargs)
        finally:
            self.in_update = False
        self.updates += 1
        self.guarded(self.write_summary)
        return out

    def infer_batch(self, original, data, *args, **kwargs):
        """verl's forward without a step (``compute_log_prob``: a new batch's old_log_probs): the lag starts again."""
        out = original(data, *args, **kwargs)
        if not self.in_update:
            self.lag = 0
        return out

    # -- observations -------------------------------------------------------------------------------------------
    def guarded(self, fn, *args):
        """Run an observation; an error in it is one line and ends the watching, never verl's training."""
        return guard(self, lambda: f"update {self.updates}, optimiser step {self.steps}", fn, *args)

    def record(self, model_output, data) -> None:
        logp_k, old, rollout, mask, uids, temperature = padded(model_output, data)
        if self.warnings is None:
            self.warnings = Warnings(self.sync_rule(), temperature)
        if uids is None and not self.no_uid_said:
            self.no_uid_said = True
            self.say(f"{PREFIX}verl's batch has no uid: each completion counts as its own prompt, so the standard "
                     "errors assume independent completions (a prompt's group is correlated: they run low)")
        if rollout is None and not self.no_rollout_said:
            self.no_rollout_said = True
            self.say(f"{PREFIX}verl's batch has no rollout_log_probs (actor_rollout_ref.rollout.calculate_log_probs="
                     "True adds them): alpha is read as old_log_probs, the actor's forward of the rollout's weights, "
                     "which leaves out the engine's own mismatch")
        part, dropped = micro_batch(self.lag, logp_k, old, rollout, mask, uids, self.next_label)
        self.next_label += mask.shape[0]
        if dropped:
            if not self.nonfinite:
                self.say(f"{PREFIX}optimiser step {self.steps}: {dropped} completion(s) with a log-prob that is not "
                         "finite (the engine's, old_log_probs or the policy's) left out of every reading (counted in "
                         "the summary's nonfinite_completions)")
            self.nonfinite += dropped
        self.parts.append(part)

    def end_step(self, out) -> None:
        """One optimiser step's readings into the step's metrics (on the ranks that return verl's output)."""
        parts, self.parts = self.parts, []
        if not parts or out is None:
            return
        from verl.utils import tensordict_utils as tu

        row, by_lag = step_metrics(parts)
        self.table.add(by_lag)
        for lag, entry in by_lag.items():
            for key in ("tv/pi_k_alpha", "ess/pi_k_alpha"):
                if key in entry["metrics"]:
                    row[f"{key}_lag{lag}"] = entry["metrics"][key]
        synced = bool(row.get("lag") == 0 and "sampling/logp_diff_max" in row)
        self.warnings.see({"step": self.steps, **row}, synced=synced,
                          write=lambda line: self.say(PREFIX + line))
        metrics = tu.get(out, "metrics")
        for key, value in row.items():
            metrics[key] = float(value)
        self.steps += 1

    def summary(self) -> dict:
        """The run's readings so far: the per-lag table, the updates and optimiser steps seen, whether it stopped."""
        return {"host": "verl", "updates": self.updates, "steps": self.steps, "per_lag": self.table.rows(),
                "nonfinite_completions": self.nonfinite, "stopped": self.stopped}

    def write_summary(self) -> None:
        rank = int(os.environ.get("RANK", "0"))
        if self.summary_path is None or rank != 0:
            return
        try:
            self.summary_path.parent.mkdir(parents=True, exist_ok=True)
            self.summary_path.write_text(json.dumps(self.summary(), indent=1, default=float))
        except OSError as exc:
            self.summary_path = None
            self.say(f"{PREFIX}could not write the summary ({type(exc).__name__}: {exc}); "
                     "worker.offpolicy_watch.summary() still has it")


def _training_worker_class():
    try:
        from verl.workers.engine_workers import TrainingWorker
    except ImportError as exc:
        raise ImportError(f"watch (verl): verl 0.9.1's engine workers do not import ({exc})") from exc
    return TrainingWorker


def watch(worker, **options):
    """Attach this project's readings to a verl ``TrainingWorker`` (or a worker holding one as ``.actor``, as verl's
    ``ActorRolloutRefWorker`` does) and return it (module docstring; the options are ``WatchOptions``'s
    ``engine_dtype``, ``summary_file`` and ``log``). A wrong option or a worker of another kind is one line."""
    opts = verl_options(**options)
    TrainingWorker = _training_worker_class()
    target = worker.actor if not isinstance(worker, TrainingWorker) and isinstance(getattr(worker, "actor", None),
                                                                                    TrainingWorker) else worker
    if not isinstance(target, TrainingWorker):
        raise TypeError(f"watch (verl): expected a verl TrainingWorker, got {type(worker).__name__}")
    if getattr(target, ATTRIBUTE, None) is not None:
        raise ValueError("watch (verl): this worker is already watched")
    _attach(target, VerlWatcher(target, opts))
    return worker


def _attach(worker, watcher: VerlWatcher) -> None:
    for name in ("train_batch", "train_mini_batch", "infer_batch"):
        original = getattr(worker, name)
        setattr(worker, name, functools.wraps(original)(functools.partial(getattr(watcher, name), original)))
    set_loss_fn = worker.set_loss_fn

    @functools.wraps(set_loss_fn)
    def observed_set_loss_fn(loss_fn):
        return set_loss_fn(watcher.loss(loss_fn) if loss_fn is not None else loss_fn)

    worker.set_loss_fn = observed_set_loss_fn
    if getattr(worker, "loss_fn", None) is not None:
        worker.loss_fn = watcher.loss(worker.loss_fn)
    setattr(worker, ATTRIBUTE, watcher)
    where = f"; summary: {watcher.summary_path}" if watcher.summary_path else ""
    watcher.say(f"{PREFIX}(verl) logging lag, tv/pi_k_alpha, ess/pi_k_alpha and, with rollout_log_probs, "
                f"tv/staleness, tv/engine_mismatch and the sync check into actor/ metrics{where}")


def install(**options) -> None:
    """Watch every ``TrainingWorker`` of this process that is given a loss function from now on (verl's actor; its
    reference and forward-only workers get none). Options as ``watch``'s; installing twice is a no-op."""
    opts = verl_options(**options)
    TrainingWorker = _training_worker_class()
    if getattr(TrainingWorker.set_loss_fn, "offpolicy_installed", False):
        return
    original = TrainingWorker.set_loss_fn

    @functools.wraps(original)
    def set_loss_fn(self, loss_fn):
        policy = getattr(getattr(self, "config", None), "model_type", "language_model") != "value_model"  # no critic
        if getattr(self, ATTRIBUTE, None) is None and loss_fn is not None and policy:
            _attach(self, VerlWatcher(self, opts))
            return self.set_loss_fn(loss_fn)  # the instance's own, which observes
        return original(self, loss_fn)

    set_loss_fn.offpolicy_installed = True
    TrainingWorker.set_loss_fn = set_loss_fn


def options_from_env() -> dict:
    """``install``'s options from ``OFFPOLICY_GRPO_WATCH`` (a JSON object; unset or empty: the defaults)."""
    text = os.environ.get(OPTIONS_ENV, "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{OPTIONS_ENV}: not a JSON object ({exc.msg} at character {exc.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{OPTIONS_ENV}: must be a JSON object of options, got {text!r}")
    return value
