"""python -m llm.train: one-line errors, --help, the function beside the command module, no import warnings."""

import subprocess
import sys

import pytest

PY = sys.executable


@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [
    (["--num-generations", "1"], "num_generations: a group needs G >= 2"),
    (["--sync-period", "x"], "--sync-period"),
    (["--no-such-flag"], "Unrecognized options"),
    (["--loss-type", "ppo"], "--loss-type"),
])
def test_cli_errors_are_one_line(args, needle):
    res = subprocess.run([PY, "-m", "llm.train", *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.stderr


def test_cli_help_documents_fields():
    res = subprocess.run([PY, "-m", "llm.train", "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0
    for flag in ("--sync-period", "--num-iterations", "--mask-zero-std-groups", "--behaviour-logprobs", "--epsilon"):
        assert flag in res.stdout


@pytest.mark.slow
def test_the_function_stays_the_function_beside_the_command(tmp_path):
    """``from llm import train`` is the function in a process that also imported the command's code
    (``llm.commands.train``, apart from the library): nothing swaps a module's class to be callable."""
    code = ("import llm.commands.train as cli\n"
            "from llm import GRPOConfig, train\n"
            f"cfg = GRPOConfig(output_dir={str(tmp_path / 'run')!r}, max_steps=1, prompts_per_step=2, sampler='transformers', progress=False)\n"
            "print('RUN', train(cfg, log=lambda *a: None))\n"
            "assert callable(cli.main) and train.__module__ == 'llm'\n")
    res = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "RUN " in res.stdout and (tmp_path / "run" / "metrics.jsonl").is_file()


@pytest.mark.slow
@pytest.mark.vllm
def test_a_logged_run_holds_the_projects_lines_only(tmp_path):
    """``make run > log 2>&1``: the in-process engine starts without third-party warnings (vLLM's log, its import's
    deprecation warnings, the CPU worker's NUMA notice, the weight loader's bar) or Python's (a RuntimeWarning of
    ``python -m`` importing a module twice), and the progress bar, which redraws itself with carriage returns, becomes
    one short line per step when the output is not a terminal."""
    log = tmp_path / "log"
    with log.open("w") as out:
        res = subprocess.run([PY, "-m", "llm.train", "--max-steps", "2", "--prompts-per-step", "2", "--sampler", "vllm",
                              "--sync-period", "2", "--output-dir", str(tmp_path / "run")], stdout=out,
                             stderr=subprocess.STDOUT, timeout=300)
    text = log.read_text()
    assert res.returncode == 0, text[-3000:]
    lines = text.splitlines()
    assert "\r" not in text and max(map(len, lines)) < 300
    assert [line.split(":")[0] for line in lines if line.startswith("step ")] == ["step 0", "step 1"]
    assert "seconds per step: median" in text  # the run's summary
    for noise in ("Warning", "WARNING", "Triton", "NUMA", "Loading safetensors", "%|"):
        assert noise not in text, [line for line in lines if noise in line]


def test_a_run_freezes_the_callers_objects_only_while_it_runs(tmp_path):
    """train() hides the objects that exist before it from the garbage collector for its length (gc.freeze: its
    collections scan the run's own objects) and gives them back when it ends, by an error too."""
    import gc

    from llm import GRPOConfig, train

    assert gc.get_freeze_count() == 0
    seen = []

    def fail_at_step_1(step, row):
        seen.append(gc.get_freeze_count())
        if step == 1:
            raise KeyError("a callback's own error")

    cfg = GRPOConfig(output_dir=str(tmp_path / "run"), sampler="transformers", max_steps=3, progress=False)
    with pytest.raises(KeyError, match="a callback's own error"):
        train(cfg, log=lambda *a: None, callbacks=[fail_at_step_1])
    assert len(seen) == 2 and min(seen) > 10_000, seen  # the caller's objects (a test worker's: about a million)
    assert gc.get_freeze_count() == 0
    train(cfg, log=lambda *a: None)  # resumed to the end
    assert gc.get_freeze_count() == 0
