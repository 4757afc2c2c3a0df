"""This project's readings inside TRL 1.16's ``AsyncGRPOTrainer`` (``trl.experimental.async_grpo``), where a rollout
worker keeps sampling while the trainer trains, so every sample carries its own staleness (docs/integrations.md).

``watch(trainer, ...)`` takes a built ``AsyncGRPOTrainer`` as it takes a ``GRPOTrainer``. What it reads, without
changing what the trainer does:

- the rollout worker's ``update_model_version`` (wrapped; TRL calls it at the end of every weight sync): the
  optimiser step each weight version was published at (``model_version`` counts syncs: with ``weight_sync_steps``
  N, version v holds the weights of the step its sync followed);
- the rollout queue's ``get`` (wrapped, on the trainer's process): each sample's ``model_version``, which TRL's
  dataset drops before the batch is packed (it yields input ids, masks, old log-probs and advantages only);
- the data collator's ``torch_call`` (wrapped, once the trainer built its dataloader): which samples each packed
  micro-batch holds, in the order of their ``segment_id``;
- ``compute_loss`` (wrapped) with a forward hook on the model: the policy's log-probs TRL's fused head computes for
  the loss (detached), against the sampler's (``old_log_probs``, the vLLM server's own), per sample.

The lag of a sample is the optimiser step it is trained at minus the step of the weights that drew it, read when
the loss uses it. TRL's own ``sample/staleness_mean`` counts versions when its dataset hands the sample over, which
is one batch early when accelerate's dataloader fetches ahead; the two are compared in the tests. There is no
trainer-side forward of the sampler's weights here, so no staleness/mismatch split; at lag 0 the sampler's log-probs
against the trainer's are the sync check. Held-out prompts are refused (the sampler is another process's).
"""

from __future__ import annotations

import collections

import numpy as np
import torch

from llm.integrations.readings import MicroBatch, WatchOptions
from llm.integrations.watcher import Watcher

#: Samples the queue hands over whose micro-batch is not packed yet (TRL drops too-stale ones): kept at most this many.
PENDING_MAX = 100_000


