"""Models on the trainer side: device and path resolution, loading, frozen copies, mixed precision.

The policy always keeps float32 master weights; ``Precision`` says in which dtype its matmuls run.
alpha's and pi_ref's weights on the trainer side are frozen copies of the policy (``frozen_copy``),
refreshed with ``copy_weights``.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from pathlib import Path

import torch

from runkit.cli import first_line


def resolve_device(device: str) -> torch.device:
    """'auto' -> cuda if available, else cpu; a requested CUDA device must exist."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but CUDA is not available")
    return torch.device(device)


def _why(exc: BaseException) -> str:
    """transformers' loading error in one line, with our flag's name where it asks for remote code."""
    text = str(exc)
    if "custom code" in text or "trust_remote_code" in text:
        return "it ships its own Python code, which runs only with --trust-remote-code"
    return first_line(exc)


def check_model_path(path: str, field: str = "model_name_or_path") -> None:
    """A path that names a local file system location (starts with '.', '/' or '~', or exists) must be a directory;
    anything else is taken as a hub name."""
    local = Path(path).expanduser()
    if (path.startswith((".", "/", "~")) or local.exists()) and not local.is_dir():
        raise ValueError(f"{field}: no model directory at {path!r}")


@contextlib.contextmanager
def quiet_transformers():
    """transformers without its progress bars and warnings for the duration (loading and saving a model draws a bar
    per call, which the trainer's own progress output does not need); restored afterwards."""
    from transformers.utils import logging as hf_logging

    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def load_tokenizer(path: str, trust_remote_code: bool = False):
    """``path``'s tokenizer, as ``load_policy`` loads it (``saved_tokenizer_class``)."""
    from transformers import AutoTokenizer

    return saved_tokenizer_class(path, AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code))


def saved_tokenizer_class(path: str, tokenizer):
    """The tokenizer as saved: transformers 5 loads a directory whose tokenizer_config.json names its generic
    ``TokenizersBackend`` (a tokenizer.json alone, as the built-in models' character tokenizer) with the class of
    config.json's model type instead (Qwen2's byte-level pre-tokenizer for the built-in models), which drops
    every space and newline of the character vocabulary; reload it with the generic class."""
    import json
    from pathlib import Path

    from transformers import PreTrainedTokenizerFast

    config = Path(path) / "tokenizer_config.json"
    if not config.is_file():
        return tokenizer
    saved = json.loads(config.read_text()).get("tokenizer_class")
    if saved in ("TokenizersBackend", "PreTrainedTokenizerFast") and type(tokenizer).__name__ != saved:
        return PreTrainedTokenizerFast.from_pretrained(path)
    return tokenizer


def load_policy(path: str, device: torch.device, trust_remote_code: bool = False, attn_implementation: str = "auto"):
    """The policy with float32 master weights and its tokenizer (a pad token is added if missing).

    ``path``: a local directory, or a hub name (``owner/name``) when no such directory exists. Code shipped with
    the model runs only with ``trust_remote_code``. ``attn_implementation``: transformers' attention kernel
    ("auto": transformers' own choice)."""
    from transformers import AutoModelForCausalLM

    check_model_path(path)
    try:
        tokenizer = load_tokenizer(path, trust_remote_code)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"model_name_or_path: cannot load a tokenizer from {path!r} ({_why(exc)})") from None
    if len(tokenizer) < 2 or not tokenizer("a 1").input_ids:  # transformers builds an empty one from no files
        raise ValueError(f"model_name_or_path: {path!r} holds no tokenizer (tokenizer.json, vocab or merges files)")
    try:
        attn = {} if attn_implementation == "auto" else {"attn_implementation": attn_implementation}
        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                         trust_remote_code=trust_remote_code, **attn)
    except ImportError as exc:  # e.g. flash_attention_2 without the flash-attn package
        raise ValueError(f"attn_implementation: {attn_implementation} cannot be used here ({_why(exc)})") from None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"model_name_or_path: cannot load a causal language model from {path!r} "
                         f"({_why(exc)})") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.vocab_size < len(tokenizer):
        raise ValueError("model_name_or_path: tokenizer is larger than the model's vocabulary")
    disable_dropout(model)
    return model.to(device), tokenizer


