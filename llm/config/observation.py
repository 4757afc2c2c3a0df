"""What a run shows: the diagnostics of Theorem 1's terms, the test-set evaluation, the run directory and logs."""

from __future__ import annotations

from typing import Annotated, Literal

from grpo_theory.estimators import DEFAULT_LCB_METHOD, IMPROVEMENT_WEIGHT_CAP, LcbMethod, lcb_method

from pydantic import field_validator, model_validator

from llm.config.fields import (ONE_NAME_IS_A_TUPLE, ConfigGroup, MAX_TEMPERATURE, MIN_TEMPERATURE, none_reads, require,
                               resumable)


class DiagnosticsConfig(ConfigGroup):
    """The estimates of TV distances, the bound's terms and the improvement, and the checks on alpha."""

    heldout_prompts: int = 0
    """Extra prompts per step, drawn independently of the training prompts (from the same pool, so some may also be
    trained on in that step), whose G completions from alpha never enter the loss. The TV distances, the bound's
    terms and the improvement are also estimated on them (``heldout/*``), free of the in-sample bias of estimates on
    the prompts and completions pi_{k+1} was fitted to: the TV and improvement estimates are unbiased, the
    surrogate and the bound carry a stated bias of their 1/s~ (docs/theory.md, §8.2 and §8.5). 0: off."""
    improvement_lcb_level: float = 0.95
    """Confidence level of ``heldout/improvement_lcb``, the one-sided lower confidence bound on the step's improvement
    J(pi_{k+1}) - J(pi_k) from the held-out prompts: a positive value certifies the step improved J at this level,
    without Theorem 1 (docs/theory.md, §8.6). Each step's certificate holds at this level on its own; across a run,
    ``python -m llm report`` counts the steps certified under a guarantee for the whole run (e-BH on ``heldout/improvement_e``)."""
    improvement_lcb_method: LcbMethod = DEFAULT_LCB_METHOD
    """The certificate's bound: betting (Waudby-Smith and Ramdas's betting bound on the capped estimates, whose range
    is known, so its level is a theorem for every distribution of the rewards and weights: docs/theory.md, §8.6;
    the smallest change it can certify from P prompts is printed at start-up); t_unguaranteed or
    cantelli_unguaranteed (a Student-t or Cantelli bound from the sample's own spread, on the unbiased estimates: no
    level holds over every distribution, and they certify harms that a rare point mass carries). The earlier names t
    and cantelli are accepted for the last two, with a warning."""
    improvement_lcb_weight_cap: float = IMPROVEMENT_WEIGHT_CAP
    """W of the betting certificate: the held-out estimate it bounds caps every importance weight at W, so each
    prompt's value lies in [-1, W - 1] (units of the reward range) and its expectation is at most the improvement
    (the cap's bias is one-sided: docs/theory.md, §8.6). Larger W: less bias where weights are large, a wider range
    (a larger smallest certifiable change)."""
    verify_sync: bool = True
    """Right after every sync, recompute log alpha with the trainer and compare with the sampler's
    (sampling/logp_diff_*; a loud warning if they disagree). One forward pass per v steps."""
    tv_diagnostics: bool = False
    """Log Monte-Carlo estimates of the chain-rule upper bound on TV from full next-token distributions
    (``*_chain_ub_est``): a forward pass of alpha's weights at every step with lag > 0. Off by default (the
    unbiased sequence-level ``tv/*`` estimates need no extra pass)."""
    insample_diagnostics: bool = False
    """Log the in-sample estimates of the terms involving pi_{k+1} (``insample/*``): one more forward pass of the
    updated policy over the training batch per step. They are biased upwards (pi_{k+1} was fitted to these samples;
    docs/theory.md, §8), hence off by default; ``--heldout-prompts`` gives estimates free of that bias (the TV and improvement ones
    unbiased; docs/theory.md, §8.2). The pi_k quantities
    (TV(pi_k, alpha), the lag penalty, the sync check) need no extra pass and are always logged."""
    insample_diagnostics_steps: int = 1
    """With ``insample_diagnostics``: compute them at every this many steps only (steps k with k % N == 0), so
    their forward pass costs 1/N of a pass per step. Each computed row is the same estimate as at N = 1; what is
    lost is rows: a mean of ``insample/*`` over a run then rests on 1/N as many steps (N times the variance of
    that mean from step-to-step noise)."""
    exact_j: bool = True
    """When the task allows it (the built-in task), log the exact J(pi_k), J(pi_{k+1}) over the training
    prompts and the exact improvement (one forward pass over the accepted completions per step)."""
    exact_j_steps: int = 1
    """With ``exact_j``: measure it at every this many steps only (steps k with k % N == 0) and at the last step, so
    its passes cost about 2/N of a pass per step (J(pi_k) of a measured step is the previous step's J(pi_{k+1}) only
    where that step was measured too). The other rows carry no ``j/*`` or ``improvement``; what a run's first and last
    rows say (J before and after) is the same at every N. ``python -m llm report`` compares the estimates with the exact
    improvement on the measured steps only and says so; the signal check (``llm.warning``) needs every step: N = 1."""

    @field_validator("improvement_lcb_method")
    @classmethod
    def _lcb_method(cls, value):
        return lcb_method(value)  # an older name as today's

    @model_validator(mode="after")
    def _rules(self):
        require(self, self.heldout_prompts >= 0, "heldout_prompts", "must be >= 0")
        require(self, 0.5 <= self.improvement_lcb_level < 1, "improvement_lcb_level", "must be in [0.5, 1)")
        require(self, self.improvement_lcb_weight_cap > 1, "improvement_lcb_weight_cap",
                "must be > 1 (the capped estimates lie in [-1, W - 1]: W <= 1 could never certify)")
        require(self, self.insample_diagnostics_steps >= 1, "insample_diagnostics_steps", "must be >= 1")
        require(self, self.exact_j_steps >= 1, "exact_j_steps", "must be >= 1")
        return self


