"""``python -m llm report``: summaries and plots of run directories, from metrics.jsonl only."""

import json
import subprocess
import sys

import numpy as np
import pytest

from llm import GRPOConfig, train
from llm.analysis.report import plot_runs, realised_improvement, rolling_mean, run_labels, series, spread


def _write_run(path, rows):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(n, evals=False, exact=True):
    g = np.random.default_rng(n)
    rows = []
    for k in range(n):
        r = {"step": k, "reward": float(g.random()), "tv/pi_k_alpha": float(g.random() / 10),
             "heldout/improvement": float(g.normal(0, 0.01)), "heldout/bound_est/lower_tight": float(g.normal(-0.1, 0.01))}
        if exact:
            r["improvement"] = float(g.normal(0, 0.01))
        if evals and k % 3 == 2:
            r["eval/j"] = 0.1 * k
        rows.append(r)
    if evals:
        rows[0]["eval_initial/j"] = 0.0
    return rows


def test_rolling_mean_is_the_mean_of_the_last_window_values():
    v = np.random.default_rng(0).random(23)
    for w in (1, 4, 30):
        assert np.allclose(rolling_mean(v, w), [v[max(0, i + 1 - w):i + 1].mean() for i in range(len(v))])


def test_series_realised_improvement_and_labels():
    rows = _rows(6, evals=True)
    k, v = series(rows, "eval/j")
    assert k.tolist() == [2, 5] and np.allclose(v, [0.2, 0.5])
    assert realised_improvement(rows) == ("improvement", "exact improvement")  # exact J beats the estimate
    assert realised_improvement(_rows(3, exact=False))[0] == "heldout/improvement"
    assert realised_improvement([{"step": 0, "reward": 0.5}]) is None
    from pathlib import Path
    assert run_labels([Path("a/v1"), Path("b/v1"), Path("c/v4")]) == ["a/v1", "b/v1", "v4"]


def test_the_spread_across_runs_is_each_runs_end_then_mean_sd_and_range(tmp_path):
    """Each run's end (the last window's mean; an evaluation's last value), then mean, sample sd and range over the
    runs, by hand; a metric that one run alone logs is left out."""
    ends = {}
    for seed, r_end in enumerate((0.2, 0.3, 0.7)):
        rows = [{"step": k, "reward": 0.0 if k < 6 else r_end} for k in range(10)]
        rows[3]["eval/j"], rows[9]["eval/j"] = 0.5, 0.1 * seed
        if seed == 0:
            rows[9]["kl"] = 1.0
        ends[seed] = _write_run(tmp_path / f"s{seed}", rows)
    text = spread(list(ends.values()), window=4)
    reward = next(line for line in text.splitlines() if line.strip().startswith("reward "))
    sd = np.std([0.2, 0.3, 0.7], ddof=1)
    assert "0.2 0.3 0.7" in reward and f"0.4 +- {sd:.2g} [0.2, 0.7]" in reward
    evals = next(line for line in text.splitlines() if line.strip().startswith("eval/j"))
    assert "0 0.1 0.2" in evals and "kl" not in text.replace("across", "")
    rows = [{"step": k, "j/pi_new": 0.1 * k} for k in range(5)]
    both = spread([_write_run(tmp_path / "j0", rows), _write_run(tmp_path / "j1", rows[:3])], window=2)
    assert "j/pi_new (last step)" in both and "0.4 0.2" in both.split("(last step)")[1]
    rows3 = [{"step": k, "reward": 0.5, "tv/pi_k_alpha": 1e-7} for k in range(3)]
    gap = spread([_write_run(tmp_path / "r0", rows3), _write_run(tmp_path / "r1", [{"step": 0, "tv/pi_k_alpha": 3e-7}]),
                  _write_run(tmp_path / "r2", rows3)], window=10)
    assert "the last 1 steps' mean" in gap and "[1] " in gap and "[3] " in gap  # the shortest run's window; labels
    assert "0.5 - 0.5  ->  0.5 +- 0 [0.5, 0.5]" in gap  # the run without a reward keeps its place
    assert "1e-07 3e-07 1e-07" in gap  # small values keep their digits
    assert "no metric" in spread([ends[0], _write_run(tmp_path / "bare", [{"step": 0, "loss": 1.0}])])


