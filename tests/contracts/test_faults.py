"""Faults: SIGKILL at random points of a run (some during a checkpoint write), two trainers on one output_dir,
a full disk, a read-only output directory, an error under the progress bar. Each is either survived (resume gives
the uninterrupted run's metrics) or refused in one line, and nothing on disk is corrupted."""

import contextlib
import fcntl
import os
import pty
import random
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import torch

import llm.run.rundir as rundir_mod
from llm import GRPOConfig, train
from llm.run.rundir import RunDir, read_metrics, tensor_bytes
from runkit.cli import RunError
from tests.helpers import ROOT, train_command

KILL_STEPS = 24


#: The options of the runs below; CLI runs them in an interpreter of their own.
OPTIONS = ["--sampler", "transformers", "--max-steps", str(KILL_STEPS), "--prompts-per-step", "8", "--save-steps", "1",
           "--no-progress", "--logging-steps", "1000", "--num-threads", "1"]
CLI = [sys.executable, "-m", "llm.train", *OPTIONS]


def _start(out: Path) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "--output-dir", str(out)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _rows_on_disk(out: Path) -> list[int]:
    return [r["step"] for r in read_metrics(out)] if (out / "metrics.jsonl").is_file() else []


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _check_consistent(out: Path) -> int:
    """After a kill: the checkpoint (if any) loads, metric rows are unique, contiguous from 0 and reach it."""
    steps = _rows_on_disk(out)
    assert steps == list(range(len(steps))), steps
    ckpt_step = 0
    if (out / "checkpoint.pt").is_file():
        ckpt_step = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=True)["step"]
        assert len(steps) >= ckpt_step, (steps, ckpt_step)
    return ckpt_step


@pytest.mark.slow
def test_sigkill_at_three_random_points_then_resume_gives_the_uninterrupted_run(tmp_path):
    """Three SIGKILLs: during start-up, at a random moment of a step, and while checkpoint.pt.tmp is being written.
    After each, the checkpoint loads and the metric rows are unique and contiguous; the run resumed to the end
    logs the same rows as an uninterrupted run (same rewards, losses to 1e-5)."""
    ref_dir, out = tmp_path / "uninterrupted", tmp_path / "killed"
    train_command(*OPTIONS, "--output-dir", str(ref_dir))  # in this process: the same command, no interpreter's start
    rng = random.Random(0)
    kinds = ["start-up", "step", "checkpoint write"]
    during_write = 0
    for trial, kind in enumerate(kinds):
        before = len(_rows_on_disk(out))
        proc = _start(out)
        deadline = time.monotonic() + 120
        if kind == "start-up":
            time.sleep(rng.uniform(0.5, 4.0))
        elif kind == "step":  # a random moment after the resumed run has logged a step
            while len(_rows_on_disk(out)) <= before and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.25))
        else:
            while not (out / "checkpoint.pt.tmp").exists() and proc.poll() is None and time.monotonic() < deadline:
                pass
        assert proc.poll() is None, f"trial {trial}: the run ended before the kill ({proc.stderr.read()[-1000:]})"
        _kill(proc)
        during_write += kind == "checkpoint write" and (out / "checkpoint.pt.tmp").exists()
        _check_consistent(out)
    assert during_write >= 1, during_write  # killed with a half-written checkpoint.pt.tmp on disk
    train_command(*OPTIONS, "--output-dir", str(out))
    got, want = read_metrics(out), read_metrics(ref_dir)
    assert [r["step"] for r in got] == list(range(KILL_STEPS))
    for a, b in zip(got, want):
        assert a["reward"] == b["reward"] and a["lag"] == b["lag"], a["step"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5), a["step"]
        assert a["j/pi_new"] == pytest.approx(b["j/pi_new"], abs=1e-5), a["step"]


@pytest.mark.slow
def test_a_second_trainer_on_the_same_output_dir_is_refused(tmp_path):
    """The lock is a real flock: held here, the CLI in another process exits 2 with one line naming the holder."""
    cfg = GRPOConfig(output_dir=str(tmp_path / "run"), sampler="transformers", progress=False)
    with RunDir(cfg):
        res = subprocess.run([*CLI, "--output-dir", cfg.output_dir], cwd=ROOT, capture_output=True, text=True)
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and f"is in use by another trainer (pid {os.getpid()})" in lines[0], lines
        with pytest.raises(ValueError, match="output_dir: .* is in use by another trainer"):  # and in-process
            train(cfg.replace(max_steps=1), log=lambda *a: None)
    train(cfg.replace(max_steps=1), log=lambda *a: None)  # released: the next trainer gets it


def _config(tmp_path, out=None, **kw):
    base = dict(output_dir=str(out or tmp_path / "run"), sampler="transformers", progress=False, logging_steps=1000,
                seed=0, max_steps=4, prompts_per_step=8, save_steps=1)
    base.update(kw)
    return GRPOConfig(**base)


