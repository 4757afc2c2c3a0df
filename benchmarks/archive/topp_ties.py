"""Ties at the top-p boundary on bfloat16 logits: ``python benchmarks/archive/topp_ties.py``.

400 rows of logits 2.5 x N(0, 1) rounded to bfloat16 (held in float32, as the samplers compute), for vocabularies of
2,048, 8,192 and 49,152 tokens, top-p 0.9. Printed per vocabulary: the share of rows whose boundary tie vLLM's cut
splits; the rows whose kept set differs from vLLM's own (``apply_top_k_top_p_pytorch``, its CPU path) by the
project's rule (``llm.tensors.token_filter.kept_mask``: vLLM's sort, so its order of ties) and by the rule before
2026-11-27 (the same cut with ties ordered by column, a stable sort); and the mean over tokens sampled from vLLM's
filtered distribution of the trainer's log-probability minus vLLM's, by the project's rule and by the rule that kept
the whole tie ({z >= tau}). docs/theory.md, §1.1 quotes the output.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from llm.tensors.token_filter import TokenFilter, boundary_value, filtered_log_softmax, kept_mask  # noqa: E402


def column_order_kept(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """The earlier rule: vLLM's cut with the sort made stable (ties by column)."""
    srt, idx = z.sort(dim=-1, stable=True)
    drop = srt.softmax(dim=-1).cumsum(dim=-1) <= 1 - torch.tensor(top_p)
    drop[..., -1] = False
    return ~drop.scatter(-1, idx, drop)


def main() -> None:
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    f = TokenFilter(top_p=0.9)
    for vocab in (2048, 8192, 49152):
        z = (2.5 * torch.randn(400, vocab, generator=torch.Generator().manual_seed(0))).bfloat16().float()
        n = z.shape[0]
        filtered = apply_top_k_top_p_pytorch(z.clone(), None, torch.full((n,), 0.9), allow_cpu_sync=True)
        theirs_kept = torch.isfinite(filtered)
        logq = filtered.log_softmax(-1)
        y = torch.multinomial(logq.exp(), 1, generator=torch.Generator().manual_seed(1))
        theirs = logq.gather(-1, y)[:, 0]
        ours_kept = kept_mask(z, f)
        tau = boundary_value(z, ours_kept)[:, None]
        whole_tie = z.masked_fill(z < tau, -float("inf")).log_softmax(-1).gather(-1, y)[:, 0]
        ours = filtered_log_softmax(z, f).gather(-1, y)[:, 0]
        split = ((z >= tau).sum(-1) > ours_kept.sum(-1)).float().mean()
        differ = lambda kept: int((kept != theirs_kept).any(-1).sum())  # noqa: E731
        print(f"vocabulary {vocab}: rows with a split tie {float(split):.0%}; rows whose kept set differs from vLLM's: "
              f"this rule {differ(ours_kept)} of {n}, ties by column {differ(column_order_kept(z, 0.9))} of {n}; "
              f"mean log-prob minus vLLM's per sampled token: this rule {float((ours - theirs).mean()):+.1e}, "
              f"whole tie {float((whole_tie - theirs).mean()):+.1e}")


if __name__ == "__main__":
    main()
