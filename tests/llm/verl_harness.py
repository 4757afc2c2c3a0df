"""verl 0.9.1's own actor update on this CPU, for tests/llm/test_integrations_verl.py (run in .venv-bench by
``make check-verl``).

verl's ``TrainingWorker`` and its FSDP2 engine run here in one process once four things of a GPU machine are
stood in for: a CPU device platform (verl asks its platform registry; none is for the CPU), a gloo process group
(verl's default pairs gloo with NCCL), the engine registry's device (``VERL_ENGINE_DEVICE=cuda`` picks verl's FSDP
engine, which then runs on the platform's device), sdpa attention in place of flash-attention 2, and verl's patch
of TRL's value-head model (absent from TRL 1.16). What runs is verl's: the worker, the engine, its micro-batching,
``ppo_loss`` and the optimiser, the advantage of ``core_algos``, the padding conversions. The rollout is the model's
``generate`` with the worker's weights (verl's would be vLLM or SGLang), which reports its own log-probs as
``rollout.calculate_log_probs`` makes verl's engines do.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

from llm.tasks import arithmetic_task

TASK = arithmetic_task()
_READY = False


def cpu_verl() -> None:
    """Make verl's worker run on this CPU in this process (module docstring); idempotent."""
    global _READY
    if _READY:
        return
    for key, value in dict(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                           VERL_ENGINE_DEVICE="cuda").items():
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    from verl.plugin.platform import platform_manager
    from verl.plugin.platform.platform_base import PlatformBase

    class _CPUModule:
        """torch.cpu, with the memory statistics verl logs (0 here) and a device name."""

        def __getattr__(self, name):
            if hasattr(torch.cpu, name):
                return getattr(torch.cpu, name)
            if name == "get_device_name":
                return lambda *a, **k: "CPU"
            if name == "mem_get_info":
                return lambda *a, **k: (0, 0)
            if "memory" in name:
                return lambda *a, **k: 0
            raise AttributeError(name)

    class CPUPlatform(PlatformBase):
        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: _CPUModule())

        def is_available(self): return True
        def current_device(self): return "cpu"
        def device_count(self): return 1
        def set_device(self, index): pass
        def synchronize(self, index=None): pass
        def manual_seed(self, seed): torch.manual_seed(seed)
        def manual_seed_all(self, seed): torch.manual_seed(seed)
        def set_allocator_settings(self, settings): pass
        def empty_cache(self): pass
        def get_device_capability(self, index=0): return (None, None)
        def communication_backend_name(self): return "gloo"
        def visible_devices_envvar(self): return "CPU_VISIBLE_DEVICES"
        def nvtx_range(self, msg): return contextlib.nullcontext()
        def profiler_start(self): pass
        def profiler_stop(self): pass
        def ray_resource_name(self): return "CPU"
        def ray_noset_envvars(self): return []
        def is_ipc_supported(self): return False
        def cudart(self): return None

    platform_manager.set_platform(CPUPlatform())
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1)
    import verl.models.transformers.monkey_patch as monkey_patch

    monkey_patch.is_trl_available = lambda: False  # verl patches TRL's value head, which TRL 1.16 no longer has
    _READY = True


def close() -> None:
    """The process group ``cpu_verl`` made, destroyed (verl's platform stays: it is verl's alone)."""
    global _READY
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    _READY = False


def build_worker(model_dir: str, lr: float = 1e-3, micro_batch: int = 4, seed: int = 0):
    """verl's ``TrainingWorker`` (FSDP2, float32, no dynamic batch size) on the model, with verl's ``ppo_loss``
    (vanilla clip, ``token-mean``) as ``ActorRolloutRefWorker.init_model`` sets it."""
    from functools import partial

    from verl.workers.config import ActorConfig, FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine_workers import TrainingWorker, TrainingWorkerConfig
    from verl.workers.utils.losses import ppo_loss

    cpu_verl()
    torch.manual_seed(seed)
    model = HFModelConfig(path=model_dir, override_config={"attn_implementation": "sdpa"})
    engine = FSDPEngineConfig(strategy="fsdp2", model_dtype="fp32", use_torch_compile=False, use_dynamic_bsz=False,
                              micro_batch_size_per_gpu=micro_batch, infer_micro_batch_size_per_gpu=micro_batch,
                              seed=seed)
    optim = FSDPOptimizerConfig(lr=lr, total_training_steps=1000, clip_grad=1.0)
    worker = TrainingWorker(TrainingWorkerConfig(model_type="language_model", model_config=model,
                                                 engine_config=engine, optimizer_config=optim))
    worker.reset()
    actor = ActorConfig(strategy="fsdp2", ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=micro_batch,
                        rollout_n=1, use_dynamic_bsz=False)
    worker.set_loss_fn(partial(ppo_loss, config=actor))
    return worker


def worker_state(worker) -> dict[str, torch.Tensor]:
    """The worker's weights as plain tensors (FSDP2's DTensors gathered)."""
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in worker.engine.module.state_dict().items()}


