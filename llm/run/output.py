"""What a run says: the start-up arithmetic, and ``Output``: the run directory, the trackers, the callbacks and the
progress bar of rank 0 (every other rank gets ``SilentOutput``). The step's own monitors (the phase timer, the exact
J, the reward range, the warnings) are ``llm.step.monitors``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from grpo_theory.estimators import certificate_abstains, certificate_floor

from llm.run.rundir import RunDir, read_metrics
from llm.step.step import TABLE_COLUMNS
from llm.tasks import TokenizedTask

StepCallback = Callable[[int, dict], None]
__all__ = ["Output", "SilentOutput", "StepCallback", "arithmetic", "as_text", "shorten", "sync_line"]


def arithmetic(config, n_params: int, n_trained: int, device, sampler_name: str, task: TokenizedTask,
               model_path: str) -> list[str]:
    """The derived arithmetic of the run, printed once at start-up."""
    P, G, v = config.sampling.prompts_per_step, config.sampling.num_generations, config.sync.sync_period
    model, machine, heldout = config.model, config.machine, config.diagnostics.heldout_prompts
    lora = (f", LoRA r={model.lora_r} on {' '.join(model.lora_target_modules)}: {n_trained / 1e6:.3f}M trained"
            if model.use_peft else "")
    t = task.task
    modes = ((" (continuous batching)" if config.sampling.use_transformers_continuous_batching else "")
             + (" (static cache: its own compiled decode loop, llm.sampling.static_decode)"
                if config.sampling.cache_implementation == "static" else "")
             + (", padding-free passes" if machine.padding_free else ""))
    lines = [f"off-policy GRPO: model {model_path} ({n_params / 1e6:.2f}M params{lora}, {machine.dtype}, {device}), "
             f"sampler {sampler_name}{modes}, task {t.name} ({len(t.prompts)} training prompts, {len(t.test_prompts)} "
             f"test{', exact J' if t.has_exact_j and config.diagnostics.exact_j else ''})"]
    if heldout:
        lines.append(f"  held-out: {heldout} extra prompts x G={G} per step, drawn independently, "
                     "never in the loss: estimates free of in-sample bias (heldout/*)")
        diag = config.diagnostics
        if heldout == 1:
            lines.append("  held-out: 1 prompt gives the estimates but no standard errors (heldout/*_se need 2): nan")
        if (why := certificate_abstains(heldout, method=diag.improvement_lcb_method)) is not None:
            lines.append(f"  certificate: {why}")
        elif diag.improvement_lcb_method == "betting":
            cap = diag.improvement_lcb_weight_cap
            floor = certificate_floor(heldout, diag.improvement_lcb_level, -1.0, cap - 1.0)
            reach = (f"from {heldout} prompts it certifies no step whose estimates average below {floor:.3g} x the "
                     "range" if floor != float("inf") else f"{heldout} prompts can never certify a step at this level "
                     "(too few bets to reach it; the run's eval/improvement_lcb still certifies the run)")
            lines.append(f"  certificate (heldout/improvement_lcb, level {diag.improvement_lcb_level:g}): betting bound "
                         f"on the held-out estimates with weights capped at W={cap:g}, each in [-1, {cap - 1:g}] x the "
                         f"reward range; {reach} (docs/theory.md, §8.6)")
        else:
            lines.append(f"  certificate: {diag.improvement_lcb_method} has no guaranteed level (docs/theory.md, §8.6)")
    lines.append(
        f"  per step: {P} prompts x G={G} = {config.sampling.completions_per_step} completions, "
        f"<= {config.sampling.completions_per_step * config.completion_budget} generated tokens, "
        f"i={config.optim.num_iterations} optimiser steps of {config.gradient_accumulation_steps} micro-batch(es) "
        f"(per_device_train_batch_size {config.micro_batch_size}"
        f"{'; more, shorter passes where sequences of similar length save padding' if machine.group_by_length else ''}"
        f"{', gradient checkpointing' if machine.gradient_checkpointing else ''}); " + sync_line(config))
    if config.sync.async_generation and config.sync.sync_policy == "divergence":
        lines.append("  asynchronous generation: each step is generated while the previous one trains; a sync serves "
                     "the next step, when this step's TV estimate plus the last step's drift exceeds the budget")
    elif config.sync.async_generation:
        lines.append(f"  asynchronous generation: each window is generated while the previous one trains, from the "
                     f"weights synced one window earlier (alpha lags {v} to {2 * v - 1} steps after the first window)")
    return lines


def sync_line(config) -> str:
    """What the sync policy will do over the run, for the start-up lines."""
    if config.sync.sync_policy == "divergence":
        return (f"sync when the held-out TV(pi_k, alpha) estimate exceeds {config.sync.tv_budget} or the lag would "
                f"exceed {config.sync.max_lag} (at most {config.max_steps - 1} syncs over {config.max_steps} steps)")
    return (f"v={config.sync.sync_period}: {config.num_syncs} weight syncs over {config.max_steps} steps (saves "
            f"{config.max_steps - config.num_syncs})")


class Output:
    """What rank 0 writes and says: the run directory (metrics, checkpoints, samples, the final model), the trackers
    and callbacks that see every row, log lines, lines above the progress bar (``write``) and the bar itself."""

    def __init__(self, config, run: RunDir, start: int, log, callbacks: Sequence[StepCallback] = ()):
        self.config, self.run, self.path, self.log, self.callbacks = config, run, run.path, log, tuple(callbacks)
        self.start = start
        # a bar redraws itself with carriage returns: in a terminal only; in a file or a CI log, lines instead
        self.show_bar = config.output.progress and sys.stderr.isatty()
        self.bar = None  # drawn at the first step, below the start-up lines

    def write(self, line: str) -> None:
        """A line for the user whatever ``log`` does (warnings), above the bar when one is drawn."""
        from tqdm.auto import tqdm

        tqdm.write(line)

    def _bar(self):
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.config.max_steps, initial=self.start, dynamic_ncols=True, unit="step")
        return self.bar

    def kept_rows(self) -> list[dict]:
        return read_metrics(self.path)

    def append(self, row: dict) -> None:
        """The step's row into metrics.jsonl."""
        self.run.append_metrics(row)

    def announce(self, row: dict) -> None:
        """Hand the step's row (written, and checkpointed when due) to every callback, the trackers among them, and
        show it."""
        for cb in self.callbacks:
            cb(row["step"], row)
        step = row["step"]
        if self.show_bar:
            exact = {"J": f"{row['j/pi_new']:.3f}", "dJ": f"{row['improvement']:+.4f}"} if "j/pi_new" in row else {}
            bar = self._bar()
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward']:.3f}", **exact, tv=f"{row['tv/pi_k_alpha']:.3f}", lag=row["lag"])
        elif step % self.config.output.logging_steps == 0 or step + 1 == self.config.max_steps:
            parts = [f"step {step}: lag {row['lag']}", f"reward {row['reward']:.3f}",
                     f"tv(pi_k,alpha) {row['tv/pi_k_alpha']:.4f}"]
            if "j/pi_new" in row:
                parts.append(f"J {row['j/pi_new']:.4f}")
            for key in ("insample/bound_est/lower_tight", "heldout/bound_est/lower_tight", "improvement", "eval/j"):
                if key in row:
                    parts.append(f"{key} {row[key]:+.4f}")
            self.log("  ".join(parts))

    def completions(self, step: int, rows: list[dict]) -> None:
        """``log_completions``: every completion of the step in completions.jsonl and to every callback with a
        ``table`` method (the trackers); on the console, as TRL prints them, ``num_completions_to_print`` of them (0:
        all) drawn at random (seeded by the run's seed and the step, shown in the step's order), a line each with its
        reward, each reward function's value and its advantage."""
        n = self.config.output.num_completions_to_print
        shown = range(len(rows)) if not n or n >= len(rows) else sorted(
            np.random.default_rng([self.config.seed, step]).choice(len(rows), n, replace=False))
        self.write(f"step {step}: {len(shown)} of {len(rows)} completions (reward (each reward function's value) "
                   f"advantage | prompt | completion)")
        for r in (rows[j] for j in shown):
            parts = ", ".join(f"{k} {'None' if r[k] is None else format(r[k], '.3f')}" for k in r
                              if k not in TABLE_COLUMNS)
            parts = f" ({parts})" if parts else ""
            self.write(f"  {r['reward']:+.3f}{parts} {r['advantage']:+.3f} | {shorten(r['prompt'], 80)} | "
                       f"{shorten(as_text(r['completion']), 150)}")
        self.run.append_completions(rows)
        for cb in self.callbacks:
            if hasattr(cb, "table"):
                cb.table(step, rows)

    def save_checkpoint(self, state: dict, samples: list[dict]) -> None:
        self.run.save_checkpoint(state)
        if samples:
            self.run.append_samples(samples)

    def save_final_model(self, model, tokenizer) -> None:
        self.run.save_final_model(model, tokenizer)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def as_text(completion) -> str:
    """A completion as one text: itself, or an agent's episode (TRL's list of messages) as each message in turn,
    ``role: content``, a turn's calls as ``name(arguments)`` and a tool's answer as ``name -> content``, joined by
    `` / ``."""
    if not isinstance(completion, list):
        return str(completion)
    parts = []
    for m in completion:
        calls = " ".join(f"{c['function']['name']}({arguments(c['function'].get('arguments', ''))})"
                         for c in m.get("tool_calls") or [])
        if m.get("role") == "tool":
            parts.append(f"{m.get('name', 'tool')} -> {m.get('content', '')}")
        else:
            parts.append(f"{m.get('role', '?')}: " + " ".join(x for x in (str(m.get("content") or ""), calls) if x))
    return " / ".join(parts)


def arguments(args) -> str:
    """A call's arguments as written in Python: ``a=347, b=28`` (as given where they are not a dict)."""
    return ", ".join(f"{k}={v!r}" for k, v in args.items()) if isinstance(args, dict) else str(args)


def shorten(text, width: int) -> str:
    """A prompt or completion on one line of at most ``width`` characters (a conversation as its last message)."""
    if isinstance(text, list):
        text = text[-1]["content"] if text else ""
    one = " ".join(str(text).split())
    return one if len(one) <= width else one[:width - 3] + "..."


class SilentOutput(Output):
    """The output of a rank other than 0: it takes every call and writes nothing (rank 0 speaks for the run)."""

    def __init__(self, path: Path):
        self.path, self.callbacks = path, ()
        self.log = self.write = lambda *a: None

    def kept_rows(self) -> list[dict]:
        return []

    def append(self, row: dict) -> None:
        pass

    def announce(self, row: dict) -> None:
        pass

    def save_checkpoint(self, state: dict, samples: list[dict]) -> None:
        pass

    def completions(self, step: int, rows: list[dict]) -> None:
        pass

    def save_final_model(self, model, tokenizer) -> None:
        pass

    def close(self) -> None:
        pass
