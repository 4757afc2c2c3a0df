"""This project's readings inside TRL 1.16's ``GRPOTrainer``: two lines in a TRL user's own script.

    from llm.integrations.trl import watch
    watch(trainer, reward_range=(0, 1), heldout_prompts=8)

``watch`` takes a built ``GRPOTrainer`` and returns it. It observes and never trains: it reads the tensors TRL
already computes and appends its readings to ``trainer._metrics["train"]`` before ``GRPOTrainer.log`` averages them,
so they reach every tracker TRL reports to, under the names ``llm.train`` logs (``llm.integrations.readings``). How:

- ``_generate_and_score_completions`` (wrapped): notes the optimiser step a generation was made at; with
  ``heldout_prompts``, draws the held-out completions there from the same sampler (``HeldoutSampler``) under a forked
  random state, so TRL's own streams are untouched;
- ``_generate_single_turn`` (wrapped; transformers' ``generate`` without tools): one more logits processor that
  records the sampler's own log-probs and leaves the scores, hence the draws, as they were; with vLLM, TRL's
  ``sampling_per_token_logps`` are the engine's own;
- ``_compute_loss`` (wrapped) with ``_get_per_token_logps_and_entropies`` (wrapped): keeps the policy's log-probs
  that TRL's loss computes anyway, detached, with the micro-batch's sampler and old log-probs and masks;
- ``_calculate_rewards`` (wrapped): reads the rewards against the declared range;
- a ``TrainerCallback``'s ``on_step_end``, after each optimiser step and before TRL logs: the step's readings, and the
  held-out forward of pi_{k+1}; ``on_train_end``: the per-lag table.

The policy pi_theta and alpha are TRL's: softmax(logits / temperature) of the trainer's weights as TRL's loss computes
it (a full-sequence forward and its chunked output layer, under accelerate's autocast: ``bf16=True``, TRL's default,
computes it in bfloat16), and the sampler's distribution, whose log-probs vLLM reports (``sampling_per_token_logps``,
processed) and transformers' ``generate`` has recorded (its step-by-step decode with a KV cache, under the same
autocast: in bfloat16 the two computations round differently). Where neither exists (continuous batching, tool
episodes), alpha's log-probs are TRL's own forward of the sampler's weights (``old_per_token_logps``), which leaves
out the engine's mismatch. With top-k, top-p or min-p, TRL's trainer-side log-probs are
the unfiltered softmax's, so pi_k/alpha would be off: the watcher then refuses in one line (docs/integrations.md).
Nothing the watcher computes can stop the host: an error in it is one line, and the watcher stops observing.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import random

import numpy as np
import torch

from transformers import LogitsProcessorList

from llm.tensors.token_filter import filtered_log_softmax
from llm.integrations.readings import (HeldoutSet, MicroBatch, RangeWatch, WatchOptions, sequence_log_weights,
                                       watch_options)
from llm.integrations.watcher import ATTRIBUTE, PREFIX, Watcher
from llm.sampling.hf_generate import TemperedLogprobs

__all__ = ["watch", "TRLWatcher"]

def watch(trainer, **options):
    """Attach this project's readings to a built TRL 1.16 ``GRPOTrainer`` (or ``AsyncGRPOTrainer``:
    ``llm.integrations.async_grpo``) and return it (module docstring; the options are
    ``llm.integrations.readings.WatchOptions``). A wrong option, or a set-up the readings cannot serve, is one
    line (``ValueError``/``TypeError``) here, before training."""
    opts = watch_options(**options)
    try:
        from trl import GRPOTrainer
    except ImportError as exc:
        raise ImportError("watch: TRL is not installed (pip install trl==1.16.0)") from exc
    asynchronous = any(c.__name__ == "AsyncGRPOTrainer" and c.__module__.startswith("trl.experimental.async_grpo")
                       for c in type(trainer).__mro__)
    if not (asynchronous or isinstance(trainer, GRPOTrainer)):
        raise TypeError(f"watch: expected a built trl.GRPOTrainer or AsyncGRPOTrainer, got {type(trainer).__name__}")
    if getattr(trainer, ATTRIBUTE, None) is not None:
        raise ValueError("watch: this trainer is already watched")
    if asynchronous:
        from llm.integrations.async_grpo import AsyncWatcher

        watcher = AsyncWatcher(trainer, opts)
    else:
        watcher = TRLWatcher(trainer, opts)
    watcher.attach()
    return trainer


def token_filter_of(trainer):
    """The sampler's truncation as ``llm.tensors.token_filter.TokenFilter`` (TRL's top_k None/0 and min_p None: off)."""
    from llm.tensors.token_filter import TokenFilter

    return TokenFilter(top_k=int(trainer.top_k or 0), top_p=float(1.0 if trainer.top_p is None else trainer.top_p),
                       min_p=float(trainer.min_p or 0.0))


class _Recorder(TemperedLogprobs):
    """A logits processor for ``generate`` that records log alpha of each sampled token, the temperature and the
    truncation applied to the scores it is handed (custom processors run before transformers' warpers, which then
    sample from exactly that distribution), and returns the scores unchanged."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._collect(input_ids[:, -1])
        self.prev = filtered_log_softmax(scores.float() / self.temperature, self.token_filter)
        return scores


