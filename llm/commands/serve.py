"""Command line of the lagged inference server, ``python -m llm serve [--model MODEL]``: parses ``ServeConfig``, then runs
vLLM's server until it is stopped (``llm.sampling.launch``)."""

from __future__ import annotations

import signal
import sys

from runkit.cli import RunError, parse

from llm.sampling import launch
from llm.sampling.launch import ServeConfig, ServerProcess

PROG = "python -m llm serve"


def _interrupt(signum, frame):
    """SIGTERM (kill, a job scheduler) stops the server as Ctrl-C does, instead of leaving it orphaned."""
    raise KeyboardInterrupt


def joined_extra_args(argv: list[str]) -> list[str]:
    """``--extra-args VALUE`` as ``--extra-args=VALUE``: a value that starts with '--' would otherwise be read as an
    option of this command."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("--extra-args", "--extra_args") and i + 1 < len(argv):
            out.append(f"--extra-args={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(args: list[str] | None = None) -> int:
    argv = joined_extra_args(sys.argv[1:] if args is None else list(args))
    config = parse(ServeConfig, argv, prog=PROG, description=launch.__doc__.splitlines()[0])
    server = ServerProcess(config)
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"starting vLLM's server for {server.model_path} at {server.url} (waiting for /health)", flush=True)
    try:
        server.start()
        print(f"ready: {server.url}\n  train against it with: python -m llm train --sampler server --server-url "
              f"{server.url}" + (f" --model-name-or-path {config.model}" if config.model else ""), flush=True)
        code = server.proc.wait()
    except RuntimeError as exc:
        raise ValueError(str(exc)) from None
    finally:
        server.stop()
    # vLLM's server ends by itself only when it failed (an engine error): say so, with exit status 1
    raise RunError(f"vLLM's server at {server.url} exited with status {code} while serving (its log is above)")
