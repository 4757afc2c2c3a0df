"""llm.tensors.batch: passes over sequences of similar length, the cheapest grouping, the same log-probs."""

import numpy as np
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from llm.tensors.batch import length_groups, make_batch
from llm.tensors.logprobs import Forward, completion_logprobs, forward_completions
from llm.models.model import load_policy
from llm.models.tiny import tiny_model_dir
from tests.helpers import RTOL64


def _partitions(items):
    """Every partition of ``items`` into non-empty groups."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        yield [[first], *part]
        for i in range(len(part)):
            yield part[:i] + [[first, *part[i]]] + part[i + 1:]


def _padded_cost(groups, lengths, overhead):
    return sum(len(g) * max(lengths[i] for i in g) + overhead for g in groups)


@given(st.lists(st.integers(1, 40), min_size=1, max_size=7), st.integers(0, 7), st.sampled_from([0, 0.25, 1, 2, 9]))
@example([5, 5, 5, 5], 0, 0).via("equal lengths: one pass")
@example([1, 40, 1, 40, 1], 2, 100).via("the row cap binds over a huge per-pass cost")
def test_length_groups_are_the_cheapest_grouping(lengths, max_rows, overhead_rows):
    """Every row in exactly one pass, no pass above ``max_rows`` rows, and no partition of the rows (not only
    contiguous runs of the sorted lengths) pads fewer positions plus a pass's cost (``overhead_rows`` x the longest
    length) per pass."""
    groups = length_groups(lengths, max_rows, overhead_rows)
    overhead = overhead_rows * max(lengths)
    assert sorted(int(i) for g in groups for i in g) == list(range(len(lengths)))
    cap = max_rows or len(lengths)
    assert all(1 <= len(g) <= cap for g in groups)
    best = min(_padded_cost(p, lengths, overhead) for p in _partitions(list(range(len(lengths))))
               if all(len(g) <= cap for g in p))
    assert _padded_cost([list(g) for g in groups], lengths, overhead) == best


def test_passes_by_length_pad_fewer_positions_with_the_same_logprobs():
    """Sequences of unequal prompt and completion lengths (float64 model): each pass of ``Batch.passes`` trimmed by
    ``Batch.take`` holds fewer positions than the rectangle, and its log-probs, entropies and hidden states, put back
    by ``Forward.assemble``, are the whole batch's."""
    model, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    model.double()
    prompts = [tok(f"{i}+{i}=" if i < 4 else f"{i}+{10 * i}=").input_ids for i in range(12)]  # 4, 6 or 7 tokens
    g = np.random.default_rng(4)
    comps = [g.integers(3, len(tok), size=n).tolist() for n in (1, 2, 2, 3, 20, 21, 22, 22, 40, 41, 41, 42)]
    batch = make_batch(prompts, comps, tok.pad_token_id, "cpu")
    with torch.no_grad():  # the rectangle in one pass
        whole = forward_completions(model, batch, 0.7, entropy=True, keep_hidden=True)
    rows = batch.passes(0, by_length=True)
    parts = [batch.take(r) for r in rows]
    assert len(parts) > 1 and sum(p.input_ids.numel() for p in parts) < batch.input_ids.numel()
    assert any(p.prompt_width < batch.prompt_width for p in parts)  # left padding trimmed too
    for r, p in zip(rows, parts):
        assert torch.equal(p.completion_mask.sum(1), batch.completion_mask[r].sum(1))
    with torch.no_grad():
        grouped = Forward.assemble(batch, rows, [forward_completions(model, p, 0.7, entropy=True, keep_hidden=True)
                                                 for p in parts])
    assert torch.allclose(grouped.logp, whole.logp, rtol=RTOL64, atol=1e-12)
    assert torch.allclose(grouped.entropy, whole.entropy, rtol=RTOL64, atol=1e-12)
    m = batch.completion_mask[..., None] > 0
    assert torch.allclose(grouped.hidden * m, whole.hidden * m, rtol=RTOL64, atol=1e-12)
    same = completion_logprobs(model, batch, 0.7, micro_batch=5, by_length=True)
    assert torch.allclose(same.logp, whole.logp, rtol=RTOL64, atol=1e-12)