class Engine:
    """The rollout: the model in ``dtype``, loaded with the worker's weights at each ``sync`` (``stale``: never again
    after the first), sampling with ``generate`` and reporting log alpha of what it drew (its forward, tempered)."""

    def __init__(self, model_dir: str, dtype=torch.float32, stale: bool = False):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.tok.padding_side = "left"
        self.dtype, self.stale, self.synced = dtype, stale, False

    def sync(self, worker) -> None:
        if self.stale and self.synced:
            return
        state = worker_state(worker)
        self.model.load_state_dict({k: v.to(self.dtype) for k, v in state.items()}, strict=False)
        self.synced = True

    @torch.no_grad()
    def rollout(self, rows: np.ndarray, group: int, max_new: int, temperature: float, seed: int):
        """A verl batch (``DataProto``) of ``group`` completions per task row, with ``uid``, rewards per completion
        (the task's exact reward) and the engine's ``rollout_log_probs``."""
        from verl import DataProto

        prompts = [TASK.prompts[i] for i in rows for _ in range(group)]
        answers = [TASK.answers[i] for i in rows for _ in range(group)]
        enc = self.tok(prompts, return_tensors="pt", padding=True)
        torch.manual_seed(seed)
        out = self.model.generate(**enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                  max_new_tokens=max_new, pad_token_id=self.tok.pad_token_id,
                                  eos_token_id=self.tok.eos_token_id)
        P = enc.input_ids.shape[1]
        resp = out[:, P:]
        if resp.shape[1] < max_new:
            resp = torch.nn.functional.pad(resp, (0, max_new - resp.shape[1]), value=self.tok.pad_token_id)
        mask = torch.ones_like(resp)
        for i in range(resp.shape[0]):
            ends = (resp[i] == self.tok.eos_token_id).nonzero()
            if len(ends):
                mask[i, int(ends[0]) + 1:] = 0
        ids = torch.cat([enc.input_ids, resp], 1)
        attention = torch.cat([enc.attention_mask, mask], 1)
        positions = (attention.cumsum(1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids, attention_mask=attention, position_ids=positions).logits.float()
        logp = torch.log_softmax(logits[:, P - 1:-1] / temperature, -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
        texts = self.tok.batch_decode([r[m.bool()] for r, m in zip(resp, mask)], skip_special_tokens=True)
        rewards = torch.tensor([float(t.strip() == a) for t, a in zip(texts, answers)])
        uid = np.array([f"{seed}-{i}" for i in rows for _ in range(group)], dtype=object)
        return DataProto.from_dict(
            tensors={"prompts": enc.input_ids, "responses": resp, "input_ids": ids, "attention_mask": attention,
                     "position_ids": positions, "response_mask": mask.float(),
                     "rollout_log_probs": (logp * mask).float()},
            non_tensors={"uid": uid}, meta_info={"temperature": temperature}), rewards


def old_log_probs(worker, batch) -> torch.Tensor:
    """verl's ``_compute_old_log_prob``: the actor's forward of the batch at its current weights (``infer_batch``)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=True, compute_loss=False)
    out = worker.infer_batch(td)
    return no_padding_2_padding(tu.get(out, "log_probs"), td).float()


def update(worker, batch, rewards: torch.Tensor, mini_batch: int, epochs: int, remove_rollout: bool = False,
           drop_uid: bool = False) -> dict:
    """verl's ``_compute_old_log_prob``, GRPO's outcome advantage (``core_algos``), then ``_update_actor``:
    ``train_mini_batch`` over mini-batches of ``mini_batch`` completions for ``epochs``, unshuffled (``drop_uid``: the
    prompts' uid removed after the advantage). Returns verl's
    metrics of the update (a list per key: one entry per optimiser step)."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    batch.batch["old_log_probs"] = old_log_probs(worker, batch)
    mask = batch.batch["response_mask"]
    scores = torch.zeros_like(mask)
    last = (mask.sum(1).long() - 1).clamp(min=0)
    scores[torch.arange(mask.shape[0]), last] = rewards
    advantages, returns = compute_grpo_outcome_advantage(scores, mask, batch.non_tensor_batch["uid"])
    batch.batch["advantages"], batch.batch["returns"] = advantages, returns
    if remove_rollout:
        batch.batch.pop("rollout_log_probs")
    if drop_uid:  # after the advantage, which groups by it
        batch.non_tensor_batch.pop("uid")
    td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=False, global_batch_size=mini_batch, mini_batch_size=mini_batch,
                         epochs=epochs, seed=1, dataloader_kwargs={"shuffle": False}, compute_loss=True)
    return dict(tu.get(worker.train_mini_batch(td), "metrics"))


def main(argv: list[str] | None = None) -> int:
    """``make check-verl``'s run: verl's actor update watched for ``--steps`` updates on the tiny model (8 prompts x
    4 completions, up to 6 tokens, 2 mini-batches x 2 epochs: lags 0-3), then the watcher's per-lag table."""
    import argparse
    import time

    from llm.integrations.verl import watch
    from llm.models.tiny import tiny_model_dir

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--stale-engine", action="store_true", help="the engine never receives the weights again")
    parser.add_argument("--model", default="", help="a local model directory (default: the built-in tiny model)")
    args = parser.parse_args(argv)
    model = args.model or str(tiny_model_dir())
    worker = build_worker(model, lr=args.lr)
    watch(worker, summary_file=None)
    engine = Engine(model, stale=args.stale_engine)
    rng = np.random.default_rng(0)
    for step in range(args.steps):
        start = time.perf_counter()
        engine.sync(worker)
        batch, rewards = engine.rollout(rng.choice(len(TASK.prompts), 8, replace=False), 4, 6, 1.0, step)
        row = update(worker, batch, rewards, mini_batch=16, epochs=2)
        print(f"update {step}: reward {rewards.mean():.3f}, verl's pg_loss {np.mean(row['actor/pg_loss']):+.4f}, "
              f"TV by lag {' '.join(f'{v:.3f}' for v in row['tv/pi_k_alpha'])} ({time.perf_counter() - start:.1f} s)")
    print(worker.offpolicy_watch.table.markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
