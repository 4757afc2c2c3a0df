"""Config validation: every bad value raises ``ValueError("<field>: <why>, got <value>")``."""

from __future__ import annotations


def require(config, cond: bool, field: str, why: str) -> None:
    """Raise ``ValueError("<field>: <why>, got <value>")`` unless ``cond``."""
    if not cond:
        raise ValueError(f"{field}: {why}, got {getattr(config, field)!r}")
