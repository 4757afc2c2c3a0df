"""llm.models.vml: the warm-up covers every oneMKL VML function this torch build links, and each warmed operator is right.

The race it prevents (a low-accuracy kernel on one thread's chunk of a function's first multi-threaded call) is not
reproducible on demand: ``benchmarks/vml_first_call.py`` counts it over fresh processes, with and without the
warm-up."""

import mmap
import re
from pathlib import Path

import pytest
import torch

from llm.models.vml import VML_OPS, resolve_vml_dispatch

#: VML's function names (``vmsCos``) -> torch's operator where the two differ.
TORCH_NAME = {"Ln": "log", "ErfInv": "erfinv"}


def linked_vml_functions() -> set[str]:
    """torch operators whose VML function (``vms<Name>`` for float32) libtorch_cpu links."""
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    if not lib.is_file():
        pytest.skip(f"no {lib.name} here (not a Linux build of torch)")
    with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        names = set(re.findall(rb"\x00vms([A-Z][A-Za-z0-9]*)\x00", data))
    if not names:
        pytest.skip("this torch build does not link oneMKL's VML")
    return {TORCH_NAME.get(n.decode(), n.decode().lower()) for n in names}


def test_the_warm_up_covers_every_vml_function_torch_links():
    assert set(VML_OPS) == linked_vml_functions()


def reference(op: str, x):
    """``op`` in float64 from numpy or scipy (independent of torch and oneMKL)."""
    import numpy as np
    from scipy import special

    numpy_name = {"acos": "arccos", "asin": "arcsin", "atan": "arctan"}.get(op, op)
    return getattr(special, op)(x) if op.startswith("erf") else getattr(np, numpy_name)(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_each_warmed_operator_is_accurate_on_a_multithreaded_call(dtype):
    resolve_vml_dispatch()
    torch.manual_seed(0)
    # inside every operator's domain (acos, asin, erfinv: |x| < 1; log, sqrt: x > 0); 2**20 values: parallel chunks
    x = torch.rand(2**20, dtype=dtype) * 0.9 + 0.05
    xs = x.to(torch.float64).numpy()
    ulp = torch.finfo(dtype).eps
    for op in VML_OPS:
        got, want = getattr(torch, op)(x).to(torch.float64).numpy(), reference(op, xs)
        err = float((abs(got - want) / abs(want).clip(min=1.0)).max())
        assert err <= 4 * ulp, f"{op} ({dtype}): relative error {err:.1e} > 4 ulp"
