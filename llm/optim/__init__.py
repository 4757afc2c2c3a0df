"""The optimise phase and what drives it: ``update`` (i optimiser steps on the clipped off-policy objective, each over
the step's micro-batches) and ``schedule`` (AdamW and its learning-rate schedule)."""

from llm.optim.schedule import Schedule, make_optimizer
from llm.optim.update import Objective, Optimised, optimise

__all__ = ["Objective", "Optimised", "Schedule", "make_optimizer", "optimise"]