class AsyncWatcher(Watcher):
    """The watcher of one ``AsyncGRPOTrainer`` (module docstring)."""

    def __init__(self, trainer, options: WatchOptions):
        if options.heldout_prompts:
            raise ValueError("watch: heldout_prompts with AsyncGRPOTrainer is not supported (its sampler is a server "
                             "process the watcher cannot draw from); the in-sample readings (heldout_prompts=0) are")
        super().__init__(trainer, options, self.sync_dtype_of(trainer, options))
        self.versions: dict[int, int] = {}  # model_version -> the optimiser step whose weights it published
        self.pending: collections.OrderedDict[int, tuple[int, object]] = collections.OrderedDict()
        self.batches: collections.deque[list[tuple[int, int]]] = collections.deque()  # (group_id, version) per sample
        self.captured: torch.Tensor | None = None
        self.capturing = False

    @staticmethod
    def sync_dtype_of(trainer, options: WatchOptions) -> str:
        engine = options.engine_dtype if options.engine_dtype != "auto" else str(trainer.args.dtype)
        half = bool(trainer.args.bf16 or trainer.args.fp16) or engine in ("bfloat16", "float16")
        return "bfloat16" if half else "float32"

    def attach(self) -> None:
        t = self.trainer
        self.wrap("get_train_dataloader", "compute_loss")
        if t.rollout_worker is not None:  # the trainer's process (rank 0): the worker, its queue
            published = t.rollout_worker.update_model_version
            t.rollout_worker.update_model_version = lambda version: self._published(published, version)
            original = t.rollout_queue.get
            t.rollout_queue.get = lambda *args, **kwargs: self._queue_get(original, *args, **kwargs)
        model = t.accelerator.unwrap_model(t.model)
        model.register_forward_hook(self._forward_hook, with_kwargs=True)
        super().attach(["lag (per sample)", "tv/pi_k_alpha", "ess/pi_k_alpha", "sampling/logp_diff_* at lag 0"])

    # -- wrapped -------------------------------------------------------------------------------------------------
    def _published(self, original, version):
        """TRL's sync has published ``version``: the weights of the optimiser step the trainer is at."""
        self.versions[int(version)] = self.trainer.state.global_step
        return original(version)

    def _queue_get(self, original, *args, **kwargs):
        sample = original(*args, **kwargs)
        if not self.stopped:
            self.pending[id(sample.input_ids)] = (int(sample.model_version), sample.input_ids)  # the array kept alive
            while len(self.pending) > PENDING_MAX:
                self.pending.popitem(last=False)
        return sample

    def _get_train_dataloader(self, original):
        loader = original()
        collator = getattr(loader, "collate_fn", None)
        if collator is not None and hasattr(collator, "torch_call"):
            packed = collator.torch_call
            collator.torch_call = lambda examples: self._torch_call(packed, examples)
        else:
            self.say("offpolicy-grpo watch: the dataloader has no rollout collator to read: no per-sample lags")
        return loader

    def _torch_call(self, original, examples):
        batch = original(examples)
        if not self.stopped:
            self.guarded(self.note_batch, examples)
        return batch

    def note_batch(self, examples) -> None:
        (rows,) = examples
        rank = self.trainer.accelerator.process_index
        row = rows[rank] if rank < len(rows) else rows[0]
        self.batches.append([(int(s["group_id"]), self.pending.pop(id(s["input_ids"]), (-1, None))[0])
                             for s in row.samples])

    def _forward_hook(self, module, args, kwargs, output):
        if self.capturing and kwargs.get("fused_lm_head") and getattr(output, "log_probs", None) is not None:
            self.captured = output.log_probs.detach()

    def _compute_loss(self, original, model, inputs, *args, **kwargs):
        if not self.trainer.model.training or self.stopped:
            return original(model, inputs, *args, **kwargs)
        self.capturing, self.captured = True, None
        try:
            loss = original(model, inputs, *args, **kwargs)
        finally:
            self.capturing = False
        self.guarded(self.record, inputs, self.captured)
        self.captured = None
        return loss

    # -- observations --------------------------------------------------------------------------------------------
    def record(self, inputs, log_probs: torch.Tensor | None) -> None:
        """One packed micro-batch: per sample, log pi_k/alpha over its trained tokens (TRL's fused head against the
        sampler's ``old_log_probs``), its lag and its group (the prompt's label)."""
        if log_probs is None:
            raise RuntimeError("AsyncGRPO's loss ran no fused forward to read")
        if not self.batches:
            raise RuntimeError("a micro-batch the watcher saw no packing of")
        meta = self.batches.popleft()
        selected = inputs["token_index"] >= 0
        token_index = inputs["token_index"][selected]
        logp = log_probs.flatten()[token_index].float()
        old = inputs["old_log_probs"][selected].float()
        segment = inputs["segment_id"][selected].long()
        n = len(meta)
        log_w = torch.zeros(n, dtype=torch.float64, device=logp.device).index_add_(0, segment,
                                                                                 (logp - old).double())
        trained = torch.bincount(segment, minlength=n).cpu().numpy() > 0
        step = self.trainer.state.global_step
        lag = np.array([step - self.versions.get(v, step) if v >= 0 else -1 for _, v in meta])
        keep = trained & (lag >= 0)
        gap = None
        fresh = torch.from_numpy(keep & (lag == 0)).to(segment.device)[segment]  # tokens of samples at lag 0
        if bool(fresh.any()):  # the sampler held pi_k's weights: its log-probs against the trainer's, the sync check
            gap = (old[None].cpu(), logp[None].cpu(), fresh[None].float().cpu())
        groups = np.array([g for g, _ in meta], dtype=np.int64)
        self.parts.append(MicroBatch(lag[keep], groups[keep], log_w.cpu().numpy()[keep], None, gap))