def disable_dropout(model: torch.nn.Module) -> int:
    """Every dropout of the model off (TRL's disable_dropout, always on here): the importance weight compares
    log-probs of different passes, which must be those of one distribution, not of random masks. Zeroes each
    ``nn.Dropout``'s p and each module's float ``attention_dropout`` (transformers' attention reads it); returns how
    many it changed."""
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout) and module.p:
            module.p, changed = 0.0, changed + 1
        if isinstance(getattr(module, "attention_dropout", None), float) and module.attention_dropout:
            module.attention_dropout, changed = 0.0, changed + 1
    if getattr(model.config, "attention_dropout", 0.0):
        model.config.attention_dropout = 0.0
    return changed


def architecture(model: torch.nn.Module) -> str:
    """The model's architecture name(s) as its config gives them (``LlamaForCausalLM``), for one-line errors."""
    config = getattr(model, "config", None)
    return ",".join(getattr(config, "architectures", None) or [type(model).__name__])


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` in eval mode with gradients off (alpha's or pi_ref's weights); of a LoRA policy, the
    plain model with the adapters merged into its weights."""
    m = copy.deepcopy(model)
    if is_lora(m):
        m = m.merge_and_unload()
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


@torch.no_grad()
def copy_weights(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """dst <- src, parameter by parameter (the same architecture; a LoRA ``src`` gives its merged weights)."""
    source = plain_state_dict(src)
    for name, p in dst.named_parameters():
        p.copy_(source[name].detach())


def is_lora(model: torch.nn.Module) -> bool:
    """True for a ``peft`` model (the policy under ``--use-peft``)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


@torch.no_grad()
def plain_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under the plain model's names, as a sampler, alpha and pi_ref take them: the state dict
    of a plain model; of a LoRA model, every base weight with its adapter's update W + (lora_alpha / r) B A added
    (peft's ``get_delta_weight``), the adapters themselves left out. The policy is not modified."""
    if not is_lora(model):
        return model.state_dict()
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {f"{name}.weight": sum(m.get_delta_weight(a) for a in m.active_adapters)
              for name, m in base.named_modules() if isinstance(m, LoraLayer) and m.active_adapters}
    out = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        out[key] = value + deltas[key].to(value.dtype) if key in deltas else value
    return out


def add_lora(model: torch.nn.Module, r: int, lora_alpha: float, target_modules: tuple[str, ...]) -> torch.nn.Module:
    """The model with LoRA adapters (``peft``) on ``target_modules`` ('all-linear': every linear layer but the
    output layer), B = 0 so the policy starts as the model; only the adapters train. Dropout is 0: the importance
    weight pi/alpha needs the same log-probs from every pass."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ValueError("use_peft: LoRA needs the peft package (pip install -e '.[lora]')") from None
    targets = target_modules[0] if target_modules == ("all-linear",) else list(target_modules)
    try:
        return get_peft_model(model, LoraConfig(r=r, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules=targets,
                                                task_type="CAUSAL_LM"))
    except ValueError as exc:  # e.g. a target module the model does not have
        raise ValueError(f"lora_target_modules: {first_line(exc, 200)}") from None


#: Compiled graphs kept per decoder block: dynamo keys a block's graph on grad mode, autocast, whether the block gets
#: a shared prompt's key-value cache (and, through the cache, its layer index), so each block has its own few graphs.
GRAPHS_PER_BLOCK = 8


def compile_blocks(model: torch.nn.Module) -> int:
    """Compile each decoder block of ``model`` in place (``torch.compile``, inductor, dynamic shapes): the block's
    elementwise work (norms, rotary embeddings, activations, autocast's casts) fused around its matmuls. The
    parameters and the state dict stay the same objects under the same names (``Module.compile``), so the weight
    sync, LoRA and checkpoints see the model as before. Returns the number of blocks."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise ValueError(f"compile: found no decoder blocks in {type(model).__name__} (model.get_decoder().layers); "
                         "drop --compile for this model")
    import torch._dynamo.config as dynamo

    # every block runs the same forward code, whose graphs dynamo counts together
    dynamo.recompile_limit = max(dynamo.recompile_limit, GRAPHS_PER_BLOCK * len(layers))
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 2 * GRAPHS_PER_BLOCK * len(layers))
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)


@dataclass(frozen=True)
class Precision:
    """Mixed precision of the trainer's forward passes: float32 master weights and optimiser, matmuls in
    ``autocast_dtype`` (None: float32 throughout). Log-probabilities and losses are always float32."""

    autocast_dtype: torch.dtype | None = None

    @classmethod
    def of(cls, dtype: str) -> "Precision":
        """The precision of a run's ``dtype`` (the machine group's: 'float32' or 'bfloat16')."""
        return cls(torch.bfloat16 if dtype == "bfloat16" else None)

    def autocast(self, device: torch.device):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.autocast_dtype)
