"""Exact, tabular mathematics of off-policy GRPO (Mroueh et al., arXiv 2505.22257).

Pure numpy functions, float64, vectorised over leading batch dimensions; see PAPER.md for the
statements and README.md for the symbol table.
"""

from .amplification import (
    closed_form_iterates,
    local_convergence_beta,
    mirror_success_iterates,
    success_fixed_point,
    success_fixed_points,
    success_iterates,
    success_map,
    success_map_derivative,
)
from .core import (
    PAPER_CONSTANT,
    BoundTerms,
    bernoulli_penalty_weight,
    bound_constant,
    bound_terms,
    clip_objective,
    clipped_surrogate,
    combine_bound,
    expected_reward,
    group_advantages,
    improvement_lower_bound,
    kl_divergence,
    lag_penalty,
    penalty_weight,
    reward_std,
    surrogate,
    tv_distance,
    tv_penalty,
    whitened_advantage,
)

__all__ = [
    "PAPER_CONSTANT",
    "BoundTerms",
    "bernoulli_penalty_weight",
    "bound_constant",
    "bound_terms",
    "clip_objective",
    "clipped_surrogate",
    "closed_form_iterates",
    "combine_bound",
    "expected_reward",
    "group_advantages",
    "improvement_lower_bound",
    "kl_divergence",
    "lag_penalty",
    "local_convergence_beta",
    "mirror_success_iterates",
    "penalty_weight",
    "reward_std",
    "success_fixed_point",
    "success_fixed_points",
    "success_iterates",
    "success_map",
    "success_map_derivative",
    "surrogate",
    "tv_distance",
    "tv_penalty",
    "whitened_advantage",
]
