"""M2PO's mask as its paper states it against AReaL's, on synthetic steps: ``python benchmarks/archive/m2po_masks.py`` (a
second). Each step has 16 completions of 20 tokens, log pi_k/alpha ~ N(0, s^2) per token (s = 0.3 by default), and
each completion's advantage -1, 0 or +1 (a third each); threshold 0.04. Printed over 20 steps: how many more tokens
AReaL's every-token mask drops than the paper's trust-region mask (median and range of the ratio), the share of
AReaL's drops outside the trust region, and how far AReaL's gradient is from the paper's at pi = pi_k (the
objective keep x (pi/alpha) x A has gradient keep x w x A along each token's grad log pi: the relative distance of
those per-token coefficient vectors).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from grpo_theory.corrections import second_moment_keep, trust_region_second_moment_keep  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=0.3, help="standard deviation of log pi_k/alpha per token")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    g = np.random.default_rng(0)
    ratio, outside, distance, paper_share, areal_share = [], [], [], [], []
    for _ in range(args.steps):
        log_w = g.normal(scale=args.scale, size=(16, 20)).ravel()
        adv = np.repeat(g.choice([-1.0, 0.0, 1.0], size=(16, 1)), 20, axis=1).ravel()
        paper = trust_region_second_moment_keep(log_w, adv, None, 0.04)
        areal = second_moment_keep(log_w, None, 0.04)
        region = ((adv > 0) & (log_w > 0)) | ((adv < 0) & (log_w < 0))
        ratio.append((~areal).sum() / max((~paper).sum(), 1))
        outside.append(((~areal) & ~region).sum() / max((~areal).sum(), 1))
        coef = lambda keep: keep * np.exp(log_w) * adv  # noqa: E731
        distance.append(np.linalg.norm(coef(areal) - coef(paper)) / np.linalg.norm(coef(paper)))
        paper_share.append(np.mean(~paper))
        areal_share.append(np.mean(~areal))
    print(f"{args.steps} steps, log w ~ N(0, {args.scale}^2): tokens dropped, paper {np.mean(paper_share):.1%}, "
          f"AReaL {np.mean(areal_share):.1%}; AReaL / paper: median {np.median(ratio):.2f}x (range {min(ratio):.2f}-"
          f"{max(ratio):.2f}); AReaL's drops outside the trust region {np.mean(outside):.0%}; AReaL's gradient "
          f"{np.median(distance):.0%} from the paper's (median; range {min(distance):.0%}-{max(distance):.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
