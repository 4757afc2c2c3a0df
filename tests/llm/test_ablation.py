"""python -m llm ablation (llm.analysis.ablation): the experiments' grids, the frontier table's reference column, bad options, and one short frontier
run end to end."""

import shutil

import numpy as np
import pytest

from llm.analysis.ablation import CORRECTIONS, FRONTIER_V, AblationConfig, frontier_table, plan, run_config, run_name
from llm.commands.ablation import main


def test_the_frontier_grid_is_every_correction_staleness_and_generation():
    """Every cell is a row; the cells that never sync after step 0 (v = never, and v >= max_steps) sample from the
    initial weights with either generation, so they are one configuration, run once."""
    cfg = AblationConfig(experiment="frontier", max_steps=80)
    grid = plan(cfg)["frontier"]
    assert len(grid) == len(CORRECTIONS) * len(FRONTIER_V) * 2
    never = grid["m2po, v=never, async"]
    assert never == dict(sync_period=81, async_generation=False, importance_sampling_mode="m2po",
                         mask_zero_std_groups=False)  # the paper's M2PO averages over all N tokens
    assert grid["m2po, v=256, sync"] == grid["m2po, v=256, async"] == never == grid["m2po, v=never, sync"]
    assert grid["paper clip, v=64, sync"] == dict(sync_period=64, async_generation=False)
    assert grid["paper clip, v=64, async"] == dict(sync_period=64, async_generation=True)
    assert plan(AblationConfig(experiment="frontier", max_steps=64))["frontier"]["paper clip, v=64, async"] == dict(
        sync_period=65, async_generation=False)
    distinct = {run_name(kw) for kw in grid.values()}
    assert len(distinct) == len(CORRECTIONS) * (2 * (len(FRONTIER_V) - 2) + 1)
    sub = plan(AblationConfig(experiment="frontier", frontier_v=(1, 0), frontier_corrections=("paper clip",),
                              frontier_generation=("sync",)))["frontier"]
    assert list(sub) == ["paper clip, v=1, sync", "paper clip, v=never, sync"]


@pytest.mark.parametrize("kw,needle", [
    (dict(frontier_corrections=("paper clip", "ppo")), "frontier_corrections: expected names among .* got 'ppo'"),
    (dict(frontier_v=(4, -1)), "frontier_v: sync periods >= 1, or 0 for never"),
    (dict(frontier_generation=()), "frontier_generation: sync, async or both"),
    (dict(learning_rate=0.0), "learning_rate: must be > 0, got 0.0"),
    (dict(device="gpu"), "device: expected auto, cpu or cuda"),
])
def test_a_bad_frontier_option_is_one_clear_error(kw, needle):
    with pytest.raises(ValueError, match=needle):
        AblationConfig(**kw)


def test_a_set_learning_rate_and_device_reach_every_run_and_its_directory(tmp_path):
    """Runs at a set learning rate live in directories of their own; the default rate's keep their old names."""
    kw = dict(sync_period=4)
    default = run_config(AblationConfig(out=str(tmp_path)), 0, kw)
    fast = run_config(AblationConfig(out=str(tmp_path), learning_rate=3e-3, device="cpu"), 0, kw)
    assert (fast.learning_rate, fast.device, default.device) == (3e-3, "cpu", "auto")
    assert default.output_dir.endswith("v4_i1_mask/seed0")
    assert fast.output_dir.endswith("v4_i1_mask_learning_rate=0.003/seed0")


def test_the_certificates_miss_rate_counts_each_run_once():
    """Cells that coincide (never syncing, each generation) share their runs: the miss rate below the table is the
    mean over distinct runs, not over cells."""
    shared = [dict(_summary(0.1), lcb_above_exact=0.1), dict(_summary(0.1), lcb_above_exact=0.1)]
    results = {"paper clip, v=1, sync": [dict(_summary(0.1), lcb_above_exact=0.04), _summary(0.1)],
               "paper clip, v=256, sync": shared, "paper clip, v=never, sync": shared}
    text = frontier_table(AblationConfig(), results)
    assert "Over the 4 distinct runs, the improvement certificate (level 0.95) exceeds the exact improvement on " \
           "6.0% of steps (at most about 5% where it keeps its level)" in text  # (0.04 + 0 + 0.1 + 0.1) / 4


