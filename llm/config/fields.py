"""What the config's groups share: the resumable mark, the bounds on temperatures, the one-line checks."""

from __future__ import annotations

import dataclasses

from runkit.validation import require, require_finite

__all__ = ["MIN_TEMPERATURE", "MAX_TEMPERATURE", "resumable", "require", "require_finite"]

#: Sampling temperatures accepted (vLLM treats lower ones as greedy decoding, which has no log-probabilities to
#: importance-weight; higher ones make every completion uniform noise).
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 100.0


def resumable(default):
    """A field that may change when a run is resumed: it does not change what a step computes (up to float rounding
    for the micro-batch and chunk sizes, shared prompts, sharding with FSDP and the device: a checkpoint written on a
    GPU resumes on a CPU; a restarted server may listen elsewhere). ``llm.run.rundir`` compares every other field."""
    return dataclasses.field(default=default, metadata={"resumable": True})

