"""``--report-to``: every metrics.jsonl row reaches the tracker under the same names, step for step (read back
from the tracker's own files, offline)."""

import sys

import pytest

from llm import GRPOConfig, train
from llm.run.rundir import read_metrics
from llm.run.trackers import scalars

#: TensorBoard stores scalars as float32.
TB_RTOL = 1e-6


def _run(tmp_path, name, **kw):
    cfg = GRPOConfig(**dict(output_dir=str(tmp_path / name), sampler="transformers", max_steps=3, sync_period=2,
                            heldout_prompts=4, progress=False, logging_steps=100) | kw)
    return train(cfg, log=lambda *a: None)


def test_tensorboard_gets_every_metric_of_every_step(tmp_path, capsys):
    """... and, with --log-completions every 2 steps, the completions table of steps 0 and 2 (TensorBoard text), the
    same rows in completions.jsonl and on the console."""
    pytest.importorskip("tensorboard")
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = _run(tmp_path, "tb", report_to=("tensorboard",), log_completions=True, num_completions_to_print=3,
               logging_steps=2)
    table = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    n = len(table) // 2  # every completion of the step, whatever the console prints (TRL's table)
    assert n > 3 and [r["step"] for r in table] == [0] * n + [2] * n
    assert set(table[0]) == {"step", "prompt", "completion", "reward", "advantage"}
    out = capsys.readouterr().out
    assert out.count(f"3 of {n} completions (reward") == 2
    texts = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0})
    texts.Reload()
    logged = texts.Tensors("completions/text_summary")
    assert [e.step for e in logged] == [0, 2]
    assert logged[1].tensor_proto.string_val[0].decode().count(table[n]["prompt"]) >= 1
    assert len(logged[1].tensor_proto.string_val[0].decode().splitlines()) >= n + 2  # header, rule, every row
    rows = read_metrics(run)
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    logged = {k: {e.step: e.value for e in acc.Scalars(k)} for k in acc.Tags()["scalars"]}
    expected = {}
    for r in rows:
        for k, v in scalars(r).items():
            expected.setdefault(k, {})[r["step"]] = v
    assert logged.keys() == expected.keys() and "heldout/bound_est/lower_tight" in logged and "time/optimise" in logged
    for key, by_step in expected.items():
        assert logged[key].keys() == by_step.keys(), key
        for step, v in by_step.items():
            assert logged[key][step] == pytest.approx(v, rel=TB_RTOL, abs=1e-30, nan_ok=True), (key, step)


def test_the_console_prints_a_seeded_sample_with_each_reward_functions_value(capsys):
    """--num-completions-to-print N: the console shows N of the step's completions drawn at random, as TRL's table
    does, but seeded by the run's seed and the step (the same run prints the same), in the step's order, each with
    every reward function's value (None where it gave None); completions.jsonl and the trackers get every one."""
    from types import SimpleNamespace

    from llm.run.output import Output

    written = []
    config = SimpleNamespace(seed=0, output=SimpleNamespace(num_completions_to_print=3, progress=False))
    out = Output(config, SimpleNamespace(path=None, append_completions=written.extend), 0, log=lambda *a: None)
    rows = [{"step": 5, "prompt": f"p{j}", "completion": f"c{j}", "reward": j / 10, "ok": 1.0,
             "judge": None if j % 2 else 0.25, "advantage": 0.5} for j in range(8)]
    shown = []
    for step in (5, 5, 6, 7, 8):
        out.completions(step, rows)
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == f"step {step}: 3 of 8 completions (reward (each reward function's value) advantage | " \
                           "prompt | completion)" and len(lines) == 4
        picked = [int(line.split("| p")[1].split()[0]) for line in lines[1:]]
        assert picked == sorted(set(picked))
        for line, j in zip(lines[1:], picked):
            assert line == f"  +{j / 10:.3f} (ok 1.000, judge {'None' if j % 2 else '0.250'}) +0.500 | p{j} | c{j}"
        shown.append(picked)
    assert written == rows * 5 and shown[0] == shown[1] and len({tuple(p) for p in shown}) > 1


@pytest.mark.slow
def test_wandb_offline_gets_every_metric_of_every_step(tmp_path, monkeypatch):
    """The real wandb in offline mode: the run is written under <output_dir>/wandb, and the rows it was given
    (``Run.log``, wrapped and called through) are metrics.jsonl's, step for step. wandb 0.31 keeps its offline
    file in a format without a Python reader, so the rows are checked at the call, not read back."""
    wandb = pytest.importorskip("wandb")

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    calls, real = [], wandb.sdk.wandb_run.Run.log

    def spy(self, data, step=None, **kw):
        calls.append((step, dict(data)))
        return real(self, data, step=step, **kw)

    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log", spy)
    run = _run(tmp_path, "wb", report_to=("wandb",))
    rows = read_metrics(run)
    assert list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert [step for step, _ in calls] == [r["step"] for r in rows]
    for (_, data), r in zip(calls, rows):  # nan (a standard error of one prompt) is the same nan
        assert data.keys() == scalars(r).keys()
        assert all(v == pytest.approx(scalars(r)[k], nan_ok=True, rel=0, abs=0) for k, v in data.items())


def test_a_tracker_without_its_package_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(ValueError, match=r"^report_to: wandb needs the wandb package, which is not installed"):
        _run(tmp_path, "nowb", report_to=("wandb",))
    with pytest.raises(ValueError, match="report_to: give 'none' alone"):
        GRPOConfig(report_to=("none", "tensorboard"))


def test_a_tracker_that_will_not_start_is_one_line(tmp_path, monkeypatch):
    """W&B without a login raised its UsageError through the run (a traceback of 36 lines); any tracker that raises
    while starting is one line naming it, and the trackers started before it are closed."""
    from runkit.cli import RunError

    from llm.run import trackers

    closed = []

    class Starts:
        def __init__(self, config, path):
            pass

        def close(self):
            closed.append(True)

    class NoLogin:
        def __init__(self, config, path):
            raise RuntimeError("No API key configured. Use `wandb login` to log in.\nmore")

    monkeypatch.setitem(trackers.BACKENDS, "tensorboard", Starts)
    monkeypatch.setitem(trackers.BACKENDS, "wandb", NoLogin)
    cfg = GRPOConfig(output_dir=str(tmp_path / "run"), report_to=("tensorboard", "wandb"))
    with pytest.raises(RunError, match=r"^report_to: wandb did not start \(RuntimeError: No API key configured\. "
                                       r"Use `wandb login` to log in\.\)$"):
        trackers.Trackers(cfg, tmp_path)
    assert closed == [True]
