"""Several trainer processes (llm.models.distributed): two ranks compute the one-process step; torchrun, FSDP, faults."""

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import DTensor

from llm.tensors.metrics import is_wall_clock
from llm.tensors.sync_probe import SYNC_CHECKS
from llm.models.distributed import Ranks
from llm.run.rundir import read_metrics
from tests.helpers import CASES, ROOT, RTOL64, optimise_case, same_gradient, same_metric, train_command

pytestmark = pytest.mark.slow  # a vLLM server or engine, torchrun or compiling: not in make test-fast

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
#: What torchrun runs on every rank.
MODULE = ("-m", "llm.train")


#: The first step of a torchrun run with two ranks against one process (float32; the samples are the same, the
#: gradient's float32 sums are split differently): every logged metric to this relative tolerance (or 1e-6 absolute).
STEP0_RTOL = 1e-4
#: ... except the quantities of the updated policy pi_{k+1} (``after_update``): Adam's first step divides each
#: gradient entry by its own magnitude, so an entry whose gradient is rounding-sized moves by up to the learning rate
#: either way. Measured: the held-out improvement and bound estimates 1.7e-3 relative apart on a 2-core AMD EPYC host
#: (under 1e-4 on the Intel host where STEP0_RTOL was set).
AFTER_UPDATE_RTOL = 1e-2


#: torchrun --fsdp against one process, every metric of 4 steps (float32), each to FSDP_RTOL of the values it is
#: made of (``tests.helpers.metric_atol``: a bound's terms, a standard error's values) plus FSDP_ATOL: after each
#: update the two runs' weights differ by float rounding, which compounds over the steps. Measured on an AVX-512 host
#: at step 3 (per-prompt values of the held-out improvement and bound terms): up to 1.8e-3 relative apart, so the
#: updated policy's terms are held to AFTER_UPDATE_RTOL from step 0 on; the rest to 1e-3.
FSDP_RTOL, FSDP_ATOL = 1e-3, 1e-5


def after_update(key: str) -> bool:
    """A logged quantity of the updated policy pi_{k+1} (its TV, the improvement, the bound's terms involving it,
    the exact J after the update, the evaluation after it)."""
    return any(part in key for part in ("pi_new", "improvement", "surrogate", "penalty_tv", "bound_est/lower",
                                        "bound_est/frac", "insample/", "eval/"))


def same_first_step(want: dict, got: dict, key: str) -> bool:
    """One metric of a ranked run's first step against one process's: the sync check is float rounding itself (a
    few 1e-6 nats, so no relative tolerance), held within the float32 sync check's tolerance; the updated policy's
    terms to AFTER_UPDATE_RTOL of what they are made of (``tests.helpers.metric_atol``), the rest to STEP0_RTOL."""
    if key.startswith("sampling/logp_diff"):
        return got[key] <= SYNC_CHECKS["float32"].tolerance
    rtol, atol = (AFTER_UPDATE_RTOL, FSDP_ATOL) if after_update(key) else (STEP0_RTOL, 1e-6)
    return same_metric(want, got, key, rtol, atol, HELDOUT)


#: The FSDP test's runs: a checkpoint after every step, evaluation every 2 steps.
EVERY = ("--save-steps", "1", "--eval-steps", "2")


def _rank(rank: int, world: int, init_file: str, out: str, cases: list) -> None:
    """One rank of every case below in one process group (one spawn for all: each spawn costs seconds of imports)."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        for index, (case, micro_batch, by_length, fsdp) in enumerate(cases):
            result, grads = optimise_case(*case, micro_batch, by_length=by_length, ranks=Ranks(rank, world, fsdp))
            shards = [g for g in grads[0] if isinstance(g, DTensor)]
            sharded = len(shards)
            held, whole = sum(g.to_local().numel() for g in shards), sum(g.numel() for g in shards)
            grads = [[g.full_tensor() if isinstance(g, DTensor) else g for g in step] for step in grads]
            torch.save({"grads": grads, "metrics": result.stats.metrics(), "grad_norm": result.grad_norm,
                        "chain_tv_k": result.chain_tv_k, "logp_k": result.pi_k.logp, "entropy_k": result.pi_k.entropy,
                        "sharded": sharded, "held": held, "whole": whole},
                       f"{out}/case{index}_rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


TWO_RANK_CASES = [(case, micro_batch, by_length, False) for case in (CASES[0], CASES[3], CASES[5])
                  for micro_batch, by_length in ((0, False), (2, True))]


#: FSDP: whole passes, and micro-batches of 2 (rank 0's 3 rows in 2 passes, rank 1's 6 in 3: one idle pass).
FSDP_CASES = [(CASES[0], 0, False, True), (CASES[3], 2, False, True), (CASES[5], 2, True, True)]


ALL_TWO_RANK_CASES = TWO_RANK_CASES + FSDP_CASES


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory) -> Path:
    """Every case's two ranks, run once in one spawn: <dir>/case<i>_rank<r>.pt."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("two_ranks")
    mp.spawn(_rank, args=(2, str(out / "init"), str(out), ALL_TWO_RANK_CASES), nprocs=2)
    return out


