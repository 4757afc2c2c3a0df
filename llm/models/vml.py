"""oneMKL's vector math (VML) behind torch's float unary operators on a CPU, resolved before any parallel call.

torch sends contiguous float32 and float64 ``cos``, ``sin``, ``exp``, ``log``, ``sqrt``, ``tanh``, ``erf``, ... to
oneMKL's VML, each intra-op thread on its own chunk. oneMKL picks each function's kernel (instruction set and
accuracy) at that function's first call in the process, and when that first call runs on several threads at once one
of them can run a low-accuracy kernel over its whole chunk, for that call only (pytorch/pytorch#188792; the fix
proposed there, #188791, is the same one-element warm-up as here). Seen on this project's CPU (Intel Xeon with AMX,
torch 2.13): in 6 of 8 fresh processes whose first large float32 matmul preceded the model, SmolLM2-135M-Instruct's
first forward pass computed the rotary embedding's ``cos`` with errors up to 1.5e-4 on 3,246 of its 7,168 values
(float64 gives 3.6e-8) and its logits 1.1e-2 away from the second, identical pass; every later pass agreed to the
bit. In a trainer that is a wrong log-probability in whichever step first calls an operator; in vLLM, whose rotary
table is computed once at start-up, a sampler that is off for the whole run.

``resolve_vml_dispatch`` calls every VML function this torch build links once, on one element in one thread, so
every later call finds its kernel chosen. The trainer, ``python -m llm serve`` and every vLLM process (through the project's
vLLM plugin) call it before their first model.
"""

from __future__ import annotations

import functools

import torch

#: torch's operators that ATen sends to VML (the functions libtorch_cpu links as ``vms*``/``vmd*``: Acos, Asin,
#: Atan, Cos, Erf, Erfc, ErfInv, Exp, Ln, Log10, Log2, Sin, Sqrt, Tan, Tanh, Trunc; tests/llm/test_vml.py checks
#: the list against the library).
VML_OPS = ("acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "log", "log10", "log2", "sin", "sqrt",
           "tan", "tanh", "trunc")


@functools.cache
def resolve_vml_dispatch() -> None:
    """Call each of ``VML_OPS`` once per float dtype on a one-element tensor (below every parallel grain: one
    thread), so oneMKL chooses each kernel before any multi-threaded call. Idempotent; a few microseconds."""
    for dtype in (torch.float32, torch.float64):
        x = torch.full((1,), 0.5, dtype=dtype)
        for op in VML_OPS:
            getattr(torch, op)(x)