def filtered_logprobs(trainer, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                      token_filter) -> torch.Tensor:
    """log pi of the last ``logits_to_keep`` tokens on the kept set of ``token_filter`` (the sampler's top-k, top-p,
    min-p: docs/theory.md, §1.1), at the trainer's current weights: TRL's forward to the decoder's last hidden states
    (its autocast, its positions), then this project's output layer on them (``llm.tensors.logit_head.LogitHead``,
    chunked, the kept set as the sampler's). (B, logits_to_keep) float32, 0 on padding. No gradient; the host's
    random streams untouched."""
    from llm.tensors.logit_head import LogitHead, token_logprobs

    model = trainer.accelerator.unwrap_model(trainer.model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    devices = [trainer.accelerator.device] if trainer.accelerator.device.type == "cuda" else []
    out = torch.zeros(input_ids.shape[0], logits_to_keep, device=input_ids.device)
    keep = attention_mask[:, -logits_to_keep:].bool()
    with torch.random.fork_rng(devices=devices), torch.no_grad(), trainer.accelerator.autocast():
        hidden = base.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                    use_cache=False).last_hidden_state[:, -logits_to_keep - 1:-1]
        logp, _ = token_logprobs(LogitHead(base, trainer.temperature, token_filter), hidden[keep],
                                 input_ids[:, -logits_to_keep:][keep])
    out[keep] = logp.float()
    return out


def _row_key(prompt, completion) -> bytes:
    return np.asarray(list(prompt), np.int64).tobytes() + b"|" + np.asarray(list(completion), np.int64).tobytes()


