"""Algorithm 1 (docs/theory.md, §7) on a causal language model: ``train(config)``.

``run_loop`` runs the steps; ``run_step`` is one step, its phases in the order they run:

    sync        at a window's first step, alpha <- pi_theta                     (``Weights.sync``; the clock: ``llm.step.clock``;
                                                                                 divergence policy: when the TV says so)
    rollout     G completions per prompt (training and held-out) from alpha     (``llm.step.rollout``; asynchronously the next
                                                                                 window is generated while this one trains)
    score       verifiable rewards                                              (``llm.step.phases.score``)
    advantages  group whitening and the zero-variance mask                      (``llm.step.phases.advantages``)
    behaviour   log alpha: the sampler's, recomputed where needed               (``llm.step.phases.alpha_logprobs``)
    reference   log pi_ref                                                      (beta > 0)
    optimise    i steps on the clipped off-policy objective (+ beta KL)         (``llm.optim.update.optimise``)
    diagnose    TV distances, Theorem 1's estimated terms, the exact J          (``llm.step.phases``, ``llm.run.monitors``)
    evaluate    every ``eval_steps`` steps, on the test prompts                 (``llm.evaluation.evaluate``)
    log         one row of metrics.jsonl, trackers, callbacks                   (``llm.run.monitors.Output``)
    checkpoint  every ``save_steps`` steps, at the end and on Ctrl-C

Every knob is read where it acts: ``sync_period`` (v) by the clock, ``num_iterations`` (i) in ``llm.optim.update``,
``ref_sync_steps`` at the reference reset. Under torchrun every rank runs each phase over its share of the prompts;
rank 0 alone generates, scores and writes (``llm.models.distributed``).
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from runkit.cli import RunError
from runkit.host_memory import CEILING as FREED_MEMORY_CEILING
from runkit.host_memory import keep_freed_memory, release_freed_memory
from runkit.interrupt import GracefulStop

from llm.config import GRPOConfig
from llm.core.batch import make_batch
from llm.core.logprobs import check_head, check_packing
from llm.core.passes import Passes
from llm.evaluation import EvalSpec, evaluate
from llm.evaluation.test_set import improvement_bounds
from llm.models import pretrained
from llm.models.distributed import SINGLE, Ranks, close_ranks, collective_failure, init_ranks
from llm.models.model import add_lora, compile_blocks, load_policy, resolve_device
from llm.models.vml import resolve_vml_dispatch
from llm.optim import Objective, Schedule, optimise
from llm.rewards import RewardContext
from llm.run.monitors import ExactJ, Output, PhaseTimer, RangeTracker, SilentOutput, StepCallback, Warnings, arithmetic
from llm.run.rundir import RunDir
from llm.run.trackers import Trackers, check_trackers
from llm.sampling import max_model_len, resolved_sampler
from llm.step.clock import SyncClock, Tick
from llm.step.phases import (Behaviour, Heldout, VariedGroups, advantages, alpha_logprobs, diagnose, group_batch,
                     heldout_before_update, heldout_estimates, insample_estimates, reward_metrics, sampler_logprobs,
                     score)
from llm.step.rollout import RolloutWindow, StepRollout
from llm.step.weights import Weights
from llm.tasks import TokenizedTask
from llm.tasks.procedural import GeneratorSpec
from llm.tasks.sources import load_task

#: Completions of the last step written to samples.jsonl at each checkpoint (the first of each of as many groups).
SAMPLES_KEPT = 4


def train(config: GRPOConfig, log=print, callbacks: Sequence[StepCallback] = ()) -> Path:
    """Run Algorithm 1 with ``config``; returns the run directory. Resumes if it holds a checkpoint.

    ``callbacks`` are called as ``cb(step, row)`` after each step's metrics row is written (``row``: that row),
    after the trackers of ``report_to``; a callback with an ``on_setup(weights)`` method is also handed the
    run's ``llm.step.weights.Weights`` (policy, alpha, pi_ref, the sampler) before step 0.
    """
    # torchrun: this process's rank (one rank with the in-process engine runs as one process); else one process
    ranks = init_ranks(resolve_device(config.machine.device), config.machine.fsdp,
                       group_of_one=resolved_sampler(config) != "vllm")
    finished = False
    try:
        path = train_main(config, ranks, log, callbacks) if ranks.main else train_rank(config, ranks)
        finished = True
        return path
    except RuntimeError as exc:  # FSDP's gathers and reduce-scatters are not wrapped in Ranks.collective()
        if not (ranks.active and collective_failure(exc)):
            raise
        raise ranks.fault(exc) from None
    finally:
        close_ranks(ranks, finished)


def train_main(config: GRPOConfig, ranks: Ranks, log, callbacks: Sequence[StepCallback]) -> Path:
    """The one process, or rank 0 of several: it owns the run directory, the sampler and the trackers."""
    with RunDir(config) as run:  # locked: a second trainer on the same output_dir is refused
        ckpt = run.open()  # writes config.json before step 0
        ranks.barrier()  # the other ranks read the checkpoint once the run directory is ready
        if ckpt is not None and ckpt["step"] >= config.max_steps:
            log(f"{run.path} already holds a finished run of {ckpt['step']} steps (raise --max-steps to continue it)")
            return run.path
        check_trackers(config)  # a tracker whose package is missing stops the run before the model loads
        weights, task, model_path = setup(config, ranks, log)
        try:
            for cb in callbacks:
                getattr(cb, "on_setup", lambda w: None)(weights)
            trackers = Trackers(config, run.path)
            output = Output(config, run, ckpt["step"] if ckpt else 0, log, (trackers, *callbacks))
            try:
                run_loop(config, weights, task, model_path, ckpt, output)
            finally:
                trackers.close()
        finally:
            weights.close()  # also on an error: a server's weight-transfer group, an engine's memory
            if config.machine.keep_freed_memory:  # the run's memory back to the system: the process may go on
                del weights
                gc.collect()
                release_freed_memory()
    return run.path


def train_rank(config: GRPOConfig, ranks: Ranks) -> Path:
    """A rank other than 0: the same steps on its share of each step's prompts; it writes nothing."""
    path = Path(config.output.output_dir)
    ranks.barrier()
    ckpt_path = path / "checkpoint.pt"
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True) if ckpt_path.is_file() else None
    if ckpt is not None and ckpt["step"] >= config.max_steps:
        return path
    weights, task, model_path = setup(config, ranks, lambda *a: None)
    run_loop(config, weights, task, model_path, ckpt, SilentOutput(path))
    return path


