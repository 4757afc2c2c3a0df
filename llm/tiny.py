"""The built-in tiny model: a small Qwen2 with a character-level tokenizer, shipped with the package.

``tiny_model_dir()`` returns ``llm/builtin_model/``: the same weights on every host, checked against
``SHA256SUMS`` beside them at first use in a process. They were made once by ``build_tiny_model`` (``python -m
llm.tiny --out DIR``): supervised warm-up on the arithmetic task's training prompts until sampled accuracy
(temperature 1) enters the band [WARMUP_TARGET, 0.6], saved as a normal model directory (config, safetensors,
tokenizer) that transformers and vLLM both load. Rebuilding gives a model of the same recipe but not the same bits
on another CPU (kernels differ in the last bits and the warm-up amplifies them), which is why the weights are
shipped rather than built at first use. A spec other than the default is built and cached as before.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .tasks import Task, arithmetic_task

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
#: Printable ASCII plus newline: enough for arithmetic and small GSM8K-style tests.
CHARS = [chr(i) for i in range(32, 127)] + ["\n"]
#: Warm-up stops once sampled accuracy reaches this (the start of RL must leave room to improve).
WARMUP_TARGET = 0.2
WARMUP_BAND = (0.1, 0.6)


@dataclass(frozen=True)
class TinySpec:
    hidden_size: int = 128
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 64
    warmup_batch: int = 64
    warmup_lr: float = 3e-3
    warmup_max_steps: int = 3000
    warmup_eval_every: int = 25
    seed: int = 0
    version: int = 2  # bump when the recipe changes (2: warm-up on the training split, token-level reward)


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for c in CHARS:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, unk_token=UNK,
                                   padding_side="left")


def build_model(spec: TinySpec, vocab_size: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=spec.hidden_size, num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads,
        intermediate_size=spec.intermediate_size, max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=1, pad_token_id=0, torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    return Qwen2ForCausalLM(config)


def _supervised_batch(tokenizer, task: Task, idx: np.ndarray):
    """Right-padded prompt+answer+EOS sequences with labels on the answer and EOS only."""
    ids, labels = [], []
    for i in idx:
        p = tokenizer(task.prompts[i]).input_ids
        a = tokenizer(task.answers[i]).input_ids + [tokenizer.eos_token_id]
        ids.append(p + a)
        labels.append([-100] * len(p) + a)
    n = max(map(len, ids))
    pad = tokenizer.pad_token_id
    x = torch.tensor([s + [pad] * (n - len(s)) for s in ids])
    y = torch.tensor([s + [-100] * (n - len(s)) for s in labels])
    return x, (x != pad).long(), y


@torch.no_grad()
def sampled_accuracy(model, tokenizer, task: Task, n: int, seed: int, max_new_tokens: int = 4) -> float:
    """Fraction of n training prompts answered exactly (the task's own reward), sampling at temperature 1."""
    from .sampling import TransformersSampler

    bound = task.bind(tokenizer)
    idx = task.sample(np.random.default_rng(seed), n).tolist()
    sampler = TransformersSampler(model, tokenizer.eos_token_id, tokenizer.pad_token_id, copy=False)
    roll = sampler.generate([bound.prompt_ids[i] for i in idx], 1, max_new_tokens, 1.0, seed)
    return float(bound.score(idx, [""] * n, roll.completion_ids).mean())


def warm_up(model, tokenizer, task: Task, spec: TinySpec, log=print) -> float:
    """Supervised training until sampled accuracy >= WARMUP_TARGET; returns that accuracy."""
    opt = torch.optim.AdamW(model.parameters(), lr=spec.warmup_lr)
    rng = np.random.default_rng(spec.seed)
    acc = 0.0
    for step in range(1, spec.warmup_max_steps + 1):
        model.train()
        x, m, y = _supervised_batch(tokenizer, task, task.sample(rng, spec.warmup_batch))
        loss = model(input_ids=x, attention_mask=m, labels=y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % spec.warmup_eval_every == 0:
            model.eval()
            acc = sampled_accuracy(model, tokenizer, task, 256, seed=spec.seed + step)
            log(f"  warm-up step {step}: loss {loss.item():.3f}, sampled accuracy {acc:.1%}")
            if acc >= WARMUP_TARGET:
                break
    model.eval()
    return acc


def cache_root() -> Path:
    return Path(os.environ.get("OFFPOLICY_GRPO_CACHE", Path.home() / ".cache" / "offpolicy_grpo"))


#: The shipped built-in model (TinySpec() built by ``build_tiny_model``) and the file of its checksums.
BUILTIN_DIR = Path(__file__).resolve().parent / "builtin_model"
CHECKSUMS = "SHA256SUMS"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_checksums(path: Path) -> None:
    """``SHA256SUMS`` in ``path``: one ``<sha256>  <file>`` line per file of the model directory."""
    files = sorted(f for f in path.iterdir() if f.is_file() and f.name != CHECKSUMS)
    (path / CHECKSUMS).write_text("".join(f"{_sha256(f)}  {f.name}\n" for f in files))


def verify_checksums(path: Path) -> None:
    """Raise RuntimeError, naming the file, unless every file listed in ``path/SHA256SUMS`` has its checksum."""
    sums = path / CHECKSUMS
    if not sums.is_file():
        raise RuntimeError(f"the built-in model is incomplete: {sums} is missing (restore llm/builtin_model/ from "
                           "the repository)")
    for line in sums.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        f = path / name
        if not f.is_file() or _sha256(f) != digest:
            raise RuntimeError(f"the built-in model's {name} does not match its checksum in {sums} (a changed or "
                               "missing file: restore llm/builtin_model/ from the repository, or rebuild it with "
                               "`python -m llm.tiny --ship`)")


def build_tiny_model(spec: TinySpec, dest: Path, log=print, replace: bool = True) -> Path:
    """Build, warm up and save the tiny model of ``spec`` into ``dest`` (about 15-60 s): a finished directory already
    there is replaced, or with ``replace`` False kept (another process built the same cached model first)."""
    torch.manual_seed(spec.seed)
    tokenizer = build_tokenizer()
    model = build_model(spec, len(tokenizer))
    n_params = sum(p.numel() for p in model.parameters())
    task = arithmetic_task()
    acc = warm_up(model, tokenizer, task, spec, log=log)
    if not WARMUP_BAND[0] <= acc <= WARMUP_BAND[1]:
        raise RuntimeError(f"tiny model warm-up ended at sampled accuracy {acc:.1%}, outside {WARMUP_BAND}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".building-"))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "warmup.json").write_text(json.dumps({"spec": asdict(spec), "sampled_accuracy": acc,
                                                  "parameters": n_params}, indent=1))
    for f in tmp.iterdir():
        f.chmod(0o644)
    log(f"tiny model: {n_params / 1e6:.2f}M parameters, sampled accuracy after warm-up {acc:.1%}")
    if not replace and (dest / "warmup.json").is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        return dest
    old = dest.with_name(dest.name + ".old")
    if dest.exists():
        dest.rename(old)
    tmp.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return dest


