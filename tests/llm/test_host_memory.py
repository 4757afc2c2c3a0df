"""Kept freed memory under a ceiling (runkit.host_memory.FreedMemoryCeiling): when it hands pages back."""

import pytest

from runkit import host_memory

MB = 2**20


@pytest.fixture
def process(monkeypatch):
    """A fake process: its resident set is ``state['rss']``; a release brings it down to ``state['live']``."""
    state = {"rss": 1000 * MB, "live": 1000 * MB, "released": 0}

    def release():
        state["released"] += 1
        state["rss"] = state["live"]

    monkeypatch.setattr(host_memory, "resident_bytes", lambda: state["rss"])
    monkeypatch.setattr(host_memory, "release_freed_memory", release)
    return state


def test_a_heap_that_reuses_its_blocks_is_never_trimmed(process):
    ceiling = host_memory.FreedMemoryCeiling()
    ceiling.start(2.0)
    ceiling.pass_start()
    process["rss"] += 300 * MB  # the first micro-batch's transient blocks, kept
    ceiling.micro_batch_done()
    for _ in range(50):  # every later micro-batch reuses them
        ceiling.micro_batch_done()
    assert ceiling.releases == 0 and process["released"] == 0
    ceiling.pass_end()  # a pass of many micro-batches: its freed memory goes back at its end
    assert ceiling.releases == 1 and process["rss"] == process["live"]


def test_a_fragmenting_heap_is_held_under_the_ceiling(process):
    ceiling = host_memory.FreedMemoryCeiling()
    ceiling.start(2.0)
    ceiling.pass_start()
    peak = 0
    process["rss"] += 300 * MB
    ceiling.micro_batch_done()
    for _ in range(60):  # 60 MB more per micro-batch: the growth of a fragmenting heap
        process["rss"] += 60 * MB
        peak = max(peak, process["rss"])
        ceiling.micro_batch_done()
    assert ceiling.releases >= 5
    # never more than the live set plus factor x the largest micro-batch's growth plus one micro-batch
    assert peak <= process["live"] + 2.0 * 300 * MB + 60 * MB
    # without the ceiling the same heap would have reached 1000 + 300 + 3600 MB
    assert peak < 1000 * MB + 300 * MB + 3600 * MB


def test_no_ceiling_or_no_start_changes_nothing(process):
    for factor in (0.0, None):
        ceiling = host_memory.FreedMemoryCeiling()
        if factor is not None:
            ceiling.start(factor)
        for _ in range(20):
            process["rss"] += 500 * MB
            ceiling.micro_batch_done()
        assert ceiling.releases == 0
    assert process["released"] == 0


def test_the_process_resident_set_is_read():
    assert host_memory.resident_bytes() > 10 * MB  # this Python with torch imported by the suite's conftest


def test_passes_in_one_micro_batch_never_release_however_the_process_grows(process):
    """A step in one pass per phase (``per_device_train_batch_size`` 0, the real model's ``make run-real``): each pass's
    growth is its own largest, so nothing is released, while the process grows between passes (a sampler's
    memory, a sync's buffers), which the ceiling does not count."""
    ceiling = host_memory.FreedMemoryCeiling()
    ceiling.start(2.0)
    for grow_between, grow_in in [(900, 300), (500, 100), (50, 400), (2000, 10)] * 5:
        process["rss"] += grow_between * MB
        ceiling.pass_start()
        process["rss"] += grow_in * MB
        ceiling.micro_batch_done()
        ceiling.pass_end()
    assert ceiling.releases == 0


def test_micro_batches_wraps_a_pass_in_the_ceilings_calls(process, monkeypatch):
    """``micro_batches(parts)`` yields the parts in order, notes each one's growth after its body ran, and releases
    after a pass of several (the loops of the trainer's passes and the transformers sampler use it)."""
    ceiling = host_memory.FreedMemoryCeiling()
    monkeypatch.setattr(host_memory, "CEILING", ceiling)
    ceiling.start(1.0)
    seen = []
    for part in host_memory.micro_batches(["a", "b", "c"]):
        process["rss"] += 100 * MB  # this micro-batch's blocks
        seen.append((part, ceiling.micro_batches))  # micro_batch_done not yet called for this one
    assert seen == [("a", 0), ("b", 1), ("c", 2)]
    assert ceiling.micro_batches == 3 and process["released"] == ceiling.releases >= 1
    assert process["rss"] == process["live"]  # the pass's end released it