def test_plot_runs_writes_the_figures_the_metrics_allow(tmp_path):
    a = _write_run(tmp_path / "v1", _rows(20, evals=True))
    b = _write_run(tmp_path / "v4", _rows(15))
    written = plot_runs([a, b], tmp_path / "out")
    assert sorted(written) == ["bound.png", "eval.png", "reward.png", "tv.png"]
    assert all(p.stat().st_size > 10_000 and p.read_bytes()[:4] == b"\x89PNG" for p in written.values())
    bare = _write_run(tmp_path / "bare", [{"step": k, "reward": 0.5} for k in range(5)])
    assert sorted(plot_runs([bare], tmp_path / "out_bare")) == ["reward.png"]  # nothing else to draw
    with pytest.raises(ValueError, match="run_dirs: .*holds no metrics.jsonl"):
        plot_runs([tmp_path / "missing"], tmp_path / "x")


@pytest.mark.slow
def test_the_command_line_on_real_runs(tmp_path):
    """Two short runs of the trainer (v = 1 and v = 2, held-out prompts, evaluation): the command prints both
    summaries and writes the four figures; a directory that is not a run is one line and exit 2."""
    for v in (1, 2):
        train(GRPOConfig(output_dir=str(tmp_path / f"v{v}"), sampler="transformers", max_steps=4, sync_period=v,
                         heldout_prompts=4, eval_steps=2, progress=False, logging_steps=100), log=lambda *a: None)
    res = subprocess.run([sys.executable, "-m", "llm", "report", str(tmp_path / "v1"), str(tmp_path / "v2")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("exact J over the training prompts") == 2
    assert "across 2 runs" in res.stdout and "j/pi_new" in res.stdout.split("across 2 runs")[1]
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == ["bound.png", "eval.png", "reward.png", "tv.png"]
    bad = subprocess.run([sys.executable, "-m", "llm", "report", str(tmp_path / "nope")], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "holds no metrics.jsonl" in bad.stderr


def test_a_short_run_is_summarised_and_drawn_as_what_it_is(tmp_path):
    """A 5-step run: the summary's first and last means never overlap (2 steps each), the reward figure's rolling
    mean says how many steps it spans, and a run with in-sample bound estimates and no realised improvement (a real
    model, no held-out prompts) still gets its bound figure."""
    from llm.analysis.report import summarise

    rows = [{"step": k, "reward": 0.1 * k, "insample/bound_est/lower_tight": -0.1 * k} for k in range(5)]
    run = _write_run(tmp_path / "short", rows)
    text = summarise(run)
    assert "5 steps (means over the first and last 2 steps, and over all)" in text
    assert "reward" in text and "0.05" in text and "0.35" in text  # means of 0, 0.1 and of 0.3, 0.4
    one = _write_run(tmp_path / "one", rows[:1])
    assert "1 step (means over the first and last 1 step, and over all)" in summarise(one)
    written = plot_runs([run], tmp_path / "out", window=10)
    assert sorted(written) == ["bound.png", "reward.png"]
    from unittest import mock

    import matplotlib.pyplot as plt

    labels = []
    real_legend = plt.Axes.legend
    with mock.patch.object(plt.Axes, "legend", lambda self, *a, **k: labels.extend(
            t for t in self.get_legend_handles_labels()[1]) or real_legend(self, *a, **k)):
        plot_runs([run], tmp_path / "out2", window=10)
    assert "short (mean of 5 steps)" in labels


def test_the_report_reads_the_certificates_across_the_run_and_says_which_guarantee():
    """With e-values logged, the report counts the steps certified by e-BH and by alpha-spending and says what each
    guarantees; with an evaluation certificate logged it prints the last one. A step whose e-value reaches 20 at level
    0.95 among 3 steps is certified by e-BH only if it reaches 3/0.05 = 60."""
    from llm.analysis.report import certificate_lines
    from llm.tensors.metrics import certificate_shares

    rows = [{"step": 0, "heldout/improvement_lcb": 0.01, "heldout/improvement_e": 70.0},
            {"step": 1, "heldout/improvement_lcb": 0.001, "heldout/improvement_e": 25.0},
            {"step": 2, "heldout/improvement_lcb": -0.2, "heldout/improvement_e": 0.3, "eval/improvement_lcb": 0.12,
             "eval/improvement_lcb_greedy": 0.2}]
    shares = certificate_shares(rows)
    assert shares["certified"] == pytest.approx(2 / 3) and shares["e_bh"] == pytest.approx(1 / 3)
    assert shares["spending"] == pytest.approx(1 / 3)  # 70 >= 32.9 at j = 1; 25 < 131.6 at j = 2
    text = "\n".join(certificate_lines(rows))
    assert "33% by e-BH" in text and "by alpha-spending (none false" in text and "each step's own claim" in text
    assert "sampled accuracy +0.1200 (certified), greedy +0.2000 (certified)" in text


def test_the_report_combines_no_abstained_e_values_and_reads_the_runs_level(tmp_path):
    """All e-values nan (the certificate abstained at every step: no declared range) are not combined into e-BH or
    alpha-spending shares; a run at --improvement-lcb-level 0.9 is combined and described at 0.9, read from its
    config.json."""
    from llm.analysis.report import run_level, summarise
    from llm.tensors.metrics import certificate_shares

    nan = float("nan")
    abstained = [{"step": k, "heldout/improvement_lcb": nan, "heldout/improvement_e": nan} for k in range(3)]
    assert "e_bh" not in certificate_shares(abstained) and certificate_shares(abstained)["abstained"] == 1
    run = _write_run(tmp_path / "undeclared", abstained)
    assert "e-BH" not in summarise(run) and "abstained on all 3 steps" in summarise(run)
    rows = [{"step": 0, "heldout/improvement_lcb": 0.01, "heldout/improvement_e": 25.0}]
    run = _write_run(tmp_path / "at90", rows)
    (run / "config.json").write_text(json.dumps({"improvement_lcb_level": 0.9}))
    assert run_level(run) == 0.9 and run_level(tmp_path / "undeclared") == 0.95
    text = summarise(run)
    assert "at most 10%, at level 0.9" in text and "with probability >= 0.9)" in text
    assert "100% by e-BH" in text  # 25 >= 1/(1 - 0.9); an e-value of 15 tells the two levels apart:
    assert certificate_shares([{**rows[0], "heldout/improvement_e": 15.0}], 0.9)["e_bh"] == 1.0  # 15: only at 0.9
    assert certificate_shares([{**rows[0], "heldout/improvement_e": 15.0}], 0.95)["e_bh"] == 0.0


def test_the_command_says_which_figures_it_did_not_draw_and_why(tmp_path, capsys):
    """A run without evaluations or held-out prompts gets the reward and TV figures; the command names the two it
    leaves out and the option that would log their metrics."""
    from llm.analysis.report import UNDRAWN
    from llm.commands.report import main
    from llm.run.rundir import RunDir

    cfg = GRPOConfig(sampler="transformers", max_steps=2, output_dir=str(tmp_path / "run"))
    with RunDir(cfg) as run:
        run.open()
        for step in range(2):
            run.append_metrics({"step": step, "reward": 0.5, "lag": 0, "tv/pi_k_alpha": 0.0, "sync/reason": ""})
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "figs")]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["reward.png", "tv.png"]
    assert f"not drawn: eval.png ({UNDRAWN['eval.png']})" in out and f"not drawn: bound.png ({UNDRAWN['bound.png']})" in out
    assert "not drawn: tv.png" not in out and "not drawn: reward.png" not in out


def test_an_evaluation_curve_is_drawn_against_the_updates_before_it():
    """eval/* of step k is the policy after k + 1 updates; eval_initial/* (step 0's row) the policy before any, drawn
    at 0; without it the curve starts at the first evaluation."""
    from llm.analysis.report import after_updates

    rows = [{"step": 0, "eval/accuracy": 0.3, "eval_initial/accuracy": 0.1}, {"step": 1},
            {"step": 2, "eval/accuracy": 0.5}]
    k, v = after_updates(rows, "eval/accuracy")
    assert k.tolist() == [0, 1, 3] and v.tolist() == [0.1, 0.3, 0.5]
    k, v = after_updates(rows[1:], "eval/accuracy")
    assert k.tolist() == [3] and v.tolist() == [0.5]