@pytest.mark.parametrize("index", range(len(ALL_TWO_RANK_CASES)), ids=[
    f"{c[0][0]}-mb{c[1]}{'-by_length' if c[2] else ''}{'-fsdp' if c[3] else ''}" for c in ALL_TWO_RANK_CASES])
def test_two_ranks_compute_the_one_process_step(two_rank_results, index):
    """3 prompts x G = 3 over 2 ranks (1 and 2 prompts), i = 2 inner steps: on every rank the summed gradients of
    both inner steps, the loss statistics, the gradient norm and the whole-batch log pi_k and entropies equal one
    process's (float64, 1e-10); the chain-rule TV (summed in float32) to 1e-6. With FSDP (the blocks of the policy,
    alpha and pi_ref sharded, each rank running as many passes as the other) the same, with the blocks' gradients
    gathered whole."""
    case, micro_batch, by_length, fsdp = ALL_TWO_RANK_CASES[index]
    whole, whole_grads = optimise_case(*case, micro_batch, by_length=by_length)
    for rank in range(2):
        got = torch.load(two_rank_results / f"case{index}_rank{rank}.pt", weights_only=False)
        assert (got["sharded"] > 0) == fsdp  # FSDP: the blocks' gradients are shards
        assert whole.grad_norm > 1.0  # max_grad_norm = 1: the gradients compared were clipped
        for step_w, step_r in zip(whole_grads, got["grads"], strict=True):
            for gw, gr in zip(step_w, step_r, strict=True):
                assert same_gradient(gr, gw, RTOL64), rank
        want = whole.stats.metrics()
        assert want.keys() == got["metrics"].keys()
        for key in want:
            assert math.isclose(want[key], got["metrics"][key], rel_tol=RTOL64, abs_tol=1e-12), (rank, key)
        assert math.isclose(whole.grad_norm, got["grad_norm"], rel_tol=RTOL64)
        # tv_rows sums in float32 (llm.tensors.diagnostics): the two ranks' partial sums round differently
        assert math.isclose(whole.chain_tv_k, got["chain_tv_k"], rel_tol=1e-6) and whole.chain_tv_k > 0
        assert torch.allclose(whole.pi_k.logp, got["logp_k"], rtol=RTOL64, atol=1e-12)
        assert torch.allclose(whole.pi_k.entropy, got["entropy_k"], rtol=RTOL64, atol=1e-12)
    if fsdp:  # each rank holds a part of every block's gradient (so of its weights and moments), together all of it
        held = [torch.load(two_rank_results / f"case{index}_rank{r}.pt", weights_only=False)["held"] for r in range(2)]
        assert sum(held) == got["whole"] and max(held) < 0.6 * got["whole"], (held, got["whole"])


#: Held-out prompts of the runs compared below.
HELDOUT = 2
#: Adam's epsilon of the runs compared below. Adam's first steps move each entry by about lr g/(|g| + eps): at the
#: default 1e-8 an entry whose gradient is rounding moves by a fair share of lr in a direction the rounding sets, so
#: two runs that sum in another order part by more than float rounding (1.2e-3 relative at step 2 on an AVX-512 host,
#: a held-out standard error). At 1e-6 such entries barely move (tests/llm/test_update.py measured the same).
ADAM_EPSILON = "1e-6"


def _cli(out: Path, steps: int) -> list[str]:
    """``python -m llm.train``'s options of the runs compared below (torchrun's command: "-m", "llm.train" first)."""
    return ["--sampler", "transformers", "--max-steps", str(steps), "--prompts-per-step", "8",
            "--heldout-prompts", str(HELDOUT), "--sync-period", "2", "--num-threads", "1", "--no-progress", "--logging-steps",
            "100", "--tv-diagnostics", "--insample-diagnostics", "--adam-epsilon", ADAM_EPSILON, "--output-dir",
            str(out)]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> list[dict]:
    """The rows of a one-process run of ``_cli``'s settings, 3 steps (the torchrun runs below are compared with it;
    a shorter run's rows are its first rows: constant learning rate, nothing that depends on the run's length)."""
    out = tmp_path_factory.mktemp("one_process") / "run"
    train_command(*_cli(out, 3))
    return read_metrics(out)


