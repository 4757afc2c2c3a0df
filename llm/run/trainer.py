"""Algorithm 1 (docs/theory.md, §7) on a causal language model: ``train(config)``: the set-up (model, task, weights,
sampler), the loop over the steps and the checkpoints. The trainer's phases, in the order a run goes through them:

    set-up      model, task, start-up checks, weights and sampler            (``setup``; ``llm.step.weights``)
    start       restore a checkpoint, print the run's arithmetic             (``start_run``; ``llm.run.output``)
    each step   sync, rollout, score, advantages, behaviour, reference,     (``llm.step.step.run_step``: its own table)
                optimise, diagnose, evaluate
    log         one row of metrics.jsonl, trackers, callbacks                (``llm.run.output.Output``)
    checkpoint  every ``save_steps`` steps, at the end and on Ctrl-C          (``save``)
    reference   reset pi_ref every ``ref_sync_steps``                         (``Weights.reset_ref``)

Under torchrun every rank runs each phase over its share of the prompts; rank 0 alone generates, scores and writes
(``llm.models.distributed``).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from runkit.cli import RunError
from runkit.host_memory import CEILING as FREED_MEMORY_CEILING
from runkit.host_memory import keep_freed_memory, release_freed_memory
from runkit.interrupt import GracefulStop

from llm.config import GRPOConfig
from llm.agents.setup import build_agent
from llm.tensors.batch import make_batch
from llm.tensors.logprobs import check_head, check_packing
from llm.tensors.metrics import VOID_KEY
from llm.models import pretrained
from llm.models.distributed import SINGLE, Ranks, close_ranks, collective_failure, init_ranks
from llm.models.tiny import agent_model_dir
from llm.models.model import add_lora, compile_blocks, load_policy, resolve_device
from llm.models.vml import resolve_vml_dispatch
from llm.optim import Schedule
from llm.rewards.functions import RewardOutOfRange
from llm.run.output import Output, SilentOutput, StepCallback, arithmetic
from llm.run.rundir import RunDir
from llm.run.trackers import Trackers, check_trackers
from llm.run import specs
from llm.run.plan import Plan, resolve_plan
from llm.sampling import max_model_len
from llm.step.clock import SyncClock
from llm.step.monitors import DeclaredRange, ExactJ, RangeViolation, Warnings
from llm.step.rollout import RolloutWindow
from llm.step.step import Run, run_step
from llm.step.weights import Weights
from llm.tasks import TokenizedTask
from llm.tasks.procedural import GeneratorSpec
from llm.tasks.sources import load_task


def train(config: GRPOConfig, log=print, callbacks: Sequence[StepCallback] = ()) -> Path:
    """Run Algorithm 1 with ``config``; returns the run directory. Resumes if it holds a checkpoint.

    ``callbacks`` are called as ``cb(step, row)`` after each step's metrics row is written (``row``: that row),
    after the trackers of ``report_to``; a callback with an ``on_setup(weights)`` method is also handed the
    run's ``llm.step.weights.Weights`` (policy, alpha, pi_ref, the sampler) before step 0.

    The objects that exist before the call are frozen (``gc.freeze``) for its length, so the garbage collector scans
    the run's own objects only; garbage among them is collected after the run, at the collector's next pass.
    """
    if not isinstance(config, GRPOConfig):
        raise TypeError(f"train() takes a GRPOConfig (GRPOConfig(**options), or llm.config.from_trl(**options) with "
                        f"TRL's names), got {type(config).__name__}")
    plan = resolve_plan(config)  # everything the run decides from the options, once
    # torchrun: this process's rank (one rank with the in-process engine runs as one process); else one process
    ranks = init_ranks(resolve_device(config.machine.device), config.machine.fsdp,
                       group_of_one=not plan.sampler_class.owns_torch_distributed)
    finished = False
    try:
        path = train_main(config, plan, ranks, log, callbacks) if ranks.main else train_rank(config, plan, ranks)
        finished = True
        return path
    except RuntimeError as exc:  # FSDP's gathers and reduce-scatters are not wrapped in Ranks.collective()
        if not (ranks.active and collective_failure(exc)):
            raise
        raise ranks.fault(exc) from None
    finally:
        close_ranks(ranks, finished)


def train_main(config: GRPOConfig, plan: Plan, ranks: Ranks, log, callbacks: Sequence[StepCallback]) -> Path:
    """The one process, or rank 0 of several: it owns the run directory, the sampler and the trackers."""
    with RunDir(config, plan) as run:  # locked: a second trainer on the same output_dir is refused
        ckpt = run.open()  # writes config.json and plan.json before step 0
        if run.notice:
            log(run.notice)
        ranks.barrier()  # the other ranks read the checkpoint once the run directory is ready
        if ckpt is not None and ckpt["step"] >= config.max_steps:
            log(f"{run.path} already holds a finished run of {ckpt['step']} steps (raise --max-steps to continue it)")
            return run.path
        check_trackers(config.output)  # a tracker whose package is missing stops the run before the model loads
        with callers_objects_frozen():
            weights, task, model_path = setup(config, ranks, log, plan)
            try:
                for cb in callbacks:
                    getattr(cb, "on_setup", lambda w: None)(weights)
                trackers = Trackers(config, run.path)
                output = Output(config, run, ckpt["step"] if ckpt else 0, log, (trackers, *callbacks))
                try:
                    run_loop(config, plan, weights, task, model_path, ckpt, output)
                finally:
                    trackers.close()
            finally:
                weights.close()  # also on an error: a server's weight-transfer group, an engine's memory
                if config.machine.keep_freed_memory:  # the run's memory back to the system: the process may go on
                    del weights
                    gc.collect()
                    release_freed_memory()
    return run.path


@contextlib.contextmanager
def callers_objects_frozen():
    """The caller's objects (imports, a notebook's or a test suite's) out of the collector's sight while the run
    goes on: its collections, and the one after it, scan the run's own objects (a full collection of a test worker's
    heap took 0.5 s). Unfrozen when the run ends, by an error too; vLLM's engine unfreezes the heap itself when it
    stops."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def train_rank(config: GRPOConfig, plan: Plan, ranks: Ranks) -> Path:
    """A rank other than 0: the same steps on its share of each step's prompts; it writes nothing."""
    path = Path(config.output.output_dir)
    ranks.barrier()
    ckpt_path = path / "checkpoint.pt"
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True) if ckpt_path.is_file() else None
    if ckpt is not None and ckpt["step"] >= config.max_steps:
        return path
    weights, task, model_path = setup(config, ranks, lambda *a: None, plan)
    run_loop(config, plan, weights, task, model_path, ckpt, SilentOutput(path))
    return path


