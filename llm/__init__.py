"""Off-policy GRPO on causal language models: ``train(GRPOConfig(...))`` or ``python -m llm train``."""

from llm.config import GRPOConfig


def train(config: GRPOConfig, log=print, callbacks=()):
    """Run Algorithm 1 with ``config`` (``llm.run.trainer.train``); returns the run directory."""
    from llm.run.trainer import train as _train  # torch and transformers load here, not at ``import llm``

    return _train(config, log=log, callbacks=callbacks)


__all__ = ["GRPOConfig", "train"]
