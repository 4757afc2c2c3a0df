"""Whether the sampler holds the weights it was sent: the gap between the sampler's log alpha and the trainer's
recomputation right after a sync (``sampler_gap``), the rule that tells a stale sampler from float rounding
(``SyncCheck``, one per dtype), and the start-up probe's separation (``llm.sampling.probe_sync``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from llm.tensors.logit_head import head_tolerance
from llm.tensors.token_filter import ON_SET_LOGP


def sampler_gap(logp_sampler: torch.Tensor, logp_trainer: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """|sampler's log alpha - trainer's recomputation| over the completion tokens: the worst token of all, and the mean
    over the tokens both sides keep (a top-k/top-p/min-p boundary that the two sides' roundings place differently
    gives one side's off-set value, -10^4: the worst token shows it, the mean leaves it out)."""
    diff = (logp_sampler - logp_trainer).abs() * mask
    on = mask * ((logp_sampler > ON_SET_LOGP) & (logp_trainer > ON_SET_LOGP))
    return {"sampling/logp_diff_mean": float((diff * on).sum() / on.sum().clamp(min=1.0)),
            "sampling/logp_diff_max": float(diff.max())}


@dataclass(frozen=True)
class SyncCheck:
    """How a stale sampler is told from float rounding right after a sync: ``sampler_gap``'s ``metric`` above
    ``tolerance``, or above ``floor_factor`` times the run's rounding floor (the first check's value, when the
    sampler holds the policy's own initial weights), whichever is larger (``threshold``)."""

    metric: str
    tolerance: float
    floor_factor: float = 0.0

    def gap(self, logp_sampler: torch.Tensor, logp_trainer: torch.Tensor, mask: torch.Tensor) -> float:
        return sampler_gap(logp_sampler, logp_trainer, mask)[self.metric]

    def threshold(self, floor: float | None = None) -> float:
        return max(self.tolerance, self.floor_factor * floor) if floor is not None else self.tolerance

    def stale(self, row: dict, floor: float | None = None) -> float | None:
        """The row's gap if it is above the threshold, else None (also when the row has no sync check)."""
        gap = row.get(self.metric)
        return gap if gap is not None and gap > self.threshold(floor) else None


#: The sync check of each dtype. float32: the worst token; sampler and trainer agree to ~5e-6 at the median step's
#: worst token and up to ~7e-5 on rare tokens (log-prob < -10) over ~1,500 tokens, and a stale engine is off by more
#: than 1 nat. bfloat16: the token mean over twice the rounding floor the run's first check measures (0.02 at least).
#: The worst token's rounding is heavy-tailed and grows with the batch, and the mean's floor depends on the model and
#: the engine: right after syncs the built-in model (trainer in bfloat16 autocast, transformers sampler) gave worst
#: tokens up to 0.57 nats and means 0.003-0.007 (0.041-0.10 one to three steps stale: tests/llm/test_trainer.py,
#: test_the_sync_check_tells_a_skipped_sync_from_rounding, on both kernel sets of an AVX-512 host); SmolLM2-135M with
#: vLLM in bfloat16 worst tokens 0.36-0.47 and means 0.036-0.040, against 0.099-0.105 one and two steps stale at
#: learning rate 1e-5 (``python benchmarks/archive/lag0_bias.py --dtype bfloat16 --top-p 1 [--skip-syncs]``). No absolute
#: threshold separates both models; twice each run's own floor does.
SYNC_CHECKS = {"float32": SyncCheck("sampling/logp_diff_max", 1e-3),
               "bfloat16": SyncCheck("sampling/logp_diff_mean", 0.02, floor_factor=2.0)}


def sync_check(dtype: str, temperature: float = 1.0) -> SyncCheck:
    """The sync check of ``dtype`` at ``temperature``: its tolerance divided by the temperature below 1
    (``llm.tensors.logit_head.head_tolerance``: the logits' rounding is), so a run at temperature 0.01 does not read
    rounding as a stale engine, which is off by far more at any temperature."""
    check = SYNC_CHECKS[dtype]
    return replace(check, tolerance=head_tolerance(temperature, check.tolerance))


#: The start-up probe in bfloat16 (``llm.sampling.probe_sync``): the sampler's log-probs after syncing perturbed
#: weights must be this many times closer (token mean) to the perturbed weights' than to the unperturbed ones'. On
#: SmolLM2-135M with vLLM in bfloat16: 0.050 nats to the synced weights against 0.138 to the ones before with top-p 0.9
#: (2.7 times), 0.033 against 0.41 without a filter (the same command); an engine that missed the sync would sit near
#: the ones before (closer to them than to the synced weights).
PROBE_SEPARATION = 2.0
