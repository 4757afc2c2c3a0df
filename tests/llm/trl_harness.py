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
