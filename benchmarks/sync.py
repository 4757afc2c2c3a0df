"""Seconds per weight sync of the in-process vLLM engine on SmolLM2-135M-Instruct, by transport:
``python benchmarks/sync.py`` (~2 min).

For each CPU backend of ``llm.sampling.weight_transfer`` (``gloo_cpu``: one flat buffer per dtype broadcast over a
gloo group, the server's transport, here within one process; ``local_cpu``: the trainer's tensors handed over by
reference, the in-process default), a fresh process with the trainer's process settings (``llm.models.vml``,
``keep_freed_memory``) loads the policy in float32, starts the engine with the trainer's CPU settings for the
real-model benchmark's window, syncs once (untimed: the first sync also repacks vLLM's layers), then times
``--syncs`` syncs, each after moving every weight, and checks the engine's log-probs of a short generation against
the policy's after the last. Prints the median seconds per sync and the ratio of the two backends.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import ROOT, run_child  # noqa: E402

CHILD = r'''
import json, sys, time
sys.path.insert(0, sys.argv[1])
from llm.models.vml import resolve_vml_dispatch
from runkit.host_memory import keep_freed_memory
resolve_vml_dispatch(); keep_freed_memory()
import torch
from llm.tensors.batch import make_batch
from llm.tensors.logprobs import completion_logprobs
from llm.models.model import load_policy
from llm.models.pretrained import smollm2_dir
from llm.sampling.vllm_engine import VLLMSampler
backend, syncs = sys.argv[2], int(sys.argv[3])
model_dir = smollm2_dir(log=lambda *a: None)
model, tok = load_policy(str(model_dir), torch.device("cpu"))
sampler = VLLMSampler(str(model_dir), dtype="float32", seed=0, max_model_len=160, eos_token_id=tok.eos_token_id,
                      sequences=128, group=8, prompt_tokens=64, trim_memory=False, weight_backend=backend)
sampler.load_weights(model)
seconds = []
for k in range(syncs):
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.0 + 1e-3 * (-1) ** k)
    t0 = time.perf_counter()
    sampler.load_weights(model)
    seconds.append(time.perf_counter() - t0)
prompt = tok("What is 3 + 4?")["input_ids"]
out = sampler.generate([prompt], n=4, max_tokens=8, temperature=1.0, seed=0)
batch = make_batch([prompt] * 4, out.completion_ids, tok.pad_token_id, torch.device("cpu"))
with torch.no_grad():
    ours = completion_logprobs(model, batch, 1.0).logp
gap = max(abs(float(ours[i, t]) - lp) for i, lps in enumerate(out.logprobs) for t, lp in enumerate(lps))
print("RESULT " + json.dumps({"seconds": seconds, "gb": sampler.last_sync_bytes / 1e9, "gap": gap}))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--syncs", type=int, default=5, help="timed syncs per backend")
    args = ap.parse_args()
    medians = {}
    for backend in ("gloo_cpu", "local_cpu"):
        r = run_child(CHILD, str(ROOT), backend, str(args.syncs), what=f"the {backend} process")
        medians[backend] = statistics.median(r["seconds"])
        print(f"{backend:<10} median {medians[backend]:.3f} s per sync of {r['gb']:.2f} GB "
              f"({', '.join(f'{s:.3f}' for s in r['seconds'])}); engine vs policy after the last sync: "
              f"worst token {r['gap']:.1e} nats", flush=True)
    print(f"local_cpu is {medians['gloo_cpu'] / medians['local_cpu']:.1f}x faster per sync")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
