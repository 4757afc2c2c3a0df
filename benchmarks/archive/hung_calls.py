"""A training step whose environment's tool hangs on some episodes, timed on one or more source trees side by side.

    .venv/bin/python benchmarks/archive/hung_calls.py                              # this tree
    git worktree add /tmp/before 324957b                                   # the tree before the agents issue
    .venv/bin/python benchmarks/archive/hung_calls.py --tree /tmp/before --tree .  # before and after, same machine, one run

One step of ``python -m llm train`` on the built-in agent model (transformers sampler, ``--no-exact-j``, no
evaluation): P prompts x G = 4 episodes of questions a*b, an environment whose ``multiply`` never returns when a is 7
(``--hung`` questions of the P), ``--tool-timeout`` seconds. The environment scores by its ``reward`` attribute, which
every tree reads. Prints each tree's generation phase (``time/generate``), the whole step, the hung calls and the
tool-call failures of the step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ENV = '''
import time


class HangsOnSeven:
    """reset keeps the question; multiply never returns when a is 7; the reward attribute is 1 iff it answered."""

    def __init__(self):
        self.reward = 0.0

    def reset(self, **row):
        self.question, self.reward = row["prompt"], 0.0

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        if a == 7:
            time.sleep(3600)
        self.reward = 1.0
        return a * b
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", default=[], help="a source tree to time (repeat; default: this one)")
    ap.add_argument("--prompts", type=int, default=16, help="P: prompts per step (4 episodes each)")
    ap.add_argument("--hung", type=int, default=4, help="how many of the P questions hang (a = 7)")
    ap.add_argument("--tool-timeout", type=float, default=2.0)
    args = ap.parse_args()
    trees = [Path(t).resolve() for t in args.tree] or [ROOT]
    work = Path(tempfile.mkdtemp(prefix="hung_calls_"))
    (work / "hung_env.py").write_text(ENV)
    questions = [f"7*{b}=" for b in range(2, 2 + args.hung)] + \
        [f"{a}*{b}=" for a in (3, 4, 5, 6, 8) for b in range(2, 9)][: args.prompts - args.hung]
    (work / "rows.jsonl").write_text("".join(json.dumps({"prompt": q}) + "\n" for q in questions))
    print(f"{args.prompts} prompts x 4 episodes, {args.hung} questions (x 4 episodes) hang, tool_timeout "
          f"{args.tool_timeout:g} s; {os.cpu_count()} CPUs")
    print(f"{'tree':<40} {'generate s':>11} {'step s':>8} {'process s':>10} {'failed calls':>13}")
    for tree in trees:
        model = subprocess.run([sys.executable, "-c", "from llm.models.tiny import agent_model_dir; "
                                "print(agent_model_dir())"], capture_output=True, text=True, check=True,
                               env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree).stdout.strip()
        out = work / f"run_{len(list(work.glob('run_*')))}"
        cmd = [sys.executable, "-m", "llm.train", "--model-name-or-path", model, "--dataset", str(work / "rows.jsonl"),
               "--environment-factory", "hung_env:HangsOnSeven", "--tool-timeout", str(args.tool_timeout),
               "--prompts-per-step", str(args.prompts), "--num-generations", "4", "--max-completion-length", "40",
               "--max-steps", "1", "--sampler", "transformers", "--no-exact-j", "--eval-steps", "0",
               "--output-dir", str(out)]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=tree,
                              env={**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{work}"})
        took = time.perf_counter() - t0
        if done.returncode != 0:
            print(f"{str(tree):<40} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")
            continue
        row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
        step = sum(v for k, v in row.items() if k.startswith("time/") and k.count("/") == 1 and
                   k[5:] in ("sync", "generate", "score", "behaviour", "reference", "optimise", "diagnostics", "eval"))
        failures = row["tools/failure_frequency"] * row["tools/call_frequency"] * args.prompts * 4
        print(f"{str(tree):<40} {row['time/generate']:>11.1f} {step:>8.1f} {took:>10.1f} {failures:>13.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