def setup(config: GRPOConfig, ranks: Ranks = SINGLE, log=print, plan: Plan | None = None) \
        -> tuple[Weights, TokenizedTask, str]:
    """Load the task, the policy and its tokenizer, then the weights around it (``Weights.build``: the sampler on
    rank 0 holding alpha = the policy, the copies, the optimiser). ``plan``: the run's (None: resolved here)."""
    plan = plan or resolve_plan(config)
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
        if plan.sampler_class.owns_torch_distributed:
            raise ValueError("sampler: the in-process vLLM engine sets up torch.distributed for itself and cannot "
                             "share torchrun's process group; under torchrun use --sampler server (vLLM in its own "
                             "process) or --sampler transformers")
        if config.optim.grad_baselining:
            raise ValueError("grad_baselining: VCPO's baseline needs every completion's own gradient on one process; "
                             "run it without torchrun")
    data = config.data
    task = load_task(data.dataset, data.reward_fn, data.eval_dataset, data.reward_funcs, data.reward_weights,
                     data.answer_check, GeneratorSpec.from_config(data), specs.reward_context(config),
                     environment_reward=bool(config.agent.environment_factory))
    if not ranks.main:
        ranks.barrier()  # rank 0 builds the built-in model's files first
    agentic = bool(task.tools) or config.agent.enabled  # no model given: the built-in agent model for an agent
    name = config.model.model_name_or_path or (str(agent_model_dir()) if agentic else "")
    model_path = pretrained.resolve_model_path(name, log=log)
    if ranks.main:
        ranks.barrier()
    policy, tokenizer = load_policy(model_path, device, config.model.trust_remote_code,
                                    packing_attention(config.machine, device))
    policy.train()
    if config.machine.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.model.use_peft:
        policy = add_lora(policy, config.model.lora_r, config.model.lora_alpha, config.model.lora_target_modules)
    agent = build_agent(config.agent, task, tokenizer, log)  # sets --chat-template-path's template, agent or not
    bound = task.bind(tokenizer, config.data.chat_template, agent)  # prompt tokens once; indexed by prompt every step
    probes = probe_prompts(bound, tokenizer)
    probe = make_batch(probes, [p[:3] for p in probes], tokenizer.pad_token_id, device)
    check_head(policy, probe, config.sampling.temperature)  # the chunked log-probs know this output layer
    if config.machine.padding_free:  # the attention keeps packed sequences apart
        check_packing(policy, probe, config.sampling.temperature)
    if config.machine.compile:  # after the probe's checks, which run once: no graphs compiled for them alone
        log(f"compile: {compile_blocks(policy)} decoder blocks compile at their first passes (minutes on a CPU)")
    if config.diagnostics.exact_j and bound.max_accepted_length > plan.max_completion_length:
        raise ValueError(f"max_completion_length: the task's accepted completions need {bound.max_accepted_length} "
                         f"tokens, more than {plan.max_completion_length}; raise it or pass --no-exact-j")
    longest = max(map(len, bound.prompt_ids + bound.test_prompt_ids))
    if task.name == "environment":  # --dataset none: reset() writes every prompt; room for one as long as a
        budget = plan.max_completion_length  # completion (64 at least), within the model's positions
        positions = int(getattr(policy.config, "max_position_embeddings", 1 << 20))
        longest = max(longest, min(positions - budget, max(64, budget)))
    max_model_len(policy, plan.max_completion_length, longest)  # the longest prompt plus a whole completion fit the model's positions
    weights = Weights.build(config, ranks, policy, tokenizer, model_path, probes, longest,
                            specs.sampler(config, plan.sampler), agent)
    return weights, bound, model_path


