"""One step of Algorithm 1 (docs/theory.md, §7): ``run_step``, its phases in the order they run:

    sync        at a window's first step, alpha <- pi_theta                     (``Weights.sync``; the clock: ``llm.step.clock``;
                                                                                 divergence policy: when the TV says so)
    rollout     G completions per prompt (training and held-out) from alpha     (``llm.step.rollout``; asynchronously the next
                                                                                 window is generated while this one trains)
    score       verifiable rewards                                              (``llm.step.score.score``)
    advantages  group whitening and the zero-variance mask                      (``llm.step.score.advantages``)
    behaviour   log alpha: the sampler's, recomputed where needed               (``llm.step.behaviour.alpha_logprobs``)
    reference   log pi_ref                                                      (beta > 0)
    optimise    i steps on the clipped off-policy objective (+ beta KL)         (``llm.optim.update.optimise``)
    diagnose    TV distances, Theorem 1's estimated terms, the exact J          (``llm.step.diagnose``, ``llm.step.monitors``)
    evaluate    every ``eval_steps`` steps, on the test prompts                 (``llm.evaluation.policy_eval``)
    log         one row of metrics.jsonl (returned to the loop), completions    (``StepOutput``)

The loop, the checkpoints and the set-up around the steps are ``llm.run.trainer``. Every knob is read where it acts:
``sync_period`` (v) by the clock, ``num_iterations`` (i) in ``llm.optim.update``. Under torchrun every rank runs
each phase over its share of the prompts; rank 0 alone generates, scores and writes (``llm.models.distributed``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from llm.config import GRPOConfig
from llm.tensors.passes import Passes
from llm.evaluation import EvalSpec, evaluate
from llm.evaluation.policy_eval import improvement_bounds
from llm.optim import Objective, Schedule, optimise
from llm.sampling import Rollout, TransformersSampler
from llm.step.behaviour import Behaviour, alpha_logprobs, sampler_logprobs
from llm.step.clock import SyncClock, Tick
from llm.step.diagnose import Heldout, diagnose, heldout_before_update, heldout_estimates, insample_estimates
from llm.step.monitors import DeclaredRange, ExactJ, PhaseTimer, Warnings
from llm.step.rollout import RolloutWindow, StepRollout
from llm.step.score import Groups, Scored, VariedGroups, advantages, group_batch, reward_metrics, score
from llm.step.weights import Weights
from llm.tasks import TokenizedTask

#: Completions of the last step written to samples.jsonl at each checkpoint (the first of each of as many groups).
SAMPLES_KEPT = 4


class StepOutput(Protocol):
    """What a step writes to besides its row: a line of text (a warning) and the completions it logs."""

    def write(self, text: str) -> None: ...

    def completions(self, step: int, rows: list[dict]) -> None: ...


@dataclass
class Run:
    """What the steps of a run share: the config, the weights, the task, the clock, the passes' and the loss's
    settings, the rollouts, the monitors and the output (``StepOutput``: the run directory's writer, built by
    ``llm.run.trainer.start_run``)."""

    config: GRPOConfig
    weights: Weights
    task: TokenizedTask
    clock: SyncClock
    passes: Passes
    objective: Objective
    evaluation: EvalSpec
    rollouts: RolloutWindow
    exact: ExactJ
    ranges: DeclaredRange
    warnings: Warnings
    output: StepOutput
    start: int
    device: torch.device
    schedule: Schedule
    sampler_class: type  # the sampler's class (the run's plan): what it is, on every rank
    eval_initial: dict = field(default_factory=dict)  # the first evaluation's per-prompt accuracies (the certificate's)
    eval_looks: int = 0  # evaluations after the first so far: the run certificate's looks, each spending its own level


def own_sampler(policy: torch.nn.Module, task: TokenizedTask, config: GRPOConfig):
    """The evaluation's sampler where no engine holds the policy: ``generate`` on the policy itself, a micro-batch of
    sequences at a time, running episodes for an agent task."""
    sampler = TransformersSampler(policy, task.eos, task.tokenizer.pad_token_id, copy=False,
                                  batch_size=config.machine.per_device_train_batch_size)
    if task.agent is None:
        return sampler
    from llm.agents.episodes import AgentSampler

    return AgentSampler(sampler, task.agent)


def run_step(run: Run, step: int) -> tuple[dict, list[dict]]:
    """One step of Algorithm 1 (the module docstring's phases); returns its metrics row and a few of its samples."""
    config, weights, passes, task = run.config, run.weights, run.passes, run.task
    G = config.sampling.num_generations
    tick, timer = run.clock.at(step), PhaseTimer()
    row = {"step": step, "lag": tick.lag, **run.clock.metrics(tick)}
    stale = 0 <= config.sync.max_staleness < tick.lag  # dropped: no update from this step's completions
    if config.evaluation.eval_steps and step == 0 and weights.ranks.joins_rank0:  # the policy before any update
        with timer("eval"):
            row.update({k.replace("eval/", "eval_initial/"): v for k, v in run_evaluation(run, 0).items()})
    step_rollout = sync_and_rollout(run, tick, timer, row)
    prompt_idx, roll = step_rollout.prompt_idx, step_rollout.rollout
    with timer("score"):
        scored = score(task, prompt_idx, roll, G, weights.ranks)
    if config.sampling.filter_groups:  # dynamic sampling: more rounds from alpha until P groups whose rewards vary
        prompt_idx, roll, scored = dynamic_sampling(run, step, prompt_idx, roll, scored, timer, row)
    with timer("score"):
        row.update(reward_metrics(scored.parts))
        groups = advantages(scored.rewards, config.objective.variance_eps, config.objective.scale_rewards,
                            config.objective.mask_zero_std_groups, drop_all=stale)
        row["dropped_stale"] = float(stale)
        batch = group_batch(task, prompt_idx, roll, G, run.device)
    recompute = config.objective.behaviour_logprobs == "recompute"
    check = tick.starts_window and config.diagnostics.verify_sync  # the first step served by newly synced weights
    with timer("behaviour"):  # at lag 0 alpha's weights are pi_k's: its log-probs come from the optimiser's pass
        from_sampler = sampler_logprobs(roll, batch)
        behaviour = Behaviour(from_sampler) if tick.lag == 0 else alpha_logprobs(
            passes, weights.alpha, batch, from_sampler, recompute=recompute, check=check,
            keep_hidden=config.diagnostics.tv_diagnostics)
    with timer("reference"):
        logp_ref = passes.logprobs(weights.ref, batch).logp if weights.ref is not None else None
    with timer("diagnostics"):
        run.exact.before_update(step)
        heldout = heldout_phase(run, step_rollout, tick, scored, row)
    log_alpha = behaviour.log_alpha(prefer_sampler=not recompute)  # None at lag 0: pi_k's, from the optimiser
    finished = (np.array([len(c) > 0 and c[-1] == task.eos for c in roll.completion_ids])
                if config.objective.mask_truncated_completions else None)  # truncated completions leave the loss
    row["learning_rate"] = run.schedule.rate(step)
    with timer("optimise"):
        optimised = optimise(passes, run.objective, weights.policy, weights.optimizer, batch, groups.advantages,
                             groups.keep, log_alpha, logp_ref, behaviour.dists, sequence_keep=finished,
                             before_step=lambda it: run.schedule.apply(weights.optimizer, step, it))
    if tick.lag == 0 and (recompute or from_sampler is None or check or config.diagnostics.tv_diagnostics):
        behaviour = Behaviour(from_sampler, optimised.pi_k.logp, passes.dists(weights.alpha, optimised.pi_k.hidden))
        log_alpha = behaviour.log_alpha(prefer_sampler=not recompute)
    elif tick.lag == 0 and log_alpha is None:
        log_alpha = optimised.pi_k.logp
    with timer("diagnostics"):
        reward_range = run.ranges.range
        eps, diagnostics = config.objective.variance_eps, config.diagnostics
        row.update(diagnose(batch, scored, groups, roll, task.eos, log_alpha, behaviour, optimised, eps, reward_range))
        if diagnostics.insample_diagnostics and step % diagnostics.insample_diagnostics_steps == 0:
            row.update(insample_estimates(passes, weights.policy, batch, scored.rewards, log_alpha,
                                          optimised.pi_k.logp, behaviour.dists, eps, reward_range))
        if heldout is not None:
            row.update(heldout_estimates(passes, weights.policy, heldout, eps, reward_range,
                                         diagnostics.improvement_lcb_level, diagnostics.improvement_lcb_method,
                                         diagnostics.improvement_lcb_weight_cap, config.completion_budget,
                                         certify=run.ranges.certifies))
        row.update(run.exact.after_update(step))
    every = config.evaluation.eval_steps
    evaluate_now = every and ((step + 1) % every == 0 or step + 1 == config.max_steps)
    if evaluate_now and weights.ranks.joins_rank0:
        with timer("eval"):  # the updated policy pi_{k+1}
            row.update(run_evaluation(run, step + 1))
    run.warnings.see(row, tick.starts_window, run.output.write)
    row.update(timer.seconds)
    row.update(perf_metrics(run, batch, row))
    rewards = scored.rewards.reshape(-1)
    shown = roll.prompts_shown  # an environment's reset appended an observation: the prompt its episode saw
    entry = lambda j: {"step": step,  # noqa: E731  completion j
                       "prompt": shown[j] if shown is not None else task.task.prompts[prompt_idx[j // G]],
                       "completion": scored.texts[j], "reward": float(rewards[j])}
    samples = [entry(j) for j in range(0, rewards.size, G)]
    if config.output.log_completions and step % config.output.logging_steps == 0:
        run.output.completions(step, [completion_row(entry(j), roll, scored, groups, j) for j in range(rewards.size)])
    return row, samples[:SAMPLES_KEPT]


#: The columns of a ``log_completions`` row that are not a reward function's value (``completion_row``).
TABLE_COLUMNS = ("step", "prompt", "completion", "reward", "advantage")


def completion_row(entry: dict, roll: Rollout, scored: Scored, groups: Groups, j: int) -> dict:
    """``log_completions``'s row of completion ``j``, TRL's table: its step, prompt and completion (an agent's episode
    whole, as TRL's list of messages, the calls and the tools' answers included), its reward, each reward function's
    value by the function's name (None where it gave None; ``rewards/<name>`` where the name is one of these columns),
    and its advantage."""
    if roll.messages is not None:
        entry = entry | {"completion": roll.messages[j]}
    for name, values in scored.parts.items():
        value = float(values[j])
        entry[f"rewards/{name}" if name in TABLE_COLUMNS else name] = None if value != value else value
    return entry | {"advantage": float(groups.advantages.reshape(-1)[j])}


def dynamic_sampling(run: Run, step: int, prompt_idx: list[int], roll, scored, timer: PhaseTimer, row: dict):
    """DAPO's dynamic sampling (verl's ``filter_groups``): keep the groups whose rewards vary, and generate rounds
    of P more prompts from alpha until P are kept or ``max_num_gen_batches`` rounds ran (0: no limit). Returns the
    step's prompts, completions and scores (the first round's when no group varied: the zero-variance mask then
    leaves nothing to learn); logs the rounds, the kept share and the reward of every group drawn
    (``VariedGroups.metrics``)."""
    sampling, ranks = run.config.sampling, run.weights.ranks
    G, rounds = sampling.num_generations, sampling.max_num_gen_batches
    varied = VariedGroups(sampling.prompts_per_step, G)
    varied.take(prompt_idx, roll, scored)
    while not varied.enough and (not rounds or varied.rounds < rounds):
        with timer("generate"):
            extra = ranks.from_main(lambda: run.rollouts.extra(step, varied.rounds))
        with timer("score"):
            varied.take(extra.prompt_idx, extra.rollout, score(run.task, extra.prompt_idx, extra.rollout, G, ranks))
    row.update(varied.metrics())
    return varied.result() if varied.prompt_idx else (prompt_idx, roll, scored)


def sync_and_rollout(run: Run, tick: Tick, timer: PhaseTimer, row: dict) -> StepRollout:
    """The sync and the step's completions. Synchronously a window is generated from the weights synced at its
    first step; asynchronously from the weights synced one window earlier, so its completions are taken before the
    sync, and the next window starts generating from the weights just synced."""
    weights, rollouts, asynchronous = run.weights, run.rollouts, run.clock.asynchronous
    resumed = tick.step == run.start and run.start > 0

    def completions() -> StepRollout:
        with timer("generate"):
            return weights.ranks.from_main(lambda: rollouts.get(tick.step))

    if tick.ahead:  # the divergence policy, one step ahead: this step's completions come from alpha's successor
        if resumed:
            weights.serve(weights.alpha_next)  # (the restore sent alpha's)
        step_rollout = completions()
        if tick.starts_window and not tick.syncs and tick.step > 0:
            weights.advance()  # the weights synced at the last step generated this one (a sync now does it too)
        if tick.syncs:
            with timer("sync"):
                weights.sync()
            row.update(sync_metrics(weights.sampler, timer.seconds["time/sync"]))
        if weights.ranks.main:
            rollouts.prefetch(tick.step + 1)
        row.update(rollouts.call_metrics())
        return step_rollout
    if asynchronous:
        if resumed and tick.starts_window:
            weights.serve(weights.alpha_next)  # this window's weights (the restore sent alpha's)
        step_rollout = completions()
    if tick.syncs:  # at a window's first step, sync
        with timer("sync"):
            weights.sync()
        row.update(sync_metrics(weights.sampler, timer.seconds["time/sync"]))
    if not asynchronous:
        step_rollout = completions()
    elif tick.starts_window or resumed:
        if resumed and not tick.starts_window:
            weights.serve(weights.alpha_next)  # resumed inside a window: the next one comes from alpha's successor
        if weights.ranks.main:
            rollouts.prefetch(tick.next_window)
    row.update(rollouts.call_metrics())
    return step_rollout


def sync_metrics(sampler, seconds: float) -> dict[str, float]:
    """``sync/mb`` and ``time/sync_mb_per_s`` of a sync, for samplers that report the bytes they moved."""
    nbytes = getattr(sampler, "last_sync_bytes", 0)
    return {"sync/mb": nbytes / 1e6, "time/sync_mb_per_s": nbytes / 1e6 / max(seconds, 1e-9)} if nbytes else {}


def perf_metrics(run: Run, batch, row: dict) -> dict[str, float]:
    """The update's throughput, TRL's names and definitions: the tokens forwarded and back-propagated by the optimise
    phase (every real token of the step's sequences, each of the i optimiser steps) per second of that phase
    (``perf/forwarded_tok_s_fwd_bwd``), and on an accelerator of known peak, in bfloat16, the model FLOPs utilisation
    over that phase and over the whole step (``perf/mfu_fwd_bwd``, ``perf/mfu_wall_clock``;
    ``llm.tensors.metrics.mfu``, at the step's token-weighted mean sequence length)."""
    from llm.tensors.metrics import mfu, peak_flops, step_seconds, training_flops_per_token

    lengths = batch.attention_mask.sum(dim=1).double()
    tokens = float(lengths.sum()) * run.config.optim.num_iterations
    seconds = row.get("time/optimise", 0.0)
    if not tokens or not seconds:
        return {}
    out = {"perf/forwarded_tok_s_fwd_bwd": tokens / seconds}
    device = run.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    peak = peak_flops(name, run.config.machine.dtype)
    if peak is not None:
        flops = training_flops_per_token(run.weights.policy.config, float((lengths ** 2).sum() / lengths.sum()))
        world = run.weights.ranks.world
        out["perf/mfu_fwd_bwd"] = mfu(flops, tokens, seconds, peak, world)
        out["perf/mfu_wall_clock"] = mfu(flops, tokens, step_seconds(row), peak, world)
    return out


def heldout_phase(run: Run, step_rollout: StepRollout, tick: Tick, scored: Scored, row: dict) -> Heldout | None:
    """Score the held-out prompts' completions and take their log alpha and log pi_k (before the update); check every
    training and held-out reward against the declared range (``DeclaredRange``: or, undeclared, widen the range seen).
    None without held-out prompts."""
    config, weights, task, G = run.config, run.weights, run.task, run.config.sampling.num_generations
    heldout = None
    if config.diagnostics.heldout_prompts:
        idx, roll = step_rollout.heldout_idx, step_rollout.heldout
        heldout_rewards = score(task, idx, roll, G, weights.ranks).rewards
        batch = group_batch(task, idx, roll, G, run.device)
        heldout = heldout_before_update(run.passes, weights.policy, weights.alpha, batch, heldout_rewards, roll,
                                        tick.lag, config.objective.behaviour_logprobs == "recompute")
    run.ranges.see(tick.step, scored.rewards, None if heldout is None else heldout.rewards, row, run.output.write,
                   scored.parts, scored.texts)
    return heldout


def run_evaluation(run: Run, policy_step: int) -> dict[str, float]:
    """``eval/*`` of the current policy (after ``policy_step`` updates) on the test prompts. In a step's row ``eval/*``
    is the policy after that step's update; row 0 also holds ``eval_initial/*``, the policy before any. The run's
    sampler generates: a vLLM engine or server gets the policy's weights for it and alpha's back afterwards (before
    the first update it holds the policy already); a generation in flight finishes first. Under FSDP every rank calls
    it (to gather the weights into rank 0's whole copy) and rank 0 evaluates. From the second evaluation on, the row
    also holds the run's certificate (``eval/improvement_lcb``, ``eval/improvement_lcb_greedy``: the improvement since
    the first evaluation, paired per prompt, valid at every evaluation at once)."""
    config, weights = run.config, run.weights
    engine = run.sampler_class.holds_own_weights  # every rank alike (under FSDP every rank calls this)
    if engine and weights.ranks.main:
        run.rollouts.wait()  # the background generation uses the sampler's weights until it is done
    with weights.policy_in_sampler(engine, swap=policy_step > 0) as policy:
        if not weights.ranks.main:
            return {}
        per_prompt = {}
        out = evaluate(policy, run.task, run.evaluation, seed=config.seed + policy_step,
                       pad=run.task.tokenizer.pad_token_id, precision=run.passes.precision,
                       exact=config.diagnostics.exact_j, per_prompt=per_prompt,
                       sampler=weights.sampler if engine else own_sampler(policy, run.task, config))
    for name, values in per_prompt.items():  # the test prompts' rewards too lie in the declared range; the step named
        run.ranges.check(max(policy_step - 1, 0), f"test ({name})", values)  # is the row's (policy_step: updates)
    if policy_step == 0:
        run.eval_initial = per_prompt
    elif run.eval_initial:  # the run's certificate, its level spent over the evaluations: the look-th after step 0
        run.eval_looks += 1  # counted, kept in the checkpoint: a resumed run never spends a look's level twice
        out.update(improvement_bounds(per_prompt, run.eval_initial, config.diagnostics.improvement_lcb_level,
                                      run.eval_looks, run.ranges.declared_pair))
    return out