def setup(config: GRPOConfig, ranks: Ranks = SINGLE, log=print) -> tuple[Weights, TokenizedTask, str]:
    """Load the task, the policy and its tokenizer, then the weights around it (``Weights.build``: the sampler on
    rank 0 holding alpha = the policy, the copies, the optimiser)."""
    resolve_vml_dispatch()  # before any float operator runs on several threads (llm.models.vml)
    if config.machine.num_threads:
        torch.set_num_threads(config.machine.num_threads)
    if config.machine.keep_freed_memory:
        keep_freed_memory()
    torch.manual_seed(config.seed)
    device = resolve_device(config.machine.device)
    if ranks.active:
        if device.type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        log(f"trainer processes: {ranks.world} ({ranks.backend}{', FSDP' if ranks.fsdp else ''}), "
            f"this one on {device}")
        if resolved_sampler(config) == "vllm":
            raise ValueError("sampler: the in-process vLLM engine sets up torch.distributed for itself and cannot "
                             "share torchrun's process group; under torchrun use --sampler server (vLLM in its own "
                             "process) or --sampler transformers")
    data = config.data
    task = load_task(data.dataset, data.reward_fn, data.eval_dataset, data.reward_funcs, data.reward_weights,
                     data.answer_check, GeneratorSpec.from_config(data), RewardContext.from_config(config))
    if not ranks.main:
        ranks.barrier()  # rank 0 builds the built-in model's files first
    model_path = pretrained.resolve_model_path(config.model.model_name_or_path, log=log)
    if ranks.main:
        ranks.barrier()
    policy, tokenizer = load_policy(model_path, device, config.model.trust_remote_code,
                                    config.machine.attn_implementation)
    policy.train()
    if config.machine.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.model.use_peft:
        policy = add_lora(policy, config.model.lora_r, config.model.lora_alpha, config.model.lora_target_modules)
    if config.machine.compile:
        log(f"compile: {compile_blocks(policy)} decoder blocks compile at their first passes (minutes on a CPU)")
    bound = task.bind(tokenizer, config.data.chat_template)  # prompt tokens once; indexed by prompt every step
    probe = make_batch(bound.prompt_ids[:2], [p[:3] for p in bound.prompt_ids[:2]], tokenizer.pad_token_id, device)
    check_head(policy, probe, config.sampling.temperature)  # the chunked log-probs know this output layer
    if config.machine.padding_free:  # the attention keeps packed sequences apart
        check_packing(policy, probe, config.sampling.temperature)
    if config.diagnostics.exact_j and bound.max_accepted_length > config.sampling.max_completion_length:
        raise ValueError(f"max_completion_length: the task's accepted completions need {bound.max_accepted_length} "
                         f"tokens, more than {config.sampling.max_completion_length}; raise it or pass --no-exact-j")
    longest = max(map(len, bound.prompt_ids + bound.test_prompt_ids))
    max_model_len(policy, config, longest)  # the longest prompt plus a whole completion fit the model's positions
    weights = Weights.build(config, ranks, policy, tokenizer, model_path, bound.prompt_ids[:2], longest)
    return weights, bound, model_path