class HeldoutSampler:
    """Held-out completions from the host's own sampler: the rows, the prompts as TRL renders them, the sampler
    (transformers' ``generate`` with TRL's generation config, or TRL's vLLM engine), the rewards by TRL's own
    ``_calculate_rewards`` (its side buffers restored), the sampler's log alpha and the trainer's log pi."""

    def __init__(self, trainer, options: WatchOptions, seed: int):
        self.trainer, self.options = trainer, options
        self.rng = np.random.default_rng([seed, 7211])  # the watcher's own stream: the host's is never drawn from
        self.torch_seed = int(self.rng.integers(2**31))
        self.draws = 0

    def rows(self) -> list[dict]:
        ds = self.trainer.train_dataset
        idx = self.rng.choice(len(ds), size=self.options.heldout_prompts, replace=len(ds) < self.options.heldout_prompts)
        return [dict(ds[int(i)]) for i in idx]

    @contextlib.contextmanager
    def _own_random_state(self):
        """Every random stream the host draws from, restored afterwards; torch's seeded for this draw."""
        t = self.trainer
        devices = [t.accelerator.device] if t.accelerator.device.type == "cuda" else []
        state_py, state_np = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.torch_seed + self.draws)
            try:
                yield
            finally:
                random.setstate(state_py)
                np.random.set_state(state_np)
        self.draws += 1

    def draw(self, step: int, ranges: RangeWatch, say) -> HeldoutSet | None:
        t = self.trainer
        G = t.num_generations
        rows = self.rows()
        inputs = [dict(r) for r in rows for _ in range(G)]
        prompts = [x["prompt"] for x in inputs]
        with self._own_random_state():
            prompt_ids, completion_ids, logprobs = self.sample(prompts)
            completions = self.decode(prompts, prompt_ids, completion_ids)
            per_func = self.rewards(inputs, prompts, completions, completion_ids)
        totals = (per_func * t.reward_weights.to(per_func.device)).nansum(dim=1)
        totals[torch.isnan(per_func).all(dim=1)] = torch.nan
        rewards = totals.double().cpu().numpy().reshape(len(rows), G)
        rewards, line = ranges.see(step, "held-out", rewards)
        if line:
            say(PREFIX + line)
        keep = np.isfinite(rewards).all(axis=1)
        if not keep.any():
            return None
        ids, attention, mask, logits_to_keep = self.tensors(prompt_ids, completion_ids)
        logp_alpha = self.pad(logprobs, mask.shape[1]).to(mask.device)
        logp_k = self.logprobs(ids, attention, logits_to_keep)
        rows_kept = torch.from_numpy(np.repeat(keep, G)).to(mask.device)
        take = lambda x: x[rows_kept]  # noqa: E731
        return HeldoutSet(step, rewards[keep], take(ids), take(attention), take(mask).float(), take(logp_alpha),
                          take(logp_k), alpha_from_sampler=True, dropped=int((~keep).sum()),
                          extra={"logits_to_keep": logits_to_keep})

    def sample(self, prompts: list):
        """(prompt ids, completion ids (after the first EOS cut, EOS kept), the sampler's log alpha per token)."""
        t = self.trainer
        prompt_ids, images, multimodal = t._tokenize_prompts(prompts)
        if images is not None or multimodal:
            raise RuntimeError("held-out prompts with images are not supported")
        if t.use_vllm:
            _, completion_ids, logprobs, _ = t.vllm_generation.generate(
                prompts=prompt_ids, images=None, num_generations=t.num_generations)
            return prompt_ids, completion_ids, [[lp[0] for lp in seq] for seq in logprobs]
        from trl.models import unwrap_model_for_generation
        from trl.trainer.utils import pad

        device = t.accelerator.device
        tensors = [torch.tensor(ids) for ids in prompt_ids]
        padded = pad(tensors, padding_value=t._tokenizer.pad_token_id, padding_side="left").to(device)
        attention = pad([torch.ones_like(x) for x in tensors], padding_value=0, padding_side="left").to(device)
        recorder = _Recorder(t.temperature, token_filter_of(t))
        with (unwrap_model_for_generation(t.model_wrapped, t.accelerator,
                                          gather_deepspeed3_params=t.args.ds3_gather_for_generation,
                                          generation_kwargs=t.generation_kwargs,
                                          gradient_checkpointing_kwargs=t.args.gradient_checkpointing_kwargs) as model,
              torch.no_grad()):
            sequences = model.generate(input_ids=padded, attention_mask=attention, generation_config=t.generation_config,
                                       logits_processor=LogitsProcessorList([recorder]))
        logp = recorder.finish(sequences)
        completion = sequences[:, padded.shape[1]:]
        is_eos = torch.isin(completion, torch.tensor(t.eos_token_ids, device=completion.device))
        ends = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), torch.full_like(is_eos[:, 0], completion.shape[1],
                                                                                          dtype=torch.long))
        completion_ids, logprobs = [], []
        for row, end in enumerate(ends.tolist()):
            n = min(end + 1, completion.shape[1])
            completion_ids.append(completion[row, :n].tolist())
            logprobs.append(logp[row, :n].tolist())
        return prompt_ids, completion_ids, logprobs

    def decode(self, prompts, prompt_ids, completion_ids):
        """The completions as TRL's ``_generate`` hands them to reward functions."""
        import transformers
        from packaging.version import Version
        from trl.data_utils import is_conversational

        t = self.trainer
        if is_conversational({"prompt": prompts[0]}):
            tok = t._tokenizer
            if Version(transformers.__version__) >= Version("5.0.0") and (
                    getattr(tok, "response_template", None) is not None or getattr(tok, "response_schema", None)
                    is not None):
                from trl.chat_template_utils import parse_response

                return [[parse_response(tok, ids, prefix=prompt_ids[i], tools=t.tools)]
                        for i, ids in enumerate(completion_ids)]
            texts = t.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
            return [[{"role": "assistant", "content": text}] for text in texts]
        return t.processing_class.batch_decode(completion_ids, skip_special_tokens=True)

    def rewards(self, inputs, prompts, completions, completion_ids) -> torch.Tensor:
        """TRL's own ``_calculate_rewards`` (rewards per function, None as nan); what reward functions log through
        ``log_metric`` and ``log_extra`` on these calls is dropped, so TRL's logs stay its own."""
        t = self.trainer
        saved = {name: {k: list(v) for k, v in getattr(t, name).items()}
                 for name in ("_pending_extra_logs", "_pending_metrics")}
        try:
            return t._calculate_rewards(inputs, prompts, completions, completion_ids)
        finally:
            for name, content in saved.items():
                getattr(t, name).clear()
                getattr(t, name).update(content)

    def tensors(self, prompt_ids, completion_ids):
        """(input ids, attention mask, policy mask of the completion tokens, completion width) as TRL pads them."""
        from trl.trainer.utils import pad

        t = self.trainer
        device = t.accelerator.device
        p = [torch.tensor(ids) for ids in prompt_ids]
        c = [torch.tensor(ids, dtype=torch.long) for ids in completion_ids]
        pid = pad(p, padding_value=t._tokenizer.pad_token_id, padding_side="left").to(device)
        pm = pad([torch.ones_like(x) for x in p], padding_value=0, padding_side="left").to(device)
        cid = pad(c, padding_value=t._tokenizer.pad_token_id, padding_side="right").to(device)
        cm = pad([torch.ones_like(x) for x in c], padding_value=0, padding_side="right").to(device)
        return torch.cat([pid, cid], dim=1), torch.cat([pm, cm], dim=1), cm, cid.shape[1]

    @staticmethod
    def pad(rows, width: int) -> torch.Tensor:
        out = torch.zeros(len(rows), width)
        for i, r in enumerate(rows):
            vals = [float("nan") if x is None else float(x) for x in r][:width]
            out[i, :len(vals)] = torch.tensor(vals)
        return out

    def logprobs(self, ids, attention, logits_to_keep) -> torch.Tensor:
        """log pi of the completion tokens at the trainer's current weights, by TRL's own forward, with no
        gradient and the host's random streams untouched."""
        from trl.models.utils import disable_gradient_checkpointing

        t = self.trainer
        if token_filter_of(t).active:
            return filtered_logprobs(t, ids, attention, logits_to_keep, token_filter_of(t))
        devices = [t.accelerator.device] if t.accelerator.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad(), \
                disable_gradient_checkpointing(t.model, t.args.gradient_checkpointing_kwargs):
            logp, _, _ = t._get_per_token_logps_and_entropies(t.model, ids, attention, logits_to_keep,
                                                              batch_size=t.args.per_device_train_batch_size)
        return logp.detach().float()


