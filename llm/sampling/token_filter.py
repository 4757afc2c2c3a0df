"""The samplers' entry point to the kept sets: ``llm.tensors.token_filter`` (the module itself sits below the samplers, beside
the models, since the trainer's log-probabilities use it too)."""

from llm.tensors.token_filter import (NO_FILTER, OFF_SET_LOGP, TokenFilter, boundary_value, filtered_log_softmax,
                                   filtered_logits, kept_mask)

__all__ = ["NO_FILTER", "OFF_SET_LOGP", "TokenFilter", "boundary_value", "filtered_log_softmax", "filtered_logits",
           "kept_mask"]
