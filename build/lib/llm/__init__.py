"""Off-policy GRPO on causal language models: ``train(GRPOConfig(...))`` or ``python -m llm.train``."""

from .config import GRPOConfig


def train(config: GRPOConfig, log=print, callbacks=()):
    """Run Algorithm 1 with ``config`` (``llm.trainer.train``); returns the run directory."""
    from .trainer import train as _train  # torch and transformers load here, not at ``import llm``

    return _train(config, log=log, callbacks=callbacks)


__all__ = ["GRPOConfig", "train"]
