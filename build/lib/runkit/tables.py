"""Results tables of repeated runs: one cell format for a quantity measured over seeds."""

from __future__ import annotations

import numpy as np


def mean_std(xs, fmt: str = ".3f") -> str:
    """``mean ± std`` over seeds, NaN meaning "never happened" (e.g. a target not reached): ``never`` when
    no seed has a value, ``k/n reach; mean ± std`` (over the k) when some lack one."""
    xs = np.asarray(xs, dtype=float)
    if np.all(np.isnan(xs)):
        return "never"
    reached = f"{np.sum(~np.isnan(xs))}/{xs.size} reach; " if np.any(np.isnan(xs)) else ""
    return f"{reached}{np.nanmean(xs):{fmt}} ± {np.nanstd(xs):{fmt}}"
