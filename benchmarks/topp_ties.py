"""Ties at the top-p boundary on bfloat16 logits: ``python benchmarks/topp_ties.py``.

400 rows of logits 2.5 x N(0, 1) rounded to bfloat16 (held in float32, as the samplers compute), for vocabularies of
2,048, 8,192 and 49,152 tokens, top-p 0.9: the share of rows whose boundary tie vLLM's rule splits (the rule the
project follows, ``llm.core.token_filter``), and the mean over tokens sampled from vLLM's filtered distribution
(``apply_top_k_top_p_pytorch``, its CPU path) of the trainer's log-probability minus vLLM's, by the project's rule and
by the earlier rule that kept the whole tie ({z >= tau}). docs/theory.md, §1.1 quotes the output.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from llm.core.token_filter import TokenFilter, filtered_log_softmax, kept_boundary, kept_mask  # noqa: E402


def main() -> None:
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    f = TokenFilter(top_p=0.9)
    for vocab in (2048, 8192, 49152):
        z = (2.5 * torch.randn(400, vocab, generator=torch.Generator().manual_seed(0))).bfloat16().float()
        n = z.shape[0]
        logq = apply_top_k_top_p_pytorch(z.clone(), None, torch.full((n,), 0.9), allow_cpu_sync=True).log_softmax(-1)
        y = torch.multinomial(logq.exp(), 1, generator=torch.Generator().manual_seed(1))
        theirs = logq.gather(-1, y)[:, 0]
        tau = kept_boundary(z, f)[0][:, None]
        whole_tie = z.masked_fill(z < tau, -float("inf")).log_softmax(-1).gather(-1, y)[:, 0]
        ours = filtered_log_softmax(z, f).gather(-1, y)[:, 0]
        split = ((z >= tau).sum(-1) > kept_mask(z, f).sum(-1)).float().mean()
        print(f"vocabulary {vocab}: rows with a split tie {float(split):.0%}; mean log-prob minus vLLM's per sampled "
              f"token: this rule {float((ours - theirs).mean()):+.1e}, whole tie {float((whole_tie - theirs).mean()):+.1e}")


if __name__ == "__main__":
    main()