class TRLWatcher(Watcher):
    """The watcher of one ``GRPOTrainer`` (module docstring): ``attach`` wraps five of its methods and adds a
    callback; ``summary`` is what the run's end prints and writes."""

    def __init__(self, trainer, options: WatchOptions):
        self.trainer, self.options = trainer, options
        super().__init__(trainer, options, self.sync_dtype())
        self.generation_step: int | None = None  # the optimiser step TRL's latest generation was made at
        self.generation = 0
        self.heldout: HeldoutSet | None = None
        seed = options.seed if options.seed is not None else int(trainer.args.seed)
        self.sampler = HeldoutSampler(trainer, options, seed) if options.heldout_prompts else None
        self.sampled: dict[bytes, torch.Tensor] = {}  # the transformers sampler's log alpha, by prompt and completion
        self.capturing = False
        self.captured: torch.Tensor | None = None
        self.in_heldout = False
        self.refuse_setups()

    # -- set-up ------------------------------------------------------------------------------------------------
    def refuse_setups(self) -> None:
        """What the readings cannot serve, refused in one line before training."""
        t, o = self.trainer, self.options
        if token_filter_of(t).active and not t.use_vllm and (t.use_transformers_continuous_batching or t.tools):
            raise ValueError("watch: top_k, top_p or min_p with continuous batching or tools: no log-probs of the "
                             "sampler's kept set exist to read (TRL's own are the unfiltered softmax's); watch such "
                             "a run without truncation, or with transformers' generate (docs/integrations.md)")
        if not getattr(getattr(t, "generation_config", None), "do_sample", True):
            raise ValueError("watch: the generation is greedy (do_sample=False): alpha is a point mass, and no "
                             "importance weight or TV is defined")
        if o.heldout_prompts:
            why = None
            if t.environment_factories is not None or t.tools:
                why = "tools and environments (their episodes would run your tools and move your environments' state)"
            elif t.rollout_func is not None:
                why = "a rollout_func"
            elif t.accelerator.num_processes > 1:
                why = "several processes"
            elif not hasattr(t.train_dataset, "__len__") or len(t.train_dataset) == 0:
                why = "an iterable or empty training dataset"
            if why:
                raise ValueError(f"watch: heldout_prompts with {why} is not supported; the in-sample readings "
                                 "(heldout_prompts=0) are supported there")

    def sync_dtype(self) -> str:
        """The sync check's rule: bfloat16's (twice the run's own rounding floor) when the trainer or the engine
        computes in bfloat16 or float16, float32's otherwise."""
        t, chosen = self.trainer, self.options.engine_dtype
        if chosen == "auto":
            chosen = "float32"
            with contextlib.suppress(Exception):
                if t.use_vllm and t.vllm_mode == "colocate":
                    chosen = str(t.vllm_generation.llm.llm_engine.model_config.dtype).removeprefix("torch.")
        trainer_half = bool(t.args.bf16 or t.args.fp16)
        return "bfloat16" if trainer_half or chosen in ("bfloat16", "float16") else "float32"

    def attach(self) -> None:
        t = self.trainer
        self.wrap("_generate_and_score_completions", "_generate_single_turn", "_compute_loss",
                  "_get_per_token_logps_and_entropies", "_calculate_rewards")
        what = ["lag", "tv/pi_k_alpha", "ess/pi_k_alpha"]
        if t.use_vllm or not (t.use_transformers_continuous_batching or t.tools):  # the sampler's own log-probs
            what.append("sampling/logp_diff_* at lag 0")
            what += (["tv/staleness and tv/engine_mismatch at lag 0 only (TRL's own log-probs are unfiltered)"]
                     if token_filter_of(t).active else ["tv/staleness", "tv/engine_mismatch"])
        if self.sampler:
            what.append(f"heldout/* on {self.options.heldout_prompts} prompts x {t.num_generations} per generation")
        super().attach(what)
        if self.sampler:
            self.say(PREFIX + self.heldout_line())

    def heldout_line(self) -> str:
        """What the held-out prompts can and cannot do: the smallest change their certificate can certify, that they
        are drawn with replacement from a set smaller than them, that they call the user's reward functions."""
        from grpo_theory.estimators import certificate_floor

        o, n = self.options, len(self.trainer.train_dataset)
        floor = certificate_floor(o.heldout_prompts, o.improvement_lcb_level, -1.0, o.improvement_lcb_weight_cap - 1.0)
        reach = (f"the certificate can certify no change from {o.heldout_prompts} held-out prompts (it needs more; 16 "
                 f"certify {certificate_floor(16, o.improvement_lcb_level):.2f}, 64 certify "
                 f"{certificate_floor(64, o.improvement_lcb_level):.3f} in units of the reward range)"
                 if not math.isfinite(floor) else
                 f"the smallest change the certificate can certify from {o.heldout_prompts} held-out prompts is "
                 f"{floor:.3g} of the reward range")
        drawn = (f"; drawn with replacement (the training set has {n} rows)" if n < o.heldout_prompts else "")
        return (f"{reach}{drawn}; their completions are scored by your reward functions, so one that keeps state "
                "(counts its calls, caches) sees them too")

    # -- wrapped methods -------------------------------------------------------------------------------------
    def _generate_and_score_completions(self, original, inputs):
        if self.trainer.model.training:
            self.sampled = {}  # TRL keeps one generation's batch: the last one's log-probs are all that is asked for
        out = original(inputs)
        if self.trainer.model.training and not self.stopped:
            self.generation_step = self.trainer.state.global_step
            self.generation += 1
            if self.sampler is not None:
                self.guarded(self.draw_heldout)
        return out

    def _generate_single_turn(self, original, prompt_ids, *args, **kwargs):
        """TRL's transformers ``generate`` with a recording logits processor beside its own (``_Recorder``: the scores
        and the draws unchanged), so that alpha's log-probs are the sampler's own, as vLLM reports them; vLLM,
        continuous batching and tool episodes (whose turns TRL re-assembles) keep TRL's path untouched."""
        t = self.trainer
        if (t.use_vllm or t.use_transformers_continuous_batching or t.tools or self.stopped
                or not t.model.training):
            return original(prompt_ids, *args, **kwargs)
        model = t.accelerator.unwrap_model(t.model_wrapped)
        recorder, seen = _Recorder(t.temperature, token_filter_of(t)), {}
        generate = model.generate

        def recording(*a, **kw):
            processors = kw.get("logits_processor")
            kw["logits_processor"] = LogitsProcessorList([*(processors or []), recorder])
            seen["sequences"] = generate(*a, **kw)
            return seen["sequences"]

        model.generate = recording
        try:
            completion_ids, logprobs = original(prompt_ids, *args, **kwargs)
        finally:
            del model.generate  # the class's own again
        if "sequences" in seen:
            self.guarded(self.keep_sampled, prompt_ids, completion_ids, recorder.finish(seen["sequences"]))
        return completion_ids, logprobs

    def keep_sampled(self, prompt_ids, completion_ids, logp: torch.Tensor) -> None:
        for row, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
            self.sampled[_row_key(p, c)] = logp[row, :len(c)].detach().float().cpu()

    def _get_per_token_logps_and_entropies(self, original, *args, **kwargs):
        out = original(*args, **kwargs)
        if self.capturing and self.captured is None:
            self.captured = out[0].detach()
        return out

    def _compute_loss(self, original, model, inputs):
        if not self.trainer.model.training or self.stopped:
            return original(model, inputs)
        self.capturing, self.captured = True, None
        try:
            loss = original(model, inputs)
        finally:
            self.capturing = False
        self.guarded(self.record, inputs, self.captured)
        self.captured = None
        return loss

    def _calculate_rewards(self, original, inputs, prompts, completions, completion_ids_list):
        out = original(inputs, prompts, completions, completion_ids_list)
        if self.trainer.model.training and not self.in_heldout and not self.stopped:
            self.guarded(self.see_rewards, out)
        return out

    # -- observations ------------------------------------------------------------------------------------------
    def see_rewards(self, per_func: torch.Tensor) -> None:
        t = self.trainer
        totals = (per_func * t.reward_weights.to(per_func.device)).nansum(dim=1)
        totals[torch.isnan(per_func).all(dim=1)] = torch.nan
        _, line = self.ranges.see(t.state.global_step, "training", totals.double().cpu().numpy())
        if line:
            self.say(PREFIX + line)

    def labels(self, inputs) -> np.ndarray:
        """Each completion's prompt label: its generation and its prompt's tokens (a prompt drawn twice in one
        generation counts once: conservative for the standard errors)."""
        ids, mask = inputs["prompt_ids"].cpu(), inputs["prompt_mask"].cpu().bool()
        head = self.generation.to_bytes(8, "little", signed=False)
        out = np.empty(ids.shape[0], dtype=np.int64)
        for i in range(ids.shape[0]):
            digest = hashlib.blake2b(head + ids[i][mask[i]].numpy().astype(np.int64).tobytes(), digest_size=8)
            out[i] = int.from_bytes(digest.digest(), "little", signed=True)
        return out

    def record(self, inputs, logp_k: torch.Tensor | None) -> None:
        """A micro-batch's completions: log pi_k (TRL's loss forward), log alpha (the engine's when reported, else
        the trainer's at the sampler's weights, else pi_k's own at lag 0), the policy mask."""
        if logp_k is None:
            raise RuntimeError("TRL's loss computed no log-probabilities to read")
        t = self.trainer
        lag = t.state.global_step - (self.generation_step if self.generation_step is not None else t.state.global_step)
        token_filter = token_filter_of(t)
        if token_filter.active:  # TRL's log-probs are the unfiltered softmax's: pi_k on the sampler's kept set
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            logp_k = filtered_logprobs(t, ids, attention, inputs["completion_ids"].shape[1], token_filter)
        mask = inputs["completion_mask"].float()
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"].float()
        sampler, old = inputs.get("sampling_per_token_logps"), inputs.get("old_per_token_logps")
        if sampler is None and self.sampled:
            sampler = self.recorded(inputs)
        if token_filter.active:
            old = None  # TRL's forward of the sampler's weights is unfiltered: no staleness/mismatch split
            if sampler is None:
                raise RuntimeError("truncated sampling without the sampler's log-probs of its kept set")
        alpha = sampler if sampler is not None else old if old is not None else logp_k
        if sampler is None and old is None and lag > 0:
            raise RuntimeError(f"lag {lag} without the sampler's or TRL's old log-probabilities")
        keep = mask.sum(dim=1) > 0  # a completion masked whole (mask_truncated_completions) is not trained on
        log_w_k = sequence_log_weights(logp_k, torch.nan_to_num(alpha.float(), nan=0.0), mask)[keep.cpu().numpy()]
        log_w_gen = gap = None
        if sampler is not None:
            gen = old if old is not None else (logp_k if lag == 0 else None)
            if gen is not None:
                log_w_gen = sequence_log_weights(gen, torch.nan_to_num(sampler.float(), nan=0.0), mask)
                log_w_gen = log_w_gen[keep.cpu().numpy()]
                if lag == 0:
                    gap = (sampler.detach().float().cpu(), gen.detach().float().cpu(), mask.cpu())
        n = int(keep.sum())
        self.parts.append(MicroBatch(np.full(n, lag), self.labels(inputs)[keep.cpu().numpy()], log_w_k, log_w_gen, gap))

    def recorded(self, inputs) -> torch.Tensor | None:
        """The sampler's log alpha of a micro-batch's completions, recorded at generation (``_generate_single_turn``),
        as a (B, T) tensor; None if a row was not recorded."""
        ids, lengths = inputs["completion_ids"].cpu(), inputs["completion_mask"].sum(dim=1).cpu()
        prompts, pmask = inputs["prompt_ids"].cpu(), inputs["prompt_mask"].cpu().bool()
        out = torch.zeros(ids.shape, dtype=torch.float32)
        for i in range(ids.shape[0]):
            n = int(lengths[i])
            logp = self.sampled.get(_row_key(prompts[i][pmask[i]].tolist(), ids[i, :n].tolist()))
            if logp is None:
                return None
            out[i, :n] = logp[:n]
        return out.to(inputs["completion_ids"].device)

    def draw_heldout(self) -> None:
        self.in_heldout = True
        try:
            self.heldout = self.sampler.draw(self.trainer.state.global_step, self.ranges, self.say)
        finally:
            self.in_heldout = False