def test_the_pivot_has_one_column_per_distinct_sync_setting_and_stars_the_far_cells():
    """v = 256 at 80 steps and never, synchronous or not, are one column; a mean more than one standard deviation
    from the paper clip's at v = 1, synchronous, gets a star; a cell not in the grid is empty."""
    from llm.analysis.ablation import frontier_pivot

    cfg = AblationConfig(experiment="frontier", frontier_v=(1, 256, 0), frontier_corrections=("paper clip", "m2po"))
    never = [_summary(0.05), _summary(0.07)]
    results = {"paper clip, v=1, sync": [_summary(0.08), _summary(0.10)],
               "paper clip, v=1, async": [_summary(0.085), _summary(0.095)], "m2po, v=1, sync": never,
               **{f"paper clip, v={v}, {m}": never for v in (256, "never") for m in ("sync", "async")}}
    lines = frontier_pivot(cfg, results).splitlines()
    assert lines[0] == "| correction | v=1 sync | v=1 async | never |"
    assert lines[2] == "| paper clip | 0.090 ± 0.010 | 0.090 ± 0.005 | 0.060 ± 0.010 * |"
    assert lines[3] == "| m2po | 0.060 ± 0.010 * |  |  |"


def _summary(gain):
    keys = ("test_j", "lag", "tv_k", "ess", "certified", "lcb_above_exact", "above_cap")
    return {"j_gain": gain, **{k: 0.0 for k in keys}}


def test_the_within_column_compares_with_the_paper_clip_at_v1_sync():
    """Within one (population) standard deviation of the reference's gain: yes; further: no; without the reference
    in the grid: n/a."""
    ref = [_summary(g) for g in (0.08, 0.10)]  # mean 0.09, std 0.01
    results = {"paper clip, v=1, sync": ref, "m2po, v=64, sync": [_summary(g) for g in (0.079, 0.083)],
               "token_mask, v=never, sync": [_summary(g) for g in (0.05, 0.06)]}
    lines = frontier_table(AblationConfig(), results).splitlines()[2:5]
    assert [ln.rsplit("|", 2)[-2].strip() for ln in lines] == ["yes", "yes", "no"]
    assert np.std([0.08, 0.10]) == pytest.approx(0.01)
    alone = frontier_table(AblationConfig(), {"m2po, v=64, sync": results["m2po, v=64, sync"]}).splitlines()[2]
    assert alone.rstrip(" |").endswith("n/a")


@pytest.mark.slow
def test_a_short_frontier_runs_end_to_end(tmp_path, capsys):
    """The paper clip at v = 1 and never syncing, two steps each, one seed: the table has their two rows, with the
    lag of a run that never syncs, and no within-1-sd verdict from one seed."""
    assert main(["--experiment", "frontier", "--seeds", "1", "--max-steps", "2", "--heldout-prompts", "2",
                 "--frontier-v", "1", "0", "--frontier-corrections", "paper clip", "--frontier-generation", "sync",
                 "--workers", "1", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "frontier" / "results.md").read_text()
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and ", v=" in ln]  # the full table's rows
    assert [r.split("|")[1].strip() for r in rows] == ["paper clip, v=1, sync", "paper clip, v=never, sync"]
    assert rows[1].split("|")[4].strip() == "0.5 ± 0.0"  # never syncs after step 0: lags 0 and 1
    assert all(r.rstrip(" |").endswith("n/a") for r in rows)
    assert "| correction | v=1 sync | never |" in table  # the pivot below it (no stars from one seed)
    assert "Over the 2 distinct runs, the improvement certificate (level 0.95)" in table
    # the runs' metrics alone (no checkpoint, no model: copied from another machine) give the same table untrained
    runs = sorted(p.parent for p in tmp_path.glob("*/seed0/metrics.jsonl"))
    assert len(runs) == 2
    for run in runs:
        for p in run.iterdir():
            if p.name not in ("metrics.jsonl", "config.json"):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    capsys.readouterr()
    assert main(["--experiment", "frontier", "--seeds", "1", "--max-steps", "2", "--heldout-prompts", "2",
                 "--frontier-v", "1", "0", "--frontier-corrections", "paper clip", "--frontier-generation", "sync",
                 "--workers", "1", "--out", str(tmp_path)]) == 0
    assert "2 finished, 0 to run" in capsys.readouterr().out
    assert (tmp_path / "frontier" / "results.md").read_text() == table
    assert all(sorted(p.name for p in run.iterdir()) == ["config.json", "metrics.jsonl"] for run in runs)