def packing_attention(machine, device: torch.device) -> str:
    """The attention kernel to load the policy with: ``attn_implementation``, or where it is 'auto' with
    ``padding_free`` on a GPU, torch's flex_attention, whose block mask keeps a pass's sequences apart in one packed
    row (on a CPU transformers' own choice runs the packed rows with a dense mask)."""
    if machine.attn_implementation == "auto" and machine.padding_free and device.type == "cuda":
        return "flex_attention"
    return machine.attn_implementation


def probe_prompts(bound: TokenizedTask, tokenizer) -> list[list[int]]:
    """Two prompts for the start-up checks of the output layer and the sampler's sync: the first two prompts with
    tokens, or EOS twice when every prompt is empty (``--dataset none``: the environment writes them)."""
    found = [p for p in bound.prompt_ids if p][:2]
    return found or [[tokenizer.eos_token_id] * 4] * 2


def run_loop(config: GRPOConfig, plan: Plan, weights: Weights, task: TokenizedTask, model_path: str,
             ckpt: dict | None, output: Output) -> None:
    """The steps of ``train`` from the checkpoint ``ckpt`` (None: from step 0) to ``max_steps``, then the final
    checkpoint and model. The first Ctrl-C finishes the step and checkpoints; a second aborts it."""
    run = start_run(config, plan, weights, task, model_path, ckpt, output)
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
    except (RangeViolation, RewardOutOfRange) as exc:  # the range the certificates read was wrong: void, then stop
        output.append({"step": getattr(exc, "step", step), VOID_KEY: 1.0, "bound/void_reason": str(exc)[:500]})
        raise
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


def start_run(config: GRPOConfig, plan: Plan, weights: Weights, task: TokenizedTask, model_path: str,
              ckpt: dict | None, output: Output) -> Run:
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
    for line in plan.lines():
        output.log(line)
    for line in arithmetic(config, sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad),
                           next(iter(params)).device, plan.sampler_class.name, task, model_path):
        output.log(line)
    passes = specs.passes(config, ranks)
    exact = ExactJ(config.diagnostics.exact_j and ranks.joins_rank0, weights.policy, task, config.sampling.temperature,
                   task.tokenizer.pad_token_id, passes.precision, config.sampling.token_filter,
                   every=config.diagnostics.exact_j_steps, last=config.max_steps - 1)
    kept = output.kept_rows() if start else []
    ranges = DeclaredRange(plan.reward_range, kept, output.log)
    for line in ranges.start_lines(plan.reward_range_origin):
        output.log(line)
    own_alpha = config.objective.behaviour_logprobs != "recompute" and plan.sampler_class.returns_logprobs
    if ranges.certifies and not own_alpha and config.diagnostics.heldout_prompts:
        output.log("log alpha is the trainer's (behaviour_logprobs recompute, or a sampler that reports none), not the "
                   "distribution the sampler drew from, so the per-step certificate (heldout/improvement_lcb) abstains")
    rollouts = RolloutWindow(config, task.task, task.prompt_ids, weights.sampler, clock)
    initial = {k: np.asarray(v) for k, v in (ckpt or {}).get("eval_initial", {}).items()}
    looks = (ckpt or {}).get("eval_looks", sum("eval/improvement_lcb" in r for r in kept))
    return Run(config, weights, task, clock, passes, specs.objective(config), specs.evaluation(config), rollouts,
               exact, ranges, Warnings(config.machine.dtype, config.sampling.temperature), output, start,
               next(iter(params)).device, schedule, plan.sampler_class, initial, looks)


def save(run: Run, next_step: int, samples: list[dict]) -> None:
    """Checkpoint the weights (every rank takes part under FSDP) and the last step's samples (rank 0 writes)."""
    run.output.save_checkpoint({"step": next_step, "clock": run.clock.state(), "schedule": run.schedule.state(next_step),
                                "eval_initial": {k: v.tolist() for k, v in run.eval_initial.items()},
                                "eval_looks": run.eval_looks,
                                **run.weights.state()}, samples)
