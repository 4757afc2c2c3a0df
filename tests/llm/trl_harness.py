"""Stand-ins for TRL 1.16's vLLM engine, and the built-in task as a TRL user writes it, for
tests/llm/test_integrations_trl.py and benchmarks/martingale_side_by_side.py (no pytest here: the benchmark runs in
.venv-bench)."""

from types import SimpleNamespace

import torch
import trl
from transformers import AutoModelForCausalLM, LogitsProcessorList

from llm.tasks import arithmetic_task

TASK = arithmetic_task()


def exact_reward(completions, answer, **kwargs):
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]


class EngineTrainer(trl.GRPOTrainer):
    """TRL's vLLM path with a stand-in engine: the model loaded again in ``engine_dtype`` (as vLLM loads it from the
    model's directory) that samples with ``generate`` and reports its own log-probs of what it sampled; TRL then
    computes old_per_token_logps and its importance-sampling ratio exactly as with vLLM. TRL's sync, at each
    generation of a new step, writes the trainer's weights into it: rounded to its dtype (``sync = "rounded"``, as
    TRL's colocate sync does), or as the change since the last sync added in the engine's dtype (``"delta"``), where
    every change below half the dtype's spacing of a weight rounds away."""

    engine_dtype = torch.bfloat16
    sync = "rounded"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.use_vllm, self.vllm_importance_sampling_correction = True, True
        self.engine = AutoModelForCausalLM.from_pretrained(self.model.name_or_path, dtype=self.engine_dtype).eval()
        # where the watcher reads a colocated engine's dtype (``engine_dtype="auto"``)
        self.vllm_mode = "colocate"
        self.vllm_generation = SimpleNamespace(llm=SimpleNamespace(llm_engine=SimpleNamespace(
            model_config=SimpleNamespace(dtype=self.engine_dtype))))
        self.sent = [p.detach().clone() for p in self.model.parameters()]
        self._last_loaded_step = -1

    def sync_engine(self):
        with torch.no_grad():
            for mine, theirs, sent in zip(self.engine.parameters(), self.model.parameters(), self.sent):
                if self.sync == "rounded":
                    mine.copy_(theirs.to(self.engine_dtype))
                else:
                    mine.add_((theirs - sent).to(self.engine_dtype))
                sent.copy_(theirs)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        from trl.trainer.utils import pad

        from llm.integrations.trl import _Recorder, token_filter_of

        if self.state.global_step != self._last_loaded_step:  # TRL's sync, at the first generation of a step
            self.sync_engine()
            self._last_loaded_step = self.state.global_step
        tensors = [torch.tensor(ids) for ids in prompt_ids]
        ids = pad(tensors, padding_value=self._tokenizer.pad_token_id, padding_side="left")
        attention = pad([torch.ones_like(x) for x in tensors], padding_value=0, padding_side="left")
        recorder = _Recorder(self.temperature, token_filter_of(self))
        with torch.no_grad():
            out = self.engine.generate(input_ids=ids, attention_mask=attention, generation_config=self.generation_config,
                                       logits_processor=LogitsProcessorList([recorder]))
        logp = recorder.finish(out)
        completion = out[:, ids.shape[1]:]
        completion_ids, logprobs = [], []
        for row in range(completion.shape[0]):
            ends = (completion[row] == self.eos_token_ids[0]).nonzero()
            n = int(ends[0]) + 1 if len(ends) else completion.shape[1]
            completion_ids.append(completion[row, :n].tolist())
            logprobs.append([[x] for x in logp[row, :n].tolist()])
        return completion_ids, [[lp[0] for lp in seq] for seq in logprobs]


class Fp32Engine(EngineTrainer):
    engine_dtype = torch.float32


class DeltaEngine(EngineTrainer):
    sync = "delta"


# ---- TRL's AsyncGRPOTrainer on the CPU ---------------------------------------------------------------------------
#
# AsyncGRPOTrainer's loss forward packs each micro-batch into a prefix tree and attends along it with flash-attention 3,
# a CUDA kernel fetched from the Hugging Face Hub at run time; its default rollout worker and weight transfer need a
# vLLM server and NCCL. Both ends are pluggable (TRL's ``RolloutWorkerProtocol`` and ``WeightTransferProtocol``), and
# the attention is a name in transformers' ``AttentionInterface``: the pieces below put a CPU stand-in at each, so the
# trainer's own loop, packing, loss, staleness accounting and metrics run here.