def test_a_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """The third checkpoint write fails half-way (as torch's writer fails on a full disk): one line, exit status 1
    through run_main, the previous checkpoint whole, no temporary file left; the same command then resumes."""
    real_save, calls = torch.save, {"n": 0}

    def failing_save(obj, f, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            f.write(b"PK\x03\x04 half a checkpoint")
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(rundir_mod.torch, "save", failing_save)
    cfg = _config(tmp_path)
    with pytest.raises(RunError, match=r"cannot write .*checkpoint.pt: .*unexpected pos.*the last checkpoint in .* is "
                                       r"intact"):
        train(cfg, log=lambda *a: None)
    run = Path(cfg.output_dir)
    assert not (run / "checkpoint.pt.tmp").exists()
    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == 2
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]
    monkeypatch.setattr(rundir_mod.torch, "save", real_save)
    assert [r["step"] for r in read_metrics(train(cfg, log=lambda *a: None))] == [0, 1, 2, 3]


def test_a_checkpoint_larger_than_the_free_space_is_refused_before_writing(tmp_path, monkeypatch):
    real_usage = rundir_mod.shutil.disk_usage
    cfg = _config(tmp_path)

    def usage(path):
        u = real_usage(path)
        done = len(read_metrics(cfg.output_dir)) if (Path(cfg.output_dir) / "metrics.jsonl").exists() else 0
        return u._replace(free=1000) if done >= 2 else u

    monkeypatch.setattr(rundir_mod.shutil, "disk_usage", usage)
    with pytest.raises(RunError, match=r"checkpoint needs \d+\.\d MB and the disk has 0.0 MB free"):
        train(cfg, log=lambda *a: None)
    assert torch.load(Path(cfg.output_dir) / "checkpoint.pt", weights_only=True)["step"] == 1


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A small tmpfs at ``path`` (needs root and mount rights: skipped otherwise)."""
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.decode().strip()[:100]})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.slow
def test_a_really_full_disk_mid_write_and_a_really_read_only_directory(tmp_path):
    """On a real tmpfs: (1) after the first checkpoint the disk is filled so that the next checkpoint's tensors
    fit but the file does not: torch's write fails half-way; (2) the file system is remounted read-only mid-run;
    (3) a run is started in a read-only directory. One line each; the checkpoint on disk stays whole."""
    with tmpfs(tmp_path / "fs", "32m") as fs:
        cfg = _config(tmp_path, fs / "run", max_steps=6)

        def fill_disk(step, row):
            if step == 0:
                need = tensor_bytes(torch.load(fs / "run" / "checkpoint.pt", weights_only=True))
                free = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize
                with open(fs / "filler", "wb") as f:
                    f.write(b"\0" * (free - need - 3 * 4096))  # torch's format adds more than 12 kB to the tensors

        with pytest.raises(RunError, match=r"cannot write .*checkpoint.pt: the disk is full"):
            train(cfg, log=lambda *a: None, callbacks=[fill_disk])
        assert torch.load(fs / "run" / "checkpoint.pt", weights_only=True)["step"] == 1
        assert not (fs / "run" / "checkpoint.pt.tmp").exists()
        (fs / "filler").unlink()

        def read_only(step, row):
            if step == 2:
                subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)

        with pytest.raises(RunError, match=r"cannot write .*: the file system is read-only"):
            train(cfg, log=lambda *a: None, callbacks=[read_only])
        assert torch.load(fs / "run" / "checkpoint.pt", weights_only=True)["step"] == 3
        assert [r["step"] for r in read_metrics(fs / "run")] == [0, 1, 2]
        res = subprocess.run([*CLI, "--output-dir", str(fs / "other")], cwd=ROOT, capture_output=True, text=True)
        assert res.returncode == 2 and res.stderr.strip().splitlines() == [
            f"python -m llm train: error: output_dir: cannot write {fs / 'other'}/.lock: the file system is read-only"]
        subprocess.run(["mount", "-o", "remount,rw", str(fs)], check=True)
        assert [r["step"] for r in read_metrics(train(cfg, log=lambda *a: None))] == list(range(6))


@pytest.mark.slow
def test_an_error_during_the_run_is_one_line_of_its_own_below_the_progress_bar(tmp_path):
    """A step that fails (here a reward function that raises from the second step on) while the progress bar is
    drawn: the bar is closed first, so the one-line error starts a line of its own instead of trailing the bar."""
    (tmp_path / "failing_reward.py").write_text(
        "calls = 0\n"
        "def reward(completion, answer):\n"
        "    global calls\n"
        "    calls += 1\n"
        "    if calls > 16:\n"
        "        raise RuntimeError('reward service down')\n"
        "    return 1.0 if completion.strip() == answer else 0.0\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    main, tty = pty.openpty()  # stderr a terminal: the bar is drawn (in a file or a pipe it is lines instead)
    fcntl.ioctl(tty, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal 120 columns wide
    proc = subprocess.Popen([sys.executable, "-m", "llm.train", "--sampler", "transformers", "--max-steps", "3",
                             "--prompts-per-step", "2", "--reward-fn", "failing_reward:reward", "--output-dir",
                             str(tmp_path / "run")], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=tty)
    os.close(tty)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the terminal's last reader is gone: the process ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert proc.wait(timeout=300) == 2
    stderr = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    assert "step/s" in stderr or "step]" in stderr  # the bar was drawn
    lines = stderr.replace("\r", "\n").split("\n")
    errors = [ln for ln in lines if "error:" in ln]
    assert errors == ["python -m llm train: error: reward_fn: raised RuntimeError: reward service down for completion "
                      + errors[0].split("for completion ", 1)[1]], stderr[-2000:]
    assert "\npython -m llm train: error:" in stderr  # at the start of a line, not after the bar's last draw
