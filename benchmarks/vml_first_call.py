"""How often a fresh process's first forward pass of SmolLM2-135M-Instruct differs from its second, with and without
``llm.models.vml.resolve_vml_dispatch``: ``python benchmarks/vml_first_call.py [--processes 8]`` (~10 s per process).

Each process does what a benchmark or a trainer does first: a 2048^3 float32 and a bfloat16 matmul (the thread pool
starts), then, in the warmed arm, ``resolve_vml_dispatch()``; then it loads the model in float32 and runs the same
two-prompt batch (the real-model benchmark's first two chat-template prompts, left-padded) through it three times
in train mode. A pass whose logits differ from the next identical pass is a first call of a oneMKL vector-math
function that ran a low-accuracy kernel on one thread's chunk (``llm.models.vml``). Prints, per arm, the processes whose
first pass differed, the largest logit gap and whether the later passes agreed to the bit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import ROOT, run_child  # noqa: E402

CHILD = r'''
import json, sys
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/benchmarks")
import torch
from throughput import matmul_flops
for dtype in (torch.float32, torch.bfloat16):
    matmul_flops(dtype, reps=3)
if sys.argv[2] == "warm":
    from llm.models.vml import resolve_vml_dispatch
    resolve_vml_dispatch()
from llm.tensors.batch import make_batch
from llm.models.model import load_policy
from llm.models.pretrained import smollm2_dir
from real_model import real_workload
model_dir = smollm2_dir(log=lambda *a: None)
prompts = [list(p) for p in real_workload(model_dir).prompt_ids[:2]]
model, tok = load_policy(str(model_dir), torch.device("cpu"))
model.train()
batch = make_batch(prompts, [p[:3] for p in prompts], tok.pad_token_id, torch.device("cpu"))
real = batch.attention_mask.bool()
with torch.no_grad():
    out = [model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                 use_cache=False).logits[real] for _ in range(3)]
print("RESULT " + json.dumps({"first_gap": float((out[0] - out[1]).abs().max()),
                              "later_gap": float((out[1] - out[2]).abs().max())}))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=8, help="fresh processes per arm")
    args = ap.parse_args()
    print(f"{args.processes} fresh processes per arm, one after another")
    for arm in ("cold", "warm"):
        runs = []
        for k in range(args.processes):
            runs.append(run_child(CHILD, str(ROOT), arm, what=f"a {arm} process"))
            print(f"  {arm} {k + 1}: first-pass gap {runs[-1]['first_gap']:.1e}, later {runs[-1]['later_gap']:.1e}",
                  flush=True)
        bad = sum(r["first_gap"] > 0 for r in runs)
        label = "with resolve_vml_dispatch" if arm == "warm" else "without it"
        print(f"{label}: {bad} of {len(runs)} processes' first pass differed from their second (largest logit gap "
              f"{max(r['first_gap'] for r in runs):.1e}); later passes agreed to the bit in "
              f"{sum(r['later_gap'] == 0 for r in runs)} of {len(runs)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