def tree_attention_cpu(module, query, key, value, attention_mask, *, tree_kv_index, tree_cu_seqlens_q,
                       tree_cu_seqlens_k, tree_max_seqlen_q, tree_max_seqlen_k, scaling=None, sliding_window=None,
                       softcap=None, **kwargs):
    """TRL's ``tree_attention`` (``packing.py``) in plain torch: each segment's queries attend, causally and aligned
    at the end as flash-attention's varlen kernel aligns them, to the keys of its root-to-segment path."""
    q, k, v = (x.transpose(1, 2)[0] for x in (query, key, value))  # (N, heads, d)
    k, v = k.index_select(0, tree_kv_index), v.index_select(0, tree_kv_index)
    repeat = q.shape[1] // k.shape[1]
    if repeat > 1:
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    cu_q, cu_k = tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist()
    out = torch.zeros_like(q)
    for s in range(len(cu_q) - 1):
        qs, ks, vs = q[cu_q[s]:cu_q[s + 1]], k[cu_k[s]:cu_k[s + 1]], v[cu_k[s]:cu_k[s + 1]]
        lq, lk = qs.shape[0], ks.shape[0]
        scores = torch.einsum("qhd,khd->hqk", qs.float(), ks.float()) * scale
        allowed = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        out[cu_q[s]:cu_q[s + 1]] = torch.einsum("hqk,khd->qhd", weights, vs.float()).to(q.dtype)
    return out.unsqueeze(0), None


class OnDemandQueue:
    """The rollout buffer TRL's trainer drains (``get``, ``qsize``, ``put_nowait``), filled by the worker when the
    trainer asks and it is empty: which weights drew each sample is then a function of the trainer's own schedule,
    and a run repeats."""

    def __init__(self, worker):
        import collections

        self.worker, self.items = worker, collections.deque()

    def get(self, timeout=None):
        if not self.items:
            self.worker.fill()
        return self.items.popleft()

    def put_nowait(self, item):
        self.items.append(item)

    def qsize(self):
        return len(self.items)


class CPURolloutWorker:
    """TRL's ``RolloutWorkerProtocol`` on the CPU: alpha is the model loaded again (as a vLLM server loads it), into
    which ``LocalWeightTransfer`` writes the trainer's weights at each sync; a group of G completions of the next
    prompt is drawn with ``generate`` when the queue runs dry, with the sampler's own log-probs and TRL's worker's
    advantages ((r - mean) / (std + 1e-8), population std). ``ahead`` groups are drawn at start, so the trainer
    consumes samples that many groups old: lags above 0 in a repeatable pattern."""

    def __init__(self, model_dir, tokenizer, prompts, answers, reward, num_generations, max_tokens, ahead=0, seed=0):
        import queue as queue_module

        from transformers import GenerationConfig

        self.engine = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tokenizer, self.prompts, self.answers, self.reward = tokenizer, prompts, answers, reward
        self.G, self.ahead = num_generations, ahead
        self.generation = GenerationConfig(do_sample=True, max_new_tokens=max_tokens, temperature=1.0, top_k=0,
                                           top_p=1.0, eos_token_id=[tokenizer.eos_token_id],
                                           pad_token_id=tokenizer.pad_token_id)
        self.rollout_buffer, self.metrics_queue = OnDemandQueue(self), queue_module.Queue()
        self.version, self.groups, self.rng = 0, 0, torch.Generator().manual_seed(seed)

    def start(self):
        for _ in range(self.ahead):
            self.fill()

    def stop(self):
        pass

    def update_model_version(self, model_version):
        self.version = model_version

    def check_health(self, stale_after_s):
        pass

    def fill(self):
        """One group of G completions of the next prompt, drawn with the engine's current weights."""
        import numpy as np
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        from llm.tensors.token_filter import NO_FILTER
        from llm.integrations.trl import _Recorder

        i = self.groups % len(self.prompts)
        prompt_ids = self.tokenizer(self.prompts[i])["input_ids"]
        recorder = _Recorder(1.0, NO_FILTER)
        state = torch.random.get_rng_state()
        torch.random.manual_seed(int(torch.randint(2**31, (1,), generator=self.rng)))
        with torch.no_grad():
            out = self.engine.generate(input_ids=torch.tensor([prompt_ids] * self.G), generation_config=self.generation,
                                       logits_processor=LogitsProcessorList([recorder]))
        torch.random.set_rng_state(state)
        logp = recorder.finish(out)
        completions, rows = [], []
        for g in range(self.G):
            c = out[g, len(prompt_ids):].tolist()
            n = c.index(self.tokenizer.eos_token_id) + 1 if self.tokenizer.eos_token_id in c else len(c)
            completions.append(c[:n])
            rows.append(logp[g, :n].tolist())
        texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
        rewards = np.array(self.reward(texts, [self.answers[i]] * self.G), dtype=float)
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
        for c, lp, a, r in zip(completions, rows, advantages, rewards):
            self.rollout_buffer.put_nowait(RolloutSample(
                prompt=self.prompts[i], completion=texts[0], input_ids=np.asarray(prompt_ids + c, dtype=np.int64),
                completion_mask=np.asarray([0] * len(prompt_ids) + [1] * len(c), dtype=np.int64),
                old_log_probs=np.asarray([0.0] * len(prompt_ids) + lp, dtype=np.float32), advantage=float(a),
                model_version=self.version, group_id=self.groups, metrics={"reward": float(r)}))
        self.groups += 1


