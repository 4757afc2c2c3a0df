"""Config validation: every bad value raises ``ValueError("<field>: <why>, got <value>")``."""

from __future__ import annotations

import dataclasses
import math


def require(config, cond: bool, field: str, why: str) -> None:
    """Raise ``ValueError("<field>: <why>, got <value>")`` unless ``cond``."""
    if not cond:
        raise ValueError(f"{field}: {why}, got {getattr(config, field)!r}")


def require_finite(config) -> None:
    """Every float field of the dataclass ``config`` is a finite number (nan and +-inf pass no comparison
    check by accident, but ``inf`` would pass ``> 0``)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, float):
            require(config, math.isfinite(value), f.name, "must be a finite number")