def tiny_model_dir(spec: TinySpec = TinySpec(), log=print) -> Path:
    """Path of the built-in tiny model: the shipped directory for the default spec (its checksums verified once per
    process), else a model of ``spec`` built on first use and cached."""
    if spec == TinySpec():
        return _checked_builtin()
    key = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:12]
    final = cache_root() / f"tiny-qwen2-arith-{key}"
    if (final / "warmup.json").is_file():
        return final
    log(f"building a tiny model of {spec} (cached afterwards in {final})")
    return build_tiny_model(spec, final, log=log, replace=False)


@functools.cache
def _checked_builtin() -> Path:
    """The shipped model's directory, its checksums verified (once per process)."""
    verify_checksums(BUILTIN_DIR)
    return BUILTIN_DIR


#: Tiny random models of the families users train with GRPO, for the sync tests: 2 layers, hidden 128, 2 heads of
#: 64 (a head size vLLM's CPU attention supports), the built-in character tokenizer. What each one exercises
#: (OLMo is left out: loading it in an in-process vLLM engine breaks transformers' own OlmoModel in the same
#: process, AttributeError 'do_not_compile' in the trainer's forward):
FAMILIES = {
    "llama": "separate q/k/v and gate/up in the checkpoint, fused by vLLM; untied output layer",
    "mistral": "Llama's layout under another name (sliding window off)",
    "qwen3": "per-head q/k RMS norms",
    "gemma2": "tied embeddings, logit soft-capping, pre- and post-norms, scaled embeddings",
    "gemma3": "Gemma 2's layout with q/k norms (text-only model)",
    "phi3": "q/k/v and gate/up already fused in the checkpoint",
    "granite": "Llama layout with embedding, residual, attention and logit multipliers",
}


