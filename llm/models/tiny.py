"""The built-in tiny model: a small Qwen2 with a character-level tokenizer, shipped with the package.

``tiny_model_dir()`` returns ``llm/models/builtin_model/``: the same weights on every host, checked against
``SHA256SUMS`` beside them at first use in a process. They were made once by ``python -m llm tiny`` (``llm.commands.tiny``,
the recipe): supervised warm-up on the arithmetic task's training prompts until sampled accuracy
(temperature 1) enters the band [WARMUP_TARGET, 0.6], saved as a normal model directory (config, safetensors,
tokenizer) that transformers and vLLM both load. Rebuilding gives a model of the same recipe but not the same bits
on another CPU (kernels differ in the last bits and the warm-up amplifies them), which is why the weights are
shipped rather than built at first use. Another spec is built with ``python -m llm tiny --out DIR``.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

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


def cache_root() -> Path:
    return Path(os.environ.get("OFFPOLICY_GRPO_CACHE", Path.home() / ".cache" / "offpolicy_grpo"))

#: The shipped built-in model (TinySpec() built by ``python -m llm tiny``) and the file of its checksums.
BUILTIN_DIR = Path(__file__).resolve().parent / "builtin_model"
#: The shipped built-in agent model: the built-in model warmed up further on tool-calling episodes of
#: ``--dataset arithmetic_tools`` (``python -m llm tiny --agent``), its tokenizer holding the tool-call template.
AGENT_DIR = Path(__file__).resolve().parent / "builtin_agent_model"
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
        raise RuntimeError(f"the built-in model is incomplete: {sums} is missing (restore llm/models/builtin_model/ from "
                           "the repository)")
    for line in sums.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        f = path / name
        if not f.is_file() or _sha256(f) != digest:
            raise RuntimeError(f"the built-in model's {name} does not match its checksum in {sums} (a changed or "
                               "missing file: restore llm/models/builtin_model/ from the repository, or rebuild it with "
                               "`python -m llm tiny --ship`)")


def tiny_model_dir() -> Path:
    """Path of the built-in tiny model: the shipped directory, its checksums verified once per process."""
    return _checked_builtin()


@functools.cache
def _checked_builtin() -> Path:
    """The shipped model's directory, its checksums verified (once per process)."""
    verify_checksums(BUILTIN_DIR)
    return BUILTIN_DIR


@functools.cache
def agent_model_dir() -> Path:
    """Path of the built-in agent model (the default model of ``--dataset arithmetic_tools``), checksums verified."""
    verify_checksums(AGENT_DIR)
    return AGENT_DIR

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
