"""Conventions of metrics.jsonl that readers share (``llm.analysis.report``, the ablation, the benchmarks): no torch here.

Every key under ``time/`` or ``perf/`` (TRL's throughput names) is wall-clock (seconds, or a rate); every other key is
a function of the config and the seed (the same in two runs of one command on one machine, up to float rounding). ``time/<phase>`` for the phases
of ``PHASES`` are the seconds of the step's phases, which add up to the step.
"""

from __future__ import annotations

#: Timed phases of a step, in order; every metrics row carries ``time/<phase>`` for each (0 when skipped).
PHASES = ("sync", "generate", "score", "behaviour", "reference", "optimise", "diagnostics", "eval")
PHASE_KEYS = tuple(f"time/{p}" for p in PHASES)


def step_seconds(row: dict, exclude: tuple[str, ...] = ()) -> float:
    """Seconds of the step a metrics row describes: the sum of its phases (``exclude``: phases left out)."""
    return sum(row.get(f"time/{p}", 0.0) for p in PHASES if p not in exclude)


def deterministic(row: dict) -> dict:
    """The row without its wall-clock keys (``time/*``, ``perf/*``): what two runs of one command must log alike."""
    return {k: v for k, v in row.items() if not is_wall_clock(k)}


#: The prefixes of wall-clock keys (module docstring).
WALL_CLOCK = ("time/", "perf/")


def is_wall_clock(key: str) -> bool:
    """Whether a metrics key is wall-clock (``time/*``, ``perf/*``), not a function of the config and the seed."""
    return key.startswith(WALL_CLOCK)


#: The key of the last row a run writes when it stops on a reward outside its declared range (``llm.run.trainer``):
#: every certificate it logged was claimed under a declaration the data refuted, so none counts.
VOID_KEY = "bound/certificates_void"


def fold_void(rows: list[dict]) -> list[dict]:
    """A run's rows as readers take them: the step rows, each carrying ``VOID_KEY`` 1 where the run wrote a void
    marker (a row of ``VOID_KEY`` without a ``loss``), the marker itself dropped."""
    is_marker = lambda r: bool(r.get(VOID_KEY)) and "loss" not in r  # noqa: E731
    markers = [r for r in rows if is_marker(r)]
    kept = [r for r in rows if not is_marker(r)]
    if markers:
        kept = [{**r, VOID_KEY: 1.0, "bound/void_step": markers[0].get("step")} for r in kept]
    return kept


def certificate_shares(rows: list[dict], level: float = 0.95) -> dict[str, float]:
    """How the improvement certificate (``heldout/improvement_lcb``) went over the steps that logged it, one
    convention for every reader: ``certified``, the share with a positive bound (each step's own claim at the run's
    level); ``abstained``, the share where it abstained (nan: an unguaranteed bound below its fewest prompts, docs/
    theory.md §8.6), which counts as not certified; ``above_exact``, where the exact improvement is logged, the share
    whose bound exceeded it (an abstention never does); with the betting certificate's e-values
    (``heldout/improvement_e``, some finite), ``e_bh``, the share certified by e-BH over the run at ``level`` (the
    expected share of false certificates among them at most 1 - level), and ``spending``, the share certified by
    alpha-spending (no false certificate at all with probability >= level); ``steps``, how many steps logged it (0:
    every share nan); ``void``, 1 where the run stopped on a reward outside its declared range (``VOID_KEY``): then nothing is
    certified."""
    import math

    logged = [r for r in rows if "heldout/improvement_lcb" in r]
    n = len(logged)
    share = (lambda hits: sum(hits) / n) if n else (lambda hits: float("nan"))  # noqa: E731
    void = any(r.get(VOID_KEY) for r in rows)
    lcb = [float("nan") if void else r["heldout/improvement_lcb"] for r in logged]  # void: none counts
    out = {"steps": float(n), "certified": share([x > 0 for x in lcb]),
           "abstained": share([not math.isfinite(x) for x in lcb]), "void": float(void)}
    if logged and all("improvement" in r for r in logged):
        out["above_exact"] = share([x > r["improvement"] for x, r in zip(lcb, logged)])
    e = [r["heldout/improvement_e"] for r in logged if "heldout/improvement_e" in r]
    if logged and not void and len(e) == n and any(math.isfinite(x) for x in e):  # the betting certificate's e-values
        from grpo_theory.betting import alpha_spending, e_bh  # (all nan: every step abstained, nothing to combine)

        out["e_bh"] = share(e_bh(e, level).tolist())
        out["spending"] = share(alpha_spending(e, level).tolist())
    return out


# ---- model FLOPs utilisation (TRL's perf/mfu_fwd_bwd and perf/mfu_wall_clock) -------------------------------------

#: Dense peak bfloat16 FLOP/s of accelerators by name (vendors' data sheets; the more specific names first).
PEAK_BF16_FLOPS = (("H100 NVL", 835e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("H200 NVL", 835e12),
                   ("H200", 989e12), ("H20", 148e12), ("A100", 312e12), ("L40S", 362e12), ("L4", 121e12),
                   ("A10G", 125e12), ("A10", 125e12), ("B200", 2.25e15), ("GB200", 2.5e15), ("MI300X", 1.3e15))


def peak_flops(device_name: str, dtype: str) -> float | None:
    """The dense peak FLOP/s of a device by its name (``torch.cuda.get_device_name``) in ``dtype`` ('bfloat16'), None
    when unknown (a CPU, float32): then no MFU is logged, as TRL logs none."""
    import re

    if dtype != "bfloat16":
        return None
    for name, flops in PEAK_BF16_FLOPS:
        if re.search(rf"\b{re.escape(name.casefold())}\b", device_name.casefold()):
            return flops
    return None


def training_flops_per_token(config, seq_len: float) -> float:
    """FLOPs of one token's forward and backward pass (3 x forward) through a dense decoder described by ``config``
    (a transformers config) at sequence length ``seq_len``: the projections 2 h (n_q + 2 n_kv) d + 2 n_q d h, the
    attention scores 4 n_q d seq_len (every position over the whole length: PaLM's and TRL's convention), the MLP
    6 h i, per layer, and the output layer 2 h V."""
    h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    d = getattr(config, "head_dim", None) or h // heads
    attention = 2 * h * (heads + 2 * kv) * d + 2 * heads * d * h + 4 * heads * d * seq_len
    mlp = 6 * h * config.intermediate_size
    return 3.0 * (layers * (attention + mlp) + 2 * h * vocab)


def mfu(flops_per_token: float, tokens: float, seconds: float, peak: float, world: int = 1) -> float:
    """Model FLOPs utilisation in percent: the FLOPs of ``tokens`` forwarded and back-propagated in ``seconds`` over
    ``world`` devices of ``peak`` FLOP/s each."""
    return 100.0 * flops_per_token * tokens / max(seconds, 1e-12) / (peak * world)
