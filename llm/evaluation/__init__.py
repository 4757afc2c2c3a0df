"""How good a policy is: the exact expected reward where the task allows it (``exact``: J(pi | x) from the accepted
completions' probabilities), pass@k and maj@k from samples (``passk``), and the evaluation on the test prompts that
combines them (``policy_eval``; docs/theory.md, §8.1 and §8.3)."""

from llm.evaluation.exact import EXACT_J_BATCH, exact_j, mean_exact_j, prompt_exact_j
from llm.evaluation.passk import exact_pass_at_k, maj_at_k, pass_at_k
from llm.evaluation.policy_eval import EvalSpec, answer_key, evaluate

__all__ = ["EXACT_J_BATCH", "EvalSpec", "answer_key", "evaluate", "exact_j", "exact_pass_at_k", "maj_at_k",
           "mean_exact_j", "pass_at_k", "prompt_exact_j"]
