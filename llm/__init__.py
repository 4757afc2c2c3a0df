"""Off-policy GRPO on causal language models: ``train(GRPOConfig(...))`` or ``python -m llm.train``."""

from .config import GRPOConfig


def train(config: GRPOConfig, log=print):
    """Run Algorithm 1 (see ``llm.trainer.train``); returns the run directory."""
    from .trainer import train as _train

    return _train(config, log=log)


__all__ = ["GRPOConfig", "train"]
