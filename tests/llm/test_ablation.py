"""llm.ablation: the experiments' grids, the frontier table's reference column, bad options, and one short frontier
run end to end."""

import numpy as np
import pytest

from llm.ablation import CORRECTIONS, FRONTIER_V, AblationConfig, frontier_table, main, plan


def test_the_frontier_grid_is_every_correction_staleness_and_generation():
    cfg = AblationConfig(experiment="frontier", max_steps=80)
    grid = plan(cfg)["frontier"]
    assert len(grid) == len(CORRECTIONS) * len(FRONTIER_V) * 2
    never = grid["m2po, v=never, async"]
    assert never["sync_period"] == 81 and never["async_generation"] and never["importance_sampling_mode"] == "m2po"
    assert grid["paper clip, v=64, sync"] == dict(sync_period=64, async_generation=False)
    sub = plan(AblationConfig(experiment="frontier", frontier_v=(1, 0), frontier_corrections=("paper clip",),
                              frontier_generation=("sync",)))["frontier"]
    assert list(sub) == ["paper clip, v=1, sync", "paper clip, v=never, sync"]


@pytest.mark.parametrize("kw,needle", [
    (dict(frontier_corrections=("paper clip", "ppo")), "frontier_corrections: expected names among .* got 'ppo'"),
    (dict(frontier_v=(4, -1)), "frontier_v: sync periods >= 1, or 0 for never"),
    (dict(frontier_generation=()), "frontier_generation: sync, async or both"),
])
def test_a_bad_frontier_option_is_one_clear_error(kw, needle):
    with pytest.raises(ValueError, match=needle):
        AblationConfig(**kw)


def _summary(gain):
    keys = ("test_j", "lag", "tv_k", "ess", "certified", "above_cap")
    return {"j_gain": gain, **{k: 0.0 for k in keys}}


def test_the_within_column_compares_with_the_paper_clip_at_v1_sync():
    """Within one (population) standard deviation of the reference's gain: yes; further: no; without the reference
    in the grid: n/a."""
    ref = [_summary(g) for g in (0.08, 0.10)]  # mean 0.09, std 0.01
    results = {"paper clip, v=1, sync": ref, "m2po, v=64, sync": [_summary(g) for g in (0.079, 0.083)],
               "token_mask, v=never, sync": [_summary(g) for g in (0.05, 0.06)]}
    lines = frontier_table(AblationConfig(), results).splitlines()[2:]
    assert [ln.rsplit("|", 2)[-2].strip() for ln in lines] == ["yes", "yes", "no"]
    assert np.std([0.08, 0.10]) == pytest.approx(0.01)
    alone = frontier_table(AblationConfig(), {"m2po, v=64, sync": results["m2po, v=64, sync"]}).splitlines()[2]
    assert alone.rstrip(" |").endswith("n/a")


def test_a_short_frontier_runs_end_to_end(tmp_path, capsys):
    """The paper clip at v = 1 and never syncing, two steps each, one seed: the table has their two rows, with the
    lag of a run that never syncs, and no within-1-sd verdict from one seed."""
    assert main(["--experiment", "frontier", "--seeds", "1", "--max-steps", "2", "--heldout-prompts", "2",
                 "--frontier-v", "1", "0", "--frontier-corrections", "paper clip", "--frontier-generation", "sync",
                 "--workers", "1", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "frontier" / "results.md").read_text()
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and "correction, v" not in ln]
    assert [r.split("|")[1].strip() for r in rows] == ["paper clip, v=1, sync", "paper clip, v=never, sync"]
    assert rows[1].split("|")[4].strip() == "0.5 ± 0.0"  # never syncs after step 0: lags 0 and 1
    assert all(r.rstrip(" |").endswith("n/a") for r in rows)
