"""The CPU engine's settings (llm.sampling.vllm_settings): the KV cache sized to the job, a group's prompt blocks
counted once."""

import math

from hypothesis import given
from hypothesis import strategies as st

from llm.sampling.vllm_settings import CPU_BLOCK_SIZE as B
from llm.sampling.vllm_settings import kv_cache_blocks


def blocks_in_use(prompt_lens: list[int], group: int, completion: int, first: int, running: int) -> int:
    """Blocks that ``running`` consecutive sequences of the group-major queue, from sequence ``first`` on, hold at
    their full length under vLLM's prefix caching: a prompt of p tokens shares its first floor((p - 1) / B) blocks
    (counted once per distinct prompt), every sequence holds the rest of its ceil((p + T) / B) blocks alone."""
    seqs = [i // group for i in range(len(prompt_lens) * group)][first:first + running]
    shared = {j: (prompt_lens[j] - 1) // B for j in set(seqs)}
    own = sum(math.ceil((prompt_lens[j] + completion) / B) - shared[j] for j in seqs)
    return sum(shared.values()) + own


@given(st.lists(st.integers(1, 300), min_size=1, max_size=12), st.integers(1, 16), st.integers(1, 400),
       st.integers(1, 64), st.data())
def test_the_cache_holds_any_run_of_whole_groups_at_full_length(prompt_lens, group, completion, max_seqs, data):
    """Whatever the prompts' lengths, every run of ``min(sequences, max_seqs)`` consecutive sequences (whole groups
    and a partial one at each end, as vLLM admits a request's completions together) fits at full length, and the
    cache is never larger than one without sharing."""
    longest = max(prompt_lens)
    total = len(prompt_lens) * group
    running = min(total, max_seqs)
    blocks = kv_cache_blocks(longest + completion, total, max_seqs, group, longest)
    first = data.draw(st.integers(0, total - running))
    assert blocks >= blocks_in_use(prompt_lens, group, completion, first, running)
    assert blocks <= running * math.ceil((longest + completion) / B)


def test_sharing_halves_the_cache_of_long_prompts_with_short_completions():
    """The saving where it matters: 8 completions of 64 tokens per 1,000-token prompt, 128 at once."""
    plain = kv_cache_blocks(1064, 512, 128)
    shared = kv_cache_blocks(1064, 512, 128, group=8, prompt_tokens=1000)
    assert plain == 128 * 34
    assert shared == 128 * 3 + 17 * 31
    assert shared < plain / 4


def test_without_groups_each_sequence_gets_its_whole_length():
    assert kv_cache_blocks(100, 10, 128) == 10 * 4
    assert kv_cache_blocks(100, 500, 128, group=1, prompt_tokens=60) == 128 * 4