@dataclass
class Run:
    """What the steps of a run share: the config, the weights, the task, the clock, the passes' and the loss's
    settings, the rollouts, the monitors and the output."""

    config: GRPOConfig
    weights: Weights
    task: TokenizedTask
    clock: SyncClock
    passes: Passes
    objective: Objective
    rollouts: RolloutWindow
    exact: ExactJ
    ranges: RangeTracker
    warnings: Warnings
    output: Output
    start: int
    device: torch.device
    schedule: Schedule
    eval_initial: dict = field(default_factory=dict)  # the first evaluation's per-prompt accuracies (the certificate's)


def run_loop(config: GRPOConfig, weights: Weights, task: TokenizedTask, model_path: str, ckpt: dict | None,
             output: Output) -> None:
    """The steps of ``train`` from the checkpoint ``ckpt`` (None: from step 0) to ``max_steps``, then the final
    checkpoint and model. The first Ctrl-C finishes the step and checkpoints; a second aborts it."""
    run = start_run(config, weights, task, model_path, ckpt, output)
    machine = config.machine
    if machine.keep_freed_memory:  # with micro-batches, freed memory kept under the ceiling of each pass
        FREED_MEMORY_CEILING.start(machine.freed_memory_ceiling if machine.per_device_train_batch_size else 0.0)
    stop, step, skips, samples = GracefulStop(output.log), run.start, 0, []
    try:
        for step in range(run.start, config.max_steps):
            if weights.ranks.max_float(float(stop.requested)):  # every rank stops at the same step
                break
            row, samples = run_step(run, step)
            if run.clock.adaptive:  # the divergence policy's estimate for the next step's sync: rank 0's, on all
                run.clock.observe(weights.ranks.from_main(lambda: row))
            output.append(row)
            skips = skips + 1 if row["skipped_updates"] else 0
            if skips >= config.optim.max_consecutive_skipped_updates:
                raise RunError(
                    f"{skips} steps in a row ended without an update (non-finite loss {row['loss']} or gradient norm "
                    f"{row['grad_norm']}, step {step}): the policy's or the sampler's log-probs have diverged (see "
                    f"is_weight/max and sampling/logp_diff_max in {output.path / 'metrics.jsonl'}); the last "
                    "checkpoint holds weights from before it")
            if weights.ref is not None and config.sync.ref_sync_steps and (step + 1) % config.sync.ref_sync_steps == 0:
                weights.reset_ref(config.sync.ref_model_mixup_alpha)
            if config.output.save_steps and (step + 1) % config.output.save_steps == 0 and step + 1 < config.max_steps:
                save(run, step + 1, samples)
            output.announce(row)  # callbacks see the row written and the checkpoint saved
        else:
            step = config.max_steps
    except KeyboardInterrupt:  # a second Ctrl-C: the step in progress is inconsistent, keep the last checkpoint
        output.close()
        stop.restore()
        output.log(f"aborted during step {step}; the last checkpoint in {output.path} is kept (run the same command "
                   "to resume)")
        raise
    finally:
        output.close()  # also before an error's one line, which then starts on a line of its own
        stop.restore()
        run.rollouts.close()  # a window in flight finishes before the sampler may close
    save(run, step, samples)
    if stop.requested:
        output.log(f"interrupted: checkpoint saved after step {step - 1} in {output.path}; run the same command to "
                   "resume")
        raise KeyboardInterrupt
    output.save_final_model(weights.unsharded(weights.policy), task.tokenizer)


def start_run(config: GRPOConfig, weights: Weights, task: TokenizedTask, model_path: str, ckpt: dict | None,
              output: Output) -> Run:
    """Restore the checkpoint, say what the run will do, and make what the steps share."""
    ranks = weights.ranks
    start = 0
    clock = SyncClock.from_config(config.sync)
    schedule = Schedule.from_config(config.optim, config.max_steps)
    if ckpt is not None:
        schedule.check_resume(ckpt.get("schedule"))
        weights.restore(ckpt)
        clock.restore(ckpt.get("clock"))
        start = ckpt["step"]
        output.log(f"resuming {output.path} at step {start}")
        if ckpt.get("world_size", 1) != ranks.world:
            output.log(f"  the checkpoint was written by {ckpt.get('world_size', 1)} trainer process(es), this run has "
                       f"{ranks.world}: it continues with the same global batch and gradient (each rank's share "
                       "differs), so it matches an uninterrupted run up to float rounding, not bit for bit")
    params = list(weights.policy.parameters())
    for line in arithmetic(config, sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad),
                           next(iter(params)).device, resolved_sampler(config), task, model_path):
        output.log(line)
    passes = Passes.from_config(config, ranks)
    exact = ExactJ(config.diagnostics.exact_j and ranks.joins_rank0, weights.policy, task, config.sampling.temperature,
                   task.tokenizer.pad_token_id, passes.precision, config.sampling.token_filter)
    ranges = RangeTracker(bool(task.task.reward_funcs), output.kept_rows() if start else [], output.log)
    rollouts = RolloutWindow(config, task.task, task.prompt_ids, weights.sampler, clock)
    initial = {k: np.asarray(v) for k, v in (ckpt or {}).get("eval_initial", {}).items()}
    return Run(config, weights, task, clock, passes, Objective.from_config(config), rollouts,
               exact, ranges, Warnings(config.machine.dtype), output, start, next(iter(params)).device, schedule,
               initial)


