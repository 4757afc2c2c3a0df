"""The stages of a step between generation and the update and the diagnostics after it, by stage: ``score``
(rewards, dynamic sampling, advantages), ``behaviour`` (log alpha), ``diagnose`` (TV and Theorem 1's estimates). This
module names them in one place; ``llm.step.step.run_step`` runs them."""

from llm.step.behaviour import Behaviour, alpha_logprobs, sampler_logprobs
from llm.step.diagnose import Heldout, diagnose, heldout_before_update, heldout_estimates, insample_estimates
from llm.step.score import Groups, Scored, VariedGroups, advantages, group_batch, reward_metrics, score

__all__ = ["Behaviour", "Groups", "Heldout", "Scored", "VariedGroups", "advantages", "alpha_logprobs", "diagnose",
           "group_batch", "heldout_before_update", "heldout_estimates", "insample_estimates", "reward_metrics",
           "sampler_logprobs", "score"]
