"""Seconds until vLLM's server answers, by how it is started: ``python benchmarks/archive/server_start.py`` (about 2 minutes
on 2 cores). ``python -m llm serve`` runs vLLM's server entry point from ``python -c`` (``llm.sampling.launch.SERVER_MAIN``);
the engine core that vLLM spawns then imports only what it runs. With ``python -m
vllm.entrypoints.openai.api_server`` (the earlier command) the spawned process re-imports that main module first,
the whole server stack. Each start: ``ServerProcess.start`` on the built-in model, timed until /health answers,
then stopped; the two commands alternate, ``--reps`` starts each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import llm.sampling.launch as launch  # noqa: E402

MODULE_MAIN = ["-m", "vllm.entrypoints.openai.api_server"]


def seconds_to_ready(module_main: bool, log: Path) -> float:
    """One start of the built-in model's server, ``-m`` main or ``-c`` main."""
    command = launch.server_command

    def with_module_main(*a, **k):
        args, env = command(*a, **k)
        i = args.index("-c")
        args[i:i + 2] = MODULE_MAIN
        return args, env

    launch.server_command = with_module_main if module_main else command
    try:
        server = launch.ServerProcess(launch.ServeConfig(), log=lambda *a: None, log_file=log)
        t0 = time.perf_counter()
        server.start()
        seconds = time.perf_counter() - t0
        server.stop()
    finally:
        launch.server_command = command
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2, help="starts of each command")
    args = ap.parse_args()
    times = {"python -c SERVER_MAIN (python -m llm serve's)": [], "python -m vllm.entrypoints.openai.api_server": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for name in times:
                times[name].append(seconds_to_ready(name.startswith("python -m"), Path(tmp) / f"{rep}.log"))
                print(f"{name}: ready after {times[name][-1]:.1f} s", flush=True)
    print("| command | median s to ready | starts |\n|---|---:|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.1f} | {', '.join(f'{t:.1f}' for t in ts)} |")
    medians = [statistics.median(ts) for ts in times.values()]
    print(f"ratio: {medians[1] / medians[0]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
