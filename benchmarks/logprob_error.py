"""Float32 error of the trainer's chunked log-probs against float64: ``python benchmarks/logprob_error.py``.

The built-in tiny model, 12 sequences (``tests.helpers.sequences``), the output layer in chunks of 3 tokens at
temperature 0.7, forward and backward: the largest |log-prob - float64's| in nats and the worst parameter's gradient
relative error (||g - g64|| / ||g64||), for float32 on CUDA (TF32 off; where a GPU is present) and on the CPU,
against float64 on the CPU. tests/gpu's CUDA_LOGP_ERROR_FACTOR bounds the first by a multiple of the second.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from llm.batch import make_batch  # noqa: E402
from llm.logprobs import forward_completions  # noqa: E402
from llm.model import load_policy  # noqa: E402
from llm.tiny import tiny_model_dir  # noqa: E402
from tests.helpers import sequences  # noqa: E402


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    runs = [("cpu32", "cpu", torch.float32), ("cpu64", "cpu", torch.float64)]
    if torch.cuda.is_available():
        runs.insert(0, ("cuda32", "cuda", torch.float32))
    res = {}
    for name, device, dtype in runs:
        model, tok = load_policy(str(tiny_model_dir()), torch.device(device))
        model.to(dtype)
        prompts, comps = sequences(tok, 12)
        out = forward_completions(model, make_batch(prompts, comps, tok.pad_token_id, device), 0.7, chunk_tokens=3)
        model.zero_grad(set_to_none=True)
        out.logp.sum().backward()
        res[name] = (out.logp.detach().cpu().double(), [p.grad.cpu().double() for p in model.parameters()])
    want, ref = res.pop("cpu64")
    for name, (logp, grads) in res.items():
        err = float((logp - want).abs().max())
        grad = max(float((g - r).norm() / r.norm()) for g, r in zip(grads, ref, strict=True))
        print(f"{name}: max |logp - float64| {err:.3g} nats, worst gradient relative error {grad:.3g}")


if __name__ == "__main__":
    main()
