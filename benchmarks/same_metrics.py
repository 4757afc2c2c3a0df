"""Does a change of the trainer's code leave what it computes alone? ``python benchmarks/same_metrics.py record DIR``
runs four fixed-seed configurations into DIR; ``python benchmarks/same_metrics.py compare DIR_A DIR_B`` says whether
two recordings (say, before and after a restructuring) logged identical metrics: every key but the wall-clock ones
(``time/*``), row for row, bit for bit.

The configurations (the built-in task and model, 8 steps each, held-out prompts, evaluation, both diagnostics on so
every code path logs): the transformers sampler at v = 4; the in-process vLLM engine at v = 2; asynchronous
generation at v = 2; torchrun with two trainer processes (transformers sampler) at v = 2. About 3 minutes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--max-steps", "8", "--prompts-per-step", "8", "--heldout-prompts", "4", "--eval-steps", "4",
          "--tv-diagnostics", "--insample-diagnostics", "--no-progress", "--logging-steps", "100", "--save-steps", "3",
          "--num-threads", "1", "--seed", "3"]
RUNS = {
    "transformers_v4": ["--sampler", "transformers", "--sync-period", "4"],
    "vllm_v2": ["--sampler", "vllm", "--sync-period", "2"],
    "async_v2": ["--sampler", "transformers", "--sync-period", "2", "--async-generation"],
    "torchrun_2ranks_v2": ["--sampler", "transformers", "--sync-period", "2"],
}


def record(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, args in RUNS.items():
        run = out / name
        launcher = ([str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", "2"]
                    if name.startswith("torchrun") else [sys.executable])
        res = subprocess.run([*launcher, "-m", "llm.train", *COMMON, *args, "--output-dir", str(run)], cwd=ROOT,
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"{name} failed:\n{res.stderr[-3000:]}")
        print(f"recorded {name}: {len((run / 'metrics.jsonl').read_text().splitlines())} rows")


def wall_clock(key: str) -> bool:
    """A key whose value is a measured time or rate (``time/*``; ``sync/mb_per_s`` of earlier recordings)."""
    return key.startswith(("time/", "perf/")) or key in ("sync/mb_per_s", "time/sync_mb_per_s")


def rows(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not wall_clock(k)}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def compare(a: Path, b: Path) -> int:
    differ = 0
    for name in RUNS:
        ra, rb = rows(a / name), rows(b / name)
        bad = [(x["step"], k) for x, y in zip(ra, rb, strict=True) for k in sorted(x.keys() | y.keys())
               if json.dumps(x.get(k)) != json.dumps(y.get(k))]
        keys = sum(len(x) for x in ra)
        print(f"{name}: {len(ra)} rows, {keys} values: " + ("identical" if not bad else
                                                             f"{len(bad)} differ, first {bad[:5]}"))
        differ += len(bad)
    return 1 if differ else 0


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "record":
        record(Path(sys.argv[2]))
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "compare":
        return compare(Path(sys.argv[2]), Path(sys.argv[3]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
