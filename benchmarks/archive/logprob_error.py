"""Float32 error of the trainer's chunked log-probs against float64: ``python benchmarks/archive/logprob_error.py``.

The built-in tiny model, 12 sequences (``tests.helpers.sequences``), the output layer in chunks of 3 tokens at
temperature 0.7, forward and backward: the largest |log-prob - float64's| in nats and the worst parameter's gradient
relative error (||g - g64|| / ||g64||), for float32 on CUDA (TF32 off; where a GPU is present) and on the CPU,
against float64 on the CPU. tests/gpu's CUDA_LOGP_ERROR_FACTOR bounds the first by a multiple of the second.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from fixtures.logprobs import chunked_logprobs_and_gradients  # noqa: E402


def main() -> None:
    runs = [("cuda32", "cuda", torch.float32)] if torch.cuda.is_available() else []
    runs.append(("cpu32", "cpu", torch.float32))
    want, ref = chunked_logprobs_and_gradients("cpu", torch.float64)
    for name, device, dtype in runs:
        logp, grads = chunked_logprobs_and_gradients(device, dtype)
        err = float((logp - want).abs().max())
        grad = max(float((g - r).norm() / r.norm()) for g, r in zip(grads, ref, strict=True))
        print(f"{name}: max |logp - float64| {err:.3g} nats, worst gradient relative error {grad:.3g}")


if __name__ == "__main__":
    main()