class EvaluationConfig(ConfigGroup):
    """The test prompts' evaluation: how often, and sampled how."""

    eval_steps: Annotated[int, none_reads(0)] = 0
    """Evaluate the policy on the test prompts every this many steps, before the first and after the last (0: never):
    exact J (built-in task), sampled accuracy, pass@k and maj@k, and greedy accuracy (``eval/*``)."""
    num_generations_eval: int | None = None
    """Completions per test prompt for the sampled accuracy and ``eval/pass@k``, ``eval/maj@k`` (k = 1, 2, 4, ... up
    to it; TRL's name and default: None is num_generations. Before 2026-12-07 the default was 8 whatever
    num_generations was)."""
    eval_temperature: float = -1.0
    """Sampling temperature of the evaluation (-1: the training temperature)."""
    eval_top_p: float = -1.0
    """top_p of the evaluation (-1: the training top_p)."""
    eval_top_k: int = -1
    """top_k of the evaluation (-1: the training top_k; 0: off)."""
    eval_min_p: float = -1.0
    """min_p of the evaluation (-1: the training min_p)."""

    @model_validator(mode="after")
    def _rules(self):
        require(self, self.eval_steps >= 0, "eval_steps", "must be >= 0")
        require(self, self.num_generations_eval is None or self.num_generations_eval >= 1, "num_generations_eval",
                "must be >= 1, or None for num_generations")
        require(self, self.eval_temperature == -1 or MIN_TEMPERATURE <= self.eval_temperature <= MAX_TEMPERATURE,
                "eval_temperature", f"must lie in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], or be -1 (training's)")
        require(self, self.eval_top_p == -1 or 0 < self.eval_top_p <= 1, "eval_top_p",
                "must lie in (0, 1], or be -1 (training's)")
        require(self, self.eval_top_k >= -1, "eval_top_k", "must be >= 0, or -1 (training's)")
        require(self, self.eval_min_p == -1 or 0 <= self.eval_min_p < 1, "eval_min_p",
                "must lie in [0, 1), or be -1 (training's)")
        return self


class OutputConfig(ConfigGroup):
    """The run directory, its checkpoints, and what is printed and tracked."""

    output_dir: str = resumable("runs/arithmetic")
    """Run directory: config.json, metrics.jsonl, checkpoints, samples. Re-using it resumes the run."""
    logging_steps: int = resumable(1)
    """Print a progress line every this many steps where no progress bar is shown (``--no-progress``, or output to a
    file or a CI log); metrics.jsonl always gets every step."""
    log_completions: bool = False
    """Every logging_steps steps, show the step's prompts, completions (an agent's episode whole: turns, calls and the
    tools' answers), rewards, each reward function's value and advantages: a table on the console, rows in
    <output_dir>/completions.jsonl and a table in the trackers (TensorBoard text, W&B table; TRL's name)."""
    num_completions_to_print: Annotated[int, none_reads(0)] = 0
    """Completions of a step that log_completions prints on the console, drawn at random as TRL draws them (TRL's
    name; 0: all); completions.jsonl and the trackers get every completion."""
    save_steps: int = resumable(50)
    """Checkpoint every this many steps (and at the end, and on Ctrl-C). 0: only at the end."""
    report_to: Annotated[tuple[Literal["none", "tensorboard", "wandb", "trackio"], ...], ONE_NAME_IS_A_TUPLE] = \
        resumable(("none",))
    """Experiment trackers that get every metrics.jsonl row under the same names, step for step (TRL's name;
    several allowed: ``--report-to tensorboard wandb``). Each needs its package (an optional install); TensorBoard
    writes to <output_dir>/tensorboard. ``llm.run.trackers`` has the details."""
    progress: bool = resumable(True)
    """Show a tqdm progress bar when stderr is a terminal (a file or a CI log gets a line every ``logging_steps``
    instead of the bar's redraws). Off: lines everywhere."""

    @model_validator(mode="after")
    def _rules(self):
        require(self, self.logging_steps >= 1, "logging_steps", "must be >= 1")
        require(self, self.num_completions_to_print >= 0, "num_completions_to_print", "must be >= 0 (0: all)")
        require(self, self.save_steps >= 0, "save_steps", "must be >= 0")
        require(self, bool(self.output_dir), "output_dir", "must not be empty")
        require(self, len(self.report_to) >= 1 and ("none" not in self.report_to or len(self.report_to) == 1),
                "report_to", "give 'none' alone, or one or more of tensorboard, wandb, trackio")
        return self