@pytest.mark.slow
def test_torchrun_with_two_ranks_logs_the_one_process_metrics(tmp_path, one_process):
    """torchrun --nproc-per-node 2: one metrics.jsonl (rank 0 writes; every row once), the same completions and
    rewards at every step, every metric of the first step equal to a one-process run's to STEP0_RTOL (after it the
    runs drift apart by float32 rounding of the split gradient sums, amplified by Adam), and a checkpoint that records
    two ranks."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    two = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", *MODULE, *_cli(tmp_path / "two", 3)],
                         cwd=ROOT, capture_output=True, text=True, env=env)
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = one_process, read_metrics(tmp_path / "two")
    assert [r["step"] for r in b] == [0, 1, 2]
    for x, y in zip(a, b):
        assert (x["reward"], x["lag"], x["heldout/reward"]) == (y["reward"], y["lag"], y["heldout/reward"])
    first = {k: v for k, v in a[0].items() if not is_wall_clock(k)}
    assert first.keys() == {k for k in b[0] if not is_wall_clock(k)}
    for key, value in first.items():
        assert same_first_step(a[0], b[0], key), (key, value, b[0][key])
    assert torch.load(tmp_path / "two" / "checkpoint.pt", weights_only=True)["world_size"] == 2


@pytest.mark.slow
def test_torchrun_with_one_rank_and_fsdp_runs_a_group_of_one(tmp_path, one_process):
    """torchrun --nproc-per-node 1 --fsdp: a process group of one (gloo here, NCCL on a GPU: tests/gpu) whose
    collectives run and whose blocks are FSDP2 modules over a one-rank mesh; it logs a one-process run's rewards
    and every metric of its first step to STEP0_RTOL (AFTER_UPDATE_RTOL for the updated policy's terms)."""
    res = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "1", *MODULE, *_cli(tmp_path / "ranked", 2),
                          "--fsdp"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "trainer processes: 1 (gloo, FSDP), this one on cpu" in res.stdout, res.stdout[-2000:]
    a, b = one_process[:2], read_metrics(tmp_path / "ranked")
    assert [r["reward"] for r in a] == [r["reward"] for r in b]
    for key, value in a[0].items():
        if not is_wall_clock(key):
            assert same_first_step(a[0], b[0], key), (key, value, b[0][key])
    ckpt = torch.load(tmp_path / "ranked" / "checkpoint.pt", weights_only=True)
    assert ckpt["fsdp"] and ckpt["world_size"] == 1


def _rank_pid(marker: str, rank: int) -> int | None:
    """The pid of the torchrun worker of ``rank`` whose command line holds ``marker``."""
    for pid in subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return int(pid)
    return None


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True], ids=["data_parallel", "fsdp"])
def test_a_rank_that_dies_ends_the_run_in_one_line_and_it_resumes(tmp_path, fsdp):
    """SIGKILL to rank 1 of 2 mid-run: rank 0 stops with one line saying so, the checkpoint loads, and the run
    resumed by one process (which says the checkpoint was written by two) ends with every step logged once; with
    --fsdp too (the failure then surfaces in FSDP's own collectives)."""
    import signal
    import time

    out = tmp_path / "killed"
    cli = [*_cli(out, 10), "--save-steps", "1", *(["--fsdp"] if fsdp else [])]
    proc = subprocess.Popen([TORCHRUN, "--standalone", "--nproc-per-node", "2", *MODULE, *cli], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "metrics.jsonl").is_file() or len(read_metrics(out)) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.1)
    pid = _rank_pid(str(out), 1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    ours = [ln for ln in err.splitlines() if ln.startswith("python -m llm train: error:")]
    # rank 0 meets the dead rank in a collective, or torchrun ends it first (SIGTERM): one line either way
    assert len(ours) == 1 and ("rank 0 of 2: another trainer process stopped" in ours[0] or
                               "rank 0 of 2: ended by torchrun" in ours[0]), err[-2000:]
    assert ours[0].count("rank 0 of 2") == 1, ours[0]  # said once, not wrapped in itself
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    # step 2's row is written before step 3's checkpoint, which under FSDP needs rank 1 to gather (it may be dead)
    assert ckpt["world_size"] == 2 and ckpt["step"] >= (2 if fsdp else 3)
    printed = train_command(*[a for a in cli if a != "--fsdp"])
    assert "the checkpoint was written by 2 trainer process(es), this run has 1" in printed
    assert [r["step"] for r in read_metrics(out)] == list(range(10))


def test_the_in_process_vllm_engine_is_refused_under_torchrun(tmp_path):
    """It would initialise torch.distributed inside torchrun's group and hang both ranks: one line instead."""
    res = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "llm.train", "--sampler", "vllm",
                          "--max-steps", "1", "--output-dir", str(tmp_path / "run")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode != 0
    ours = [ln for ln in res.stderr.splitlines() if ln.startswith("python -m llm train: error:")]
    assert ours and all("sampler: the in-process vLLM engine" in ln for ln in ours), res.stderr[-2000:]


@pytest.mark.vllm
def test_one_torchrun_rank_with_the_in_process_engine_runs_as_one_process(tmp_path):
    """torchrun --nproc-per-node 1 with the in-process engine (the default sampler where vLLM imports): no process
    group of one (the engine sets up torch.distributed itself); the run trains as without torchrun."""
    pytest.importorskip("vllm")
    res = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "1", "-m", "llm.train", "--sampler", "vllm",
                          "--max-steps", "1", "--no-progress", "--output-dir", str(tmp_path / "run")], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "trainer processes:" not in res.stdout
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [0]


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", *MODULE, *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=600)


