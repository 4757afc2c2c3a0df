"""Memory benchmark: ``make benchmark-memory`` (``.venv/bin/python benchmarks/memory.py``).

Part 1, what a user runs: peak resident memory of ``python -m llm train`` (1 step, transformers sampler, float32)
on a Qwen2-shaped model with Qwen2.5's 151,936-token vocabulary and hidden size 64 (weights ~10M parameters, so
the activations and logits dominate), against prompts per step, completion length and micro-batch size
(``--per-device-train-batch-size``). Each run is its own process; its peak is the kernel's VmHWM.

Part 2, a projection for the README's GSM8K command on Qwen2.5-0.5B: models of Qwen2.5-0.5B's exact layer shape
(hidden 896, MLP 4864, 14 heads, 2 KV heads, 151,936 vocabulary) with 1 and 3 decoder layers run one
forward-and-backward micro-batch of the trainer (``llm.tensors.logprobs.forward_completions``) on 1 and 8 sequences of
the GSM8K length (150 prompt + 512 completion tokens); the rise of the peak above the resident memory before the
pass gives measured constants: bytes per sequence per layer (``a``), per sequence outside the layers (``b``) and
the output layer's chunks and the embedding's gradient (``c``, bounded by the chunk size). With gradient
checkpointing each layer keeps one hidden state per token instead (computed, and printed beside the measured
checkpointed passes). The projection is

    peak ~= 24 bytes x parameters (float32 policy, gradient, two AdamW moments, alpha's and pi_ref's copies)
            + micro-batch x (layers x a + b) + c       (checkpointing: layers x hidden state + a instead of layers x a)
            + the hidden states kept for the token-level TV diagnostics (completions x T x hidden x 4 bytes x 3)

for the trainer alone (an in-process vLLM engine takes what ``--gpu-memory-utilization`` gives it on top;
a server in its own process takes none of the trainer's memory). Measured in float32 on CPU; bf16 autocast
keeps float32 master weights, so the static part is unchanged and activations shrink (an upper bound).

Part 3 (``--fsdp-ranks``), what ``--fsdp`` saves: the peak resident memory of each of 2 torchrun ranks running
``llm.train`` (2 steps, transformers sampler, beta 0.04), data parallel against ``--fsdp``, on a model of
Qwen2.5-0.5B's layer shape with ``FSDP_LAYERS`` layers and the built-in 99-token vocabulary (so the blocks are
nearly all of it), beside what each rank's tensors need: 24 bytes per parameter it holds (the policy, its
gradient, two AdamW moments, alpha's and pi_ref's copies; the blocks' share 1/2 under FSDP), plus on rank 0 the
sampler's own copy (4 bytes per parameter) and under FSDP the whole copy for syncs (4 more) and the checkpoint,
gathered whole on rank 0 (20 bytes per parameter while it is written).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("OFFPOLICY_GRPO_CODE", str(ROOT)))  # children: the checkout under test

VOCAB = 151_936
#: The model of part 1 (Qwen2 layout, Qwen2.5's vocabulary, hidden 64).
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128)
#: Qwen2.5-0.5B's published configuration (config.json of Qwen/Qwen2.5-0.5B-Instruct).
QWEN05 = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
              intermediate_size=4864, parameters=494_032_768)
#: The README's GSM8K command: 8 prompts x G = 16, completions up to 512 tokens; GSM8K prompts ~ 150 tokens.
GSM8K = dict(completions=128, completion_tokens=512, prompt_tokens=150)
#: Bytes per parameter that the trainer keeps: float32 policy, its gradient, AdamW's two moments, and the float32
#: copies of alpha's and pi_ref's weights (beta > 0).
STATIC_BYTES_PER_PARAM = 4 + 4 + 8 + 4 + 4
#: Micro-batch sizes of part 2 (the constant part, ~1.5 GB of embedding-gradient and logit-chunk temporaries, varies
#: by ~100 MB from run to run: the range must make the per-sequence part stand out).
SEQS = (1, 8)
#: Decoder layers of part 2's models (the difference gives the per-layer constant).
LAYERS = (1, 3)
#: Decoder layers of part 3's model (Qwen2.5-0.5B's layer shape, the built-in vocabulary): ~119M parameters.
FSDP_LAYERS = 8


def peak_mb() -> float:
    """This process's peak resident memory (VmHWM) in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def reset_peak() -> None:
    """Reset VmHWM to the current resident memory (Linux: write 5 to clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def build_model(path: Path, layers: int | None = None, shape: dict = SMALL, max_positions: int = 1024,
                vocab: int = VOCAB) -> Path:
    """A random Qwen2 of ``shape`` with the 151,936-token vocabulary (or ``vocab`` tokens: 0, the built-in
    tokenizer's) and the built-in character tokenizer."""
    if (path / "config.json").is_file():
        return path
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from llm.models.tiny import build_tokenizer

    tok = build_tokenizer()
    dims = {k: v for k, v in shape.items() if k != "parameters"}
    if layers is not None:
        dims["num_hidden_layers"] = layers
    config = Qwen2Config(vocab_size=vocab or len(tok), max_position_embeddings=max_positions, tie_word_embeddings=True,
                         bos_token_id=None, eos_token_id=1, pad_token_id=0, **dims)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


#: Part 1's runs: (prompts per step, completion tokens, per_device_train_batch_size (0: the whole step), TV).
GRIDS = {
    "main": [(8, 32, 16, False), (32, 32, 16, False), (64, 32, 16, False),  # flat in prompts at a fixed micro-batch
             (8, 32, 0, False), (32, 32, 0, False),                          # the whole step in one pass
             (8, 128, 16, False), (16, 32, 4, False), (16, 32, 64, False),   # completion length; micro-batch size
             (32, 32, 16, True)],                                            # token-level TV diagnostics on
    "issue": [(8, 7, 0, False), (32, 7, 0, False), (64, 7, 0, False)],      # 7-token completions, no micro-batches
    "prompts": [(8, 32, 16, False), (64, 32, 16, False)],                  # the peak's growth with the batch alone
}

# ---- part 1: llm.train ---------------------------------------------------------------------------------------


def child_train(settings: dict) -> None:
    """Run llm.train in this process with ``settings`` and print its peak memory as JSON."""
    from llm import GRPOConfig, train
    from llm.config import flat_fields

    fields = {name for _, name, _ in flat_fields()}
    t0 = time.perf_counter()
    train(GRPOConfig(**{k: v for k, v in settings.items() if k in fields}), log=lambda *a: None)
    print(json.dumps({"peak_mb": peak_mb(), "seconds": time.perf_counter() - t0}))


def run_train(model: Path, out: Path, code: Path, prompts: int, tokens: int, micro: int, tv: bool, steps: int = 1,
              sampler: str = "transformers", extra: dict | None = None) -> dict:
    settings = dict(model_name_or_path=str(model), sampler=sampler, max_steps=steps, prompts_per_step=prompts,
                    num_generations=8, max_completion_length=tokens, per_device_train_batch_size=micro,
                    tv_diagnostics=tv, exact_j=False, progress=False, save_steps=0, beta=0.04,
                    output_dir=str(out / f"p{prompts}_t{tokens}_m{micro}_tv{int(tv)}_{sampler}"), **(extra or {}))
    shutil.rmtree(settings["output_dir"], ignore_errors=True)  # a finished run there would only be summarised
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-train", json.dumps(settings)]
    proc = subprocess.run(cmd, cwd=code, capture_output=True, text=True,
                          env={**os.environ, "OFFPOLICY_GRPO_CODE": str(code)})
    if proc.returncode != 0:
        raise RuntimeError(f"llm.train failed ({settings}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- part 2: measured constants at Qwen2.5-0.5B's width ------------------------------------------------------


def layer_constants(workdir: Path, log=print) -> dict:
    """Peak rise of one forward-and-backward micro-batch of 1 and 8 sequences of the GSM8K length at Qwen2.5-0.5B's
    width, for 1 and 3 decoder layers, with and without gradient checkpointing. Fitted per configuration:
    rise = sequences x (layers x a + b) + c, with a the bytes per sequence per layer, b per sequence outside the
    layers (embeddings, hidden states) and c the output layer's chunks (bounded by the chunk, not the batch)."""
    import torch

    from llm.tensors.batch import make_batch
    from llm.tensors.logprobs import forward_completions
    from llm.models.model import load_policy

    torch.manual_seed(0)
    rise = {}
    length, prompt = GSM8K["prompt_tokens"] + GSM8K["completion_tokens"], GSM8K["prompt_tokens"]
    for layers in LAYERS:
        model, _ = load_policy(str(build_model(workdir / f"qwen05_l{layers}", layers, QWEN05)), torch.device("cpu"))
        model.train()
        for ckpt in (False, True):
            if ckpt:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            for seqs in SEQS:
                g = torch.Generator().manual_seed(seqs)
                batch = make_batch(torch.randint(3, 99, (seqs, prompt), generator=g).tolist(),
                                   torch.randint(3, 99, (seqs, length - prompt), generator=g).tolist(), 0, "cpu")
                if seqs == SEQS[0]:  # warm-up: gradients allocated before the measurements (the static part)
                    forward_completions(model, batch, 1.0).logp.sum().backward()
                model.zero_grad(set_to_none=False)
                before = rss_mb()
                reset_peak()
                forward_completions(model, batch, 1.0).logp.sum().backward()
                rise[(layers, ckpt, seqs)] = (peak_mb() - before) * 2**20
                log(f"  {layers} layer(s), gradient checkpointing {'on' if ckpt else 'off'}, {seqs} x {length} tokens: "
                    f"peak rise {rise[(layers, ckpt, seqs)] / 2**20:.0f} MB", flush=True)
        del model
    per_seq = {layers: (rise[(layers, False, SEQS[1])] - rise[(layers, False, SEQS[0])]) / (SEQS[1] - SEQS[0])
               for layers in LAYERS}
    lo, hi = LAYERS
    a = (per_seq[hi] - per_seq[lo]) / (hi - lo)
    b = per_seq[lo] - lo * a
    out = {"a": a, "b": b, "c": rise[(lo, False, SEQS[0])] - SEQS[0] * (lo * a + b), "rise": rise}
    for layers in LAYERS:  # the projection's formula against the measured checkpointed passes
        for seqs in SEQS:
            measured = rise[(layers, True, seqs)] / 2**20
            log(f"  checkpointed, {layers} layer(s), {seqs} sequence(s): measured {measured:.0f} MB, formula "
                f"{activation_bytes(out, seqs, layers, True) / 2**20:.0f} MB")
    return out


def hidden_state_bytes() -> int:
    """One float32 hidden state per token of a GSM8K-length sequence: what checkpointing keeps per layer."""
    return (GSM8K["prompt_tokens"] + GSM8K["completion_tokens"]) * QWEN05["hidden_size"] * 4


def activation_bytes(c: dict, micro: int, layers: int, ckpt: bool) -> float:
    """micro x (layers x a + b) + c; with gradient checkpointing each layer keeps one hidden state per token and
    one layer's activations exist at a time: micro x (layers x hidden + a + b) + c."""
    if ckpt:
        return micro * (layers * hidden_state_bytes() + c["a"] + c["b"]) + c["c"]
    return micro * (layers * c["a"] + c["b"]) + c["c"]


def projection(constants: dict, micro: int, tv: bool, ckpt: bool) -> dict:
    static = STATIC_BYTES_PER_PARAM * QWEN05["parameters"]
    act = activation_bytes(constants, micro, QWEN05["num_hidden_layers"], ckpt)
    kept = (GSM8K["completions"] * GSM8K["completion_tokens"] * QWEN05["hidden_size"] * 4 * 3) if tv else 0
    return {"static_gb": static / 1e9, "activations_gb": act / 1e9, "tv_hidden_gb": kept / 1e9,
            "total_gb": (static + act + kept) / 1e9}


# ---- part 3: data parallel against --fsdp, per rank ------------------------------------------------------------


def child_rank(settings: dict, out: Path) -> None:
    """Run by torchrun: llm.train on this rank, then this rank's peak memory and time in out/rank<RANK>.json."""
    from llm import GRPOConfig, train

    t0 = time.perf_counter()
    train(GRPOConfig(**settings), log=lambda *a: None)
    rank = int(os.environ["RANK"])
    (out / f"rank{rank}.json").write_text(json.dumps({"peak_mb": peak_mb(), "seconds": time.perf_counter() - t0}))


def parameter_split(model: Path) -> tuple[int, int]:
    """(parameters in the transformer blocks, parameters outside them) of ``model``."""
    from llm.models.distributed import transformer_blocks
    from llm.models.model import load_policy

    import torch

    policy, _ = load_policy(str(model), torch.device("cpu"))
    blocks = sum(p.numel() for p in transformer_blocks(policy).parameters())
    return blocks, sum(p.numel() for p in policy.parameters()) - blocks


def run_ranks(model: Path, out: Path, code: Path, fsdp: bool) -> list[dict]:
    """Both ranks' peaks of a 2-rank torchrun of llm.train (data parallel or --fsdp)."""
    settings = dict(model_name_or_path=str(model), sampler="transformers", max_steps=2, prompts_per_step=4,
                    num_generations=4, max_completion_length=8, exact_j=False, progress=False, save_steps=0,
                    beta=0.04, num_threads=1, fsdp=fsdp, output_dir=str(out / ("fsdp" if fsdp else "data_parallel")),
                    mask_zero_std_groups=False)  # the random model's rewards are all 0: still take AdamW steps
    shutil.rmtree(settings["output_dir"], ignore_errors=True)
    marks = out / ("marks_fsdp" if fsdp else "marks_dp")
    shutil.rmtree(marks, ignore_errors=True)
    marks.mkdir(parents=True)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", str(Path(__file__).resolve()), "--child-rank",
           json.dumps(settings), "--marks", str(marks)]
    proc = subprocess.run(cmd, cwd=code, capture_output=True, text=True,
                          env={**os.environ, "OFFPOLICY_GRPO_CODE": str(code), "OMP_NUM_THREADS": "1",
                               # large blocks mmap'd and returned on free: the peak counts live memory, not what
                               # glibc's heap kept after the whole copies made before sharding were freed
                               "MALLOC_MMAP_THRESHOLD_": "131072"})
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun llm.train failed (fsdp={fsdp}):\n{proc.stderr[-2000:]}")
    shutil.rmtree(settings["output_dir"], ignore_errors=True)  # the checkpoint: gigabytes
    return [json.loads((marks / f"rank{r}.json").read_text()) for r in range(2)]


def fsdp_ranks(workdir: Path, code: Path) -> None:
    model = build_model(workdir / f"qwen05_l{FSDP_LAYERS}_vocab99", FSDP_LAYERS, QWEN05, vocab=0)
    blocks, whole = parameter_split(model)
    print(f"part 3: per-rank peak memory of torchrun --nproc-per-node 2 -m llm train (2 steps, 4 prompts x G = 4, "
          f"beta 0.04, float32, transformers sampler) on Qwen2.5-0.5B's layer shape with {FSDP_LAYERS} layers and "
          f"the built-in vocabulary: {blocks / 1e6:.1f}M parameters in the blocks, {whole / 1e6:.2f}M outside\n")
    print("| mode | rank | peak GB | tensors GB (24 B/param held + rank 0's copies) | whole checkpoint on rank 0 GB |"
          " s |")
    print("|:--|---:|---:|---:|---:|---:|")
    gb, fp32 = 1e9, 4
    checkpoint = STATIC_BYTES_PER_PARAM - fp32  # policy, moments, alpha, pi_ref: all but the gradient
    for fsdp in (False, True):
        held = whole + (blocks / 2 if fsdp else blocks)
        for rank, r in enumerate(run_ranks(model, workdir / "fsdp_runs", code, fsdp)):
            copies = (2 if fsdp else 1) if rank == 0 else 0  # the sampler's own copy; under FSDP the whole CPU copy
            tensors = STATIC_BYTES_PER_PARAM * held + fp32 * (blocks + whole) * copies
            ckpt = checkpoint * (blocks + whole) / gb if rank == 0 and fsdp else 0
            print(f"| {'--fsdp' if fsdp else 'data parallel'} | {rank} | {r['peak_mb'] * 2**20 / gb:.2f} | "
                  f"{tensors / gb:.2f} | {ckpt:.2f} | {r['seconds']:.0f} |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "offpolicy_grpo_memory")
    ap.add_argument("--code", type=Path, default=ROOT,
                    help="measure llm.train from this checkout (e.g. a worktree of an earlier commit); part 1 only")
    ap.add_argument("--grid", choices=sorted(GRIDS), default="main",
                    help="part 1's runs: main, or issue (the settings the issue measured, for --code of an earlier "
                         "commit)")
    ap.add_argument("--steps", type=int, default=1, help="part 1's steps per run")
    ap.add_argument("--sampler", default="transformers", choices=["transformers", "vllm"], help="part 1's sampler")
    ap.add_argument("--no-keep-freed-memory", action="store_true", help="part 1 with --no-keep-freed-memory")
    ap.add_argument("--freed-memory-ceiling", type=float, default=None,
                    help="part 1 with this --freed-memory-ceiling (default: llm.train's)")
    ap.add_argument("--skip-train", action="store_true", help="only part 2 (the projection)")
    ap.add_argument("--skip-projection", action="store_true", help="only part 1 (llm.train)")
    ap.add_argument("--fsdp-ranks", action="store_true",
                    help="only part 3: 2 torchrun ranks, data parallel against --fsdp")
    ap.add_argument("--child-train", help=argparse.SUPPRESS)
    ap.add_argument("--child-rank", help=argparse.SUPPRESS)
    ap.add_argument("--marks", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_train:
        child_train(json.loads(args.child_train))
        return 0
    if args.child_rank:
        child_rank(json.loads(args.child_rank), args.marks)
        return 0
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.fsdp_ranks:
        fsdp_ranks(args.workdir, args.code)
        return 0
    if not args.skip_train:
        if args.sampler == "vllm":  # vLLM's CPU attention takes head sizes from 32: one head of 64 (one KV head)
            model = build_model(args.workdir / "qwen2_vocab152k_h64_1head",
                                shape={**SMALL, "num_attention_heads": 1, "num_key_value_heads": 1})
        else:
            model = build_model(args.workdir / "qwen2_vocab152k_h64")
        extra = {"keep_freed_memory": False} if args.no_keep_freed_memory else {}
        flags = ", --no-keep-freed-memory" if extra else ""
        if args.freed_memory_ceiling is not None:
            extra["freed_memory_ceiling"] = args.freed_memory_ceiling
            flags += f", --freed-memory-ceiling {args.freed_memory_ceiling:g}"
        print(f"part 1: peak memory of python -m llm train ({args.steps} step(s), G = 8, float32, beta 0.04, "
              f"{args.sampler} sampler{flags})\n"
              f"on a Qwen2 with {VOCAB:,} tokens and hidden 64; code from {args.code}\n")
        print("| prompts/step | completion tokens | per_device_train_batch_size | TV diagnostics | peak GB | s |")
        print("|---:|---:|---:|:--:|---:|---:|")
        for p, t, m, tv in GRIDS[args.grid]:
            r = run_train(model, args.workdir / "runs", args.code, p, t, m, tv, args.steps, args.sampler, extra)
            print(f"| {p} | {t} | {m or 'all (' + str(p * 8) + ')'} | {'on' if tv else 'off'} | "
                  f"{r['peak_mb'] / 1024:.2f} | {r['seconds']:.0f} |", flush=True)
    if not args.skip_projection:
        print("\npart 2: one micro-batch's forward and backward at Qwen2.5-0.5B's layer width (float32)")
        constants = layer_constants(args.workdir)
        c = constants
        print(f"  fitted without checkpointing: a = {c['a'] / 2**20:.0f} MB per sequence per layer, "
              f"b = {c['b'] / 2**20:.0f} MB per sequence, c = {c['c'] / 2**20:.0f} MB (output-layer chunks, embedding "
              f"gradient); checkpointing keeps {hidden_state_bytes() / 2**20:.1f} MB per sequence per layer")
        seq = GSM8K["prompt_tokens"] + GSM8K["completion_tokens"]
        n_params = QWEN05["parameters"] / 1e6
        print(f"\nprojection, the README's GSM8K command on Qwen2.5-0.5B ({n_params:.0f}M parameters, "
              f"{GSM8K['completions']} completions x {GSM8K['completion_tokens']} tokens, sequences ~{seq} tokens), "
              "trainer only:\n")
        print("| per_device_train_batch_size | gradient checkpointing | TV diagnostics | static GB | activations GB "
              "| kept hidden GB | total GB |")
        print("|---:|:--:|:--:|---:|---:|---:|---:|")
        for m, ckpt, tv in ((128, False, False), (16, False, False), (4, False, False), (128, True, False),
                            (16, True, False), (8, True, True)):
            p = projection(constants, m, tv, ckpt)
            print(f"| {m} | {'on' if ckpt else 'off'} | {'on' if tv else 'off'} | {p['static_gb']:.1f} | "
                  f"{p['activations_gb']:.1f} | {p['tv_hidden_gb']:.2f} | {p['total_gb']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