def build_family_model(family: str, path: Path, seed: int = 0) -> Path:
    """Save a tiny random model of ``family`` (a key of FAMILIES) with the built-in tokenizer to ``path``."""
    import transformers as tf

    tok = build_tokenizer()
    common = dict(vocab_size=len(tok), hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, intermediate_size=256, max_position_embeddings=64, bos_token_id=None,
                  eos_token_id=1, pad_token_id=0)
    configs = {
        "llama": lambda: (tf.LlamaConfig(**common, tie_word_embeddings=False), tf.LlamaForCausalLM),
        "mistral": lambda: (tf.MistralConfig(**common, sliding_window=None), tf.MistralForCausalLM),
        "qwen3": lambda: (tf.Qwen3Config(**common, head_dim=64, tie_word_embeddings=True), tf.Qwen3ForCausalLM),
        "gemma2": lambda: (tf.Gemma2Config(**common, head_dim=64, query_pre_attn_scalar=64, sliding_window=64,
                                           attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
                           tf.Gemma2ForCausalLM),
        "gemma3": lambda: (tf.Gemma3TextConfig(**common, head_dim=64, query_pre_attn_scalar=64, sliding_window=64),
                           tf.Gemma3ForCausalLM),
        "phi3": lambda: (tf.Phi3Config(**common, tie_word_embeddings=False), tf.Phi3ForCausalLM),
        "granite": lambda: (tf.GraniteConfig(**common, embedding_multiplier=2.0, residual_multiplier=0.5,
                                             attention_multiplier=0.125, logits_scaling=2.0), tf.GraniteForCausalLM),
    }
    if family not in configs:
        raise ValueError(f"family: expected one of {', '.join(configs)}, got {family!r}")
    config, cls = configs[family]()
    torch.manual_seed(seed)
    model = cls(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@dataclass
class BuildArgs:
    """Build the default tiny model (TinySpec()) with its checksums. The shipped one in llm/builtin_model/ was made
    this way; rebuilding it on another CPU gives other bits, so after --ship re-measure every margin the tests and
    docs rest on."""

    out: Path | None = None
    """A directory for the new model (replaced if it exists)."""
    ship: bool = False
    """Rebuild llm/builtin_model/ itself instead."""

    def __post_init__(self):
        from runkit.validation import require

        require(self, (self.out is None) == self.ship, "out", "give exactly one of --out DIR and --ship")


PROG = "python -m llm.tiny"


def main(argv: list[str] | None = None) -> int:
    from runkit.cli import parse

    args = parse(BuildArgs, argv, prog=PROG, description=BuildArgs.__doc__)
    dest = BUILTIN_DIR if args.ship else args.out.resolve()
    build_tiny_model(TinySpec(), dest)
    write_checksums(dest)
    print(dest)
    return 0


if __name__ == "__main__":
    from runkit.cli import run_main

    run_main(main, prog=PROG)