class LocalWeightTransfer:
    """TRL's ``WeightTransferProtocol``: the trainer's weights written into the CPU worker's engine by name."""

    def __init__(self, worker):
        self.worker = worker

    def init_weight_transfer(self):
        pass

    def pause(self):
        pass

    def send_weights(self, iterator):
        params = dict(self.worker.engine.named_parameters())
        with torch.no_grad():
            for name, tensor in iterator:
                params[name].copy_(tensor)

    def resume(self):
        pass

    def destroy(self):
        pass


def async_trainer(out_dir, steps=6, ahead=4, weight_sync_steps=1, callbacks=(), learning_rate=3e-4, bf16=False):
    """TRL's AsyncGRPOTrainer on the built-in model and task with the CPU stand-ins: 8 samples a step (groups of
    G = 4), ``ahead`` groups drawn before the first step."""
    from datasets import Dataset
    from transformers import AttentionInterface
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from llm.models.model import load_tokenizer
    from llm.models.tiny import tiny_model_dir

    model_dir = str(tiny_model_dir())
    tok = load_tokenizer(model_dir)
    worker = CPURolloutWorker(model_dir, tok, list(TASK.prompts), list(TASK.answers),
                              lambda texts, answers: exact_reward(texts, answers), num_generations=4, max_tokens=6,
                              ahead=ahead)
    args = AsyncGRPOConfig(output_dir=str(out_dir), max_steps=steps, per_device_train_batch_size=8, num_generations=4,
                           max_completion_length=6, learning_rate=learning_rate, logging_steps=1, report_to="none",
                           save_strategy="no", use_cpu=True, seed=0, dtype="float32", token_budget=0,
                           max_staleness=100, weight_sync_steps=weight_sync_steps, disable_tqdm=True, bf16=bf16)
    from unittest import mock

    # its __init__ asks torch.cuda for the device's name (the peak FLOP/s of its MFU metric): unknown on a CPU
    with mock.patch("trl.experimental.async_grpo.async_grpo_trainer.get_peak_flops_per_device", return_value=None):
        trainer = AsyncGRPOTrainer(model=model_dir, reward_funcs=[exact_reward], args=args,
                                   train_dataset=Dataset.from_dict({"prompt": list(TASK.prompts),
                                                                    "answer": list(TASK.answers)}),
                                   processing_class=tok, callbacks=list(callbacks), rollout_worker=worker,
                                   weight_transfer=LocalWeightTransfer(worker))
    AttentionInterface.register("tree_fa3", tree_attention_cpu)  # after the trainer registered its CUDA kernel's
    return trainer, worker