def save(run: Run, next_step: int, samples: list[dict]) -> None:
    """Checkpoint the weights (every rank takes part under FSDP) and the last step's samples (rank 0 writes)."""
    run.output.save_checkpoint({"step": next_step, "clock": run.clock.state(), "schedule": run.schedule.state(next_step),
                                "eval_initial": {k: v.tolist() for k, v in run.eval_initial.items()},
                                **run.weights.state()}, samples)


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
    step_rollout = rollout(run, tick, timer, row)
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
        run.exact.before_update()
        heldout = heldout_phase(run, step_rollout, tick, scored.rewards, row)
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
                                         diagnostics.improvement_lcb_weight_cap))
        row.update(run.exact.after_update())
    every = config.evaluation.eval_steps
    evaluate_now = every and ((step + 1) % every == 0 or step + 1 == config.max_steps)
    if evaluate_now and weights.ranks.joins_rank0:
        with timer("eval"):  # the updated policy pi_{k+1}
            row.update(run_evaluation(run, step + 1))
    run.warnings.see(row, tick.starts_window, run.output.write)
    row.update(timer.seconds)
    rewards = scored.rewards.reshape(-1)
    entry = lambda j: {"step": step, "prompt": task.task.prompts[prompt_idx[j // G]],  # noqa: E731  completion j
                       "completion": scored.texts[j], "reward": float(rewards[j])}
    samples = [entry(j) for j in range(0, rewards.size, G)]
    if config.output.log_completions and step % config.output.logging_steps == 0:
        n = min(config.output.num_completions_to_print or rewards.size, rewards.size)
        run.output.completions(step, [{**entry(j), "advantage": float(groups.advantages.reshape(-1)[j])}
                                      for j in range(n)])
    return row, samples[:SAMPLES_KEPT]


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


def rollout(run: Run, tick: Tick, timer: PhaseTimer, row: dict) -> StepRollout:
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


def heldout_phase(run: Run, step_rollout: StepRollout, tick: Tick, rewards, row: dict) -> Heldout | None:
    """Score the held-out prompts' completions and take their log alpha and log pi_k (before the update); widen the
    reward range with every training and held-out reward seen. None without held-out prompts."""
    config, weights, task, G = run.config, run.weights, run.task, run.config.sampling.num_generations
    heldout = None
    if config.diagnostics.heldout_prompts:
        idx, roll = step_rollout.heldout_idx, step_rollout.heldout
        heldout_rewards = score(task, idx, roll, G, weights.ranks).rewards
        batch = group_batch(task, idx, roll, G, run.device)
        heldout = heldout_before_update(run.passes, weights.policy, weights.alpha, batch, heldout_rewards, roll,
                                        tick.lag, config.objective.behaviour_logprobs == "recompute")
    run.ranges.see(tick.step, rewards, None if heldout is None else heldout.rewards, row, run.output.write)
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
    engine = resolved_sampler(config) in ("vllm", "server")
    if engine and weights.ranks.main:
        run.rollouts.wait()  # the background generation uses the sampler's weights until it is done
    with weights.policy_in_sampler(engine, swap=policy_step > 0) as policy:
        if not weights.ranks.main:
            return {}
        per_prompt = {}
        out = evaluate(policy, run.task, EvalSpec.from_config(config), seed=config.seed + policy_step,
                       pad=run.task.tokenizer.pad_token_id, precision=run.passes.precision,
                       exact=config.diagnostics.exact_j, sampler=weights.sampler if engine else None,
                       batch_size=config.machine.per_device_train_batch_size, per_prompt=per_prompt)
    if policy_step == 0:
        run.eval_initial = per_prompt
    elif run.eval_initial:  # the run's certificate, its level spent over the evaluations (the look-th after step 0)
        look = -(-policy_step // config.evaluation.eval_steps)
        out.update(improvement_bounds(per_prompt, run.eval_initial, config.diagnostics.improvement_lcb_level, look))
    return out