def _errors(res: subprocess.CompletedProcess) -> str:
    """What a failed torchrun said, whole (pytest shortens a list): error lines, the ranks' exceptions, aborts
    ("terminate called ..."), signals (torchrun's frames left out), and stdout's last line (rank 0's summary there:
    the run had finished and was written before a rank failed)."""
    said = [ln for ln in res.stderr.splitlines() if "File " not in ln and (
        ln.startswith("[rank") or any(w in ln.lower() for w in ("error", "signal", "terminate", "what()")))]
    return "\n".join([*said, "stdout's last line: " + (res.stdout.strip().splitlines() or [""])[-1]])


@pytest.mark.slow
def test_fsdp_under_torchrun_logs_the_one_process_metrics_and_its_checkpoints_resume_either_way(tmp_path):
    """torchrun --fsdp with 2 ranks, a checkpoint after every step, against a one-process run of 4 steps: FSDP runs
    steps 0-1 and a one-process run resumes its checkpoint for steps 2-3; a one-process run's checkpoint after step
    1 is resumed by FSDP for steps 2-3. Every metric of every step equals the one-process run's to FSDP_RTOL (so
    FSDP computes every step, from scratch and from either checkpoint); the FSDP checkpoint holds whole tensors in
    the one-process layout (the same keys and shapes, the Adam moments included). Evaluation every 2 steps (under
    FSDP on rank 0's gathered copy) is among the metrics compared. (The one-process run of 4 steps is the 2-step
    run's copy resumed: a resumed run logs the uninterrupted run's rows, tests/contracts/test_faults.py.)"""
    train_command(*_cli(tmp_path / "to_fsdp", 2), *EVERY)
    shutil.copytree(tmp_path / "to_fsdp", tmp_path / "one")
    train_command(*_cli(tmp_path / "one", 4), *EVERY)
    half = _torchrun(*_cli(tmp_path / "to_one", 2), *EVERY, "--fsdp")  # FSDP, then one process
    assert half.returncode == 0, _errors(half)
    ckpt, ref = (torch.load(p / "checkpoint.pt", weights_only=True) for p in (tmp_path / "to_one", tmp_path / "one"))
    assert ckpt["fsdp"] and ckpt["world_size"] == 2 and not ref["fsdp"]
    for part in ("policy", "alpha"):
        assert {k: v.shape for k, v in ckpt[part].items()} == {k: v.shape for k, v in ref[part].items()}
        assert not any(isinstance(v, DTensor) for v in ckpt[part].values())
    moments = lambda c: {i: {k: v.shape for k, v in s.items()} for i, s in c["optimizer"]["state"].items()}  # noqa
    assert moments(ckpt) == moments(ref)
    train_command(*_cli(tmp_path / "to_one", 4), *EVERY)
    then = _torchrun(*_cli(tmp_path / "to_fsdp", 4), *EVERY, "--fsdp")
    assert then.returncode == 0, _errors(then)
    want = read_metrics(tmp_path / "one")
    for name in ("to_one", "to_fsdp"):
        got = read_metrics(tmp_path / name)
        assert [r["step"] for r in got] == [0, 1, 2, 3], name
        for x, y in zip(want, got):
            for key, value in x.items():
                if key.startswith("sampling/logp_diff"):  # float rounding itself (~1e-6): within the sync check's
                    assert y[key] <= SYNC_CHECKS["float32"].tolerance, (name, x["step"], key)
                elif not is_wall_clock(key):
                    rtol = AFTER_UPDATE_RTOL if after_update(key) else FSDP_RTOL
                    assert same_metric(x, y, key, rtol, FSDP_ATOL, HELDOUT), (name, x["step"], key, value, y[key])


def test_a_ranks_one_line_is_not_wrapped_in_itself():
    """torchrun's SIGTERM can raise a rank's RunError inside a collective: fault() keeps it as it is (a suite run
    once printed 'rank 0 of 2: another trainer process stopped ... (RunError: rank 0 of 2: ended by torchrun ...)');
    any other failure becomes the one line."""
    from runkit.cli import RunError

    ranks = Ranks(0, 2, False)
    ended = RunError("rank 0 of 2: ended by torchrun")
    assert ranks.fault(ended) is ended
    assert str(ranks.fault(RuntimeError("gloo: connection closed"))).startswith("rank 0 of 2: another trainer process")
