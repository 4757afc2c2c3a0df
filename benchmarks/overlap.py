"""Asynchronous generation and two trainer ranks, measured side by side in one run: ``make benchmark-async``.

vLLM's server runs in its own process with its compute threads bound to one core (VLLM_CPU_OMP_THREADS_BIND), the
trainer on the other core (one torch thread, CPU affinity set after the server has started). Our trainer runs the
throughput benchmark's workload (``benchmarks/throughput.py``: the 19M-parameter Qwen2, 4 prompts x G = 16, up to 64
tokens, float32) against it at v = 1, 2, 4, synchronously and with ``--async-generation``.

Printed: steps/s and the trainer's ``time/<phase>`` metrics per configuration (with asynchronous generation
``time/generate`` is the time the trainer waited for the window); the ratio async / sync at each v; and a step-time
model with overlap fed with the synchronous runs' phases:

    synchronous:  t(v) = gen + train + sync
    asynchronous: t(v) = max(gen, train + check / v) + sync

per step (the next window is generated while this one trains, after the sync at the window's start; gen =
generation per step with window batching at that v, train = every other phase, sync = the sync's seconds per step;
check = the sync check at each window's first step, which under asynchronous generation is a forward of alpha's
weights over one group, estimated as a third of the optimise phase's forward and backward over 1/P of the
batch). The model is then fed with the paper's 7B
timings, whose split between generation and training the paper does not report, for several generation shares.

Then trainer ranks: the same workload with the transformers sampler (the in-process vLLM engine cannot share
torchrun's process group; the server would take a core) at v = 4, in one process with 1 and with 2 torch threads,
and under ``torchrun --nproc-per-node 2`` (1 thread each; rank 0 also generates): steps/s and the phases, of which
``time/optimise`` is the one the ranks split.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from throughput import G, MAX_TOKENS, PAPER_ITS, PROMPTS, Row, build_bench_model, run_ours  # noqa: E402

V_VALUES = (1, 2, 4)
SHOWN = ("time/generate", "time/sync", "time/behaviour", "time/optimise", "time/score")


def train_seconds(row: Row) -> float:
    """Seconds per step of everything but generation and the sync."""
    return sum(t for k, t in row.phases.items() if k not in ("time/generate", "time/sync"))


def sync_per_step(row: Row) -> float:
    return row.phases.get("time/sync", 0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "runs" / "benchmark_async"))
    ap.add_argument("--server-core", type=int, default=1, help="the core vLLM's server computes on")
    ap.add_argument("--trainer-core", type=int, default=0, help="the core the trainer runs on")
    ap.add_argument("--skip-async", action="store_true", help="skip the server rows (asynchronous generation)")
    ap.add_argument("--skip-ranks", action="store_true", help="skip the 1 vs 2 trainer ranks rows")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from llm.models.tiny import cache_root

    model_dir = build_bench_model(cache_root() / "bench-qwen2-19m")
    if not args.skip_ranks:
        ranks_rows(model_dir, out)  # first: it needs both cores for itself
    if not args.skip_async:
        async_rows(model_dir, out, args.server_core, args.trainer_core)
    return 0


def run_cli(name: str, model_dir: Path, out: Path, v: int, launcher: list[str], threads: int) -> dict:
    """Our trainer as a command (under ``launcher``, e.g. torchrun); steps/s and mean phases over the steps after
    the first window."""
    run = out / name.replace(" ", "_")
    shutil.rmtree(run, ignore_errors=True)
    steps = 3 * v
    cmd = [*launcher, "-m", "llm.train", "--model-name-or-path", str(model_dir), "--output-dir", str(run),
           "--sampler", "transformers", "--sync-period", str(v), "--max-steps", str(steps),
           "--prompts-per-step", str(PROMPTS),
           "--num-generations", str(G), "--max-completion-length", str(MAX_TOKENS), "--beta", "0",
           "--no-tv-diagnostics", "--no-insample-diagnostics", "--save-steps", "0", "--learning-rate", "1e-5",
           "--no-mask-zero-std-groups", "--no-exact-j", "--no-progress", "--num-threads", str(threads)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    if res.returncode != 0:
        raise SystemExit(f"{name} failed: {res.stderr[-2000:]}")
    from llm.run.rundir import read_metrics

    rows = read_metrics(run)[v:]
    from llm.tensors.metrics import PHASE_KEYS

    phases = {k: statistics.fmean(r[k] for r in rows) for k in PHASE_KEYS}
    return {"name": name, "steps_per_s": 1 / sum(phases.values()), **phases}


def ranks_rows(model_dir: Path, out: Path) -> None:
    v = 4
    torchrun = str(Path(sys.executable).parent / "torchrun")
    runs = [run_cli("1 process, 1 thread", model_dir, out, v, [sys.executable], 1),
            run_cli("1 process, 2 threads", model_dir, out, v, [sys.executable], 2),
            run_cli("torchrun 2 ranks x 1 thread", model_dir, out, v,
                    [torchrun, "--standalone", "--nproc-per-node", "2"], 1)]
    print(f"\ntrainer ranks (transformers sampler on rank 0, v={v}, {PROMPTS} prompts x G={G}):")
    print("| configuration | steps/s | time/generate | time/optimise | time/diagnostics | vs 1 process, 2 threads |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['name']} | {r['steps_per_s']:.3f} | {r.get('time/generate', 0):.3f} | {r['time/optimise']:.3f} | "
              f"{r.get('time/diagnostics', 0):.3f} | {r['steps_per_s'] / runs[1]['steps_per_s']:.2f}x |", flush=True)


def async_rows(model_dir: Path, out: Path, server_core: int, trainer_core: int) -> None:
    from llm.sampling.launch import ServeConfig, ServerProcess

    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(server_core)  # the server's compute threads: one core
    print(f"\nserver on core {server_core}, trainer on core {trainer_core} (1 torch thread); "
          f"v in {V_VALUES}, synchronous and asynchronous generation", flush=True)
    rows: dict[tuple[int, bool], Row] = {}
    with ServerProcess(ServeConfig(model=str(model_dir), port=0, max_model_len=128), log=lambda *a: None,
                       log_file=out / "server.log") as server:
        os.sched_setaffinity(0, {trainer_core})  # after the server started: it keeps both cores' affinity
        for v in V_VALUES:
            for asynchronous in (False, True):
                name = f"server v={v} {'async' if asynchronous else 'sync'}"
                rows[v, asynchronous] = run_ours(name, model_dir, "server", v, "float32", out, server_url=server.url,
                                                 windows=3 if v < 4 else 2, async_generation=asynchronous,
                                                 num_threads=1)
                print(f"  done: {name}: {rows[v, asynchronous].steps_per_s:.3f} steps/s", flush=True)

    print(f"\n| configuration | steps/s | s/step | " + " | ".join(SHOWN) + " | async / sync |")
    print("|" + "---|" * (len(SHOWN) + 4))
    for (v, asynchronous), r in rows.items():
        ratio = r.steps_per_s / rows[v, False].steps_per_s
        times = " | ".join(f"{r.phases.get(k, 0.0):.3f}" for k in SHOWN)
        print(f"| {r.name} | {r.steps_per_s:.3f} | {1 / r.steps_per_s:.2f} | {times} | {ratio:.2f}x |")

    print("\nstep-time model with overlap, fed with each v's synchronous phases (gen, train, sync per step):")
    for v in V_VALUES:
        s = rows[v, False]
        gen, train, sync = s.phases["time/generate"], train_seconds(s), sync_per_step(s)
        check = s.phases["time/optimise"] / 3 / PROMPTS
        pred = (gen + train + sync) / (max(gen, train + check / v) + sync)
        meas = rows[v, True].steps_per_s / s.steps_per_s
        no_check = (gen + train + sync) / (max(gen, train) + sync)
        print(f"  v={v}: gen {gen:.3f} s, train {train:.3f} s, sync {sync:.3f} s, check {check:.3f} s per window: "
              f"predicted async speed-up {pred:.2f}x (without the check {no_check:.2f}x), "
              f"measured {meas:.2f}x; async time/behaviour {rows[v, True].phases.get('time/behaviour', 0):.3f} s")

    t1, t10 = 1 / PAPER_ITS[1], 1 / PAPER_ITS[10]
    sync = (t1 - t10) / (1 - 1 / 10)
    work = t1 - sync
    print(f"\nthe paper's 7B (TP 4, colocated): {t1:.1f} s/step at v=1, {t10:.1f} at v=10; the model without overlap "
          f"implies a sync of {sync:.1f} s and {work:.1f} s of generation + training per step. With generation and "
          "training on separate devices at the same speeds, asynchronous generation at v=10 would give:")
    for share in (0.3, 0.5, 0.7):
        gen, train = share * work, (1 - share) * work
        t_async = max(gen, train) + sync / 10
        print(f"  generation {share:.0%} of the work: {t_async:.1f} s/step, {t10 / t_async:.2f}x the synchronous "
              f"v=10 step and {t1 / t_async:.2f}x the v=1 step")


if __name__ == "__main__":
    raise SystemExit(main())
