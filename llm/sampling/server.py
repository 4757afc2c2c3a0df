"""alpha held by a separate vLLM server (``python -m llm serve``), reached over HTTP (docs/theory.md, §7).

- generation: one ``/v1/completions`` request per prompt (token ids in; ``return_token_ids`` and
  ``logprobs=0`` give the sampled ids and their processed log-probs out), sent concurrently so the
  server batches them; per-prompt seeds as in the in-process sampler; top-k, top-p and min-p as the run's
  filter asks (the processed log-probs are those of the filtered distribution);
- weight sync: vLLM's weight-transfer handshake over its RL routes (``HTTPVLLMWeightSyncClient``) with
  the project's ``gloo_cpu`` backend on CPU or vLLM's ``nccl`` on CUDA;
- weight versions: every sync ends with a version unique to this trainer process and sync
  (``/update_weight_version``), and every generation call first checks ``/weight_info``, so a server that
  restarted (or was synced by someone else) is caught before a single sample of it is used;
- faults: every request has a timeout; an unreachable or failing server raises ``ServerError``, a
  one-line message naming the URL (the trainer's last checkpoint is untouched).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import secrets
from pathlib import Path

import torch

from runkit.cli import RunError

from llm.tensors.token_filter import NO_FILTER, TokenFilter
from llm.sampling.base import Rollout

#: Parallel HTTP requests per generation call (the server batches whatever is in flight).
MAX_CONCURRENT_REQUESTS = 64


class ServerError(RunError):
    """The inference server is unreachable, failed a request, or holds other weights than expected."""


def _same_model(served: list[dict], model_path: str) -> bool:
    """Whether the server serves ``model_path`` (compared as given and as a resolved local path)."""
    names = {n for m in served for n in (m.get("id"), m.get("root")) if n}
    wanted = {model_path}
    if os.path.isdir(model_path):
        wanted.add(str(Path(model_path).resolve()))
        names |= {str(Path(n).resolve()) for n in names if os.path.isdir(n)}
    return bool(names & wanted)


def connection_retries():
    """Retries of a request whose connection failed before an answer came (urllib3's ``Retry``, no retry on an HTTP
    status). vLLM's server closes a kept-alive connection after 5 idle seconds; a request sent on it just as it closes
    is lost ("connection refused or lost"), which under load happened mid-run against a server that kept serving.
    Every request this sampler sends may be sent twice: generation is seeded and changes nothing on the server, the
    version and prefix-cache calls set a state, not an increment. A server that is down still fails within about a
    second (three connection attempts)."""
    from urllib3.util.retry import Retry

    return Retry(total=3, connect=3, read=3, status=0, other=0, allowed_methods=None, backoff_factor=0.1,
                 raise_on_status=False)


class ServerSampler:
    """Samples from vLLM's OpenAI server at ``url``; ``load_weights`` pushes the trainer's weights into it."""

    name = "server"
    holds_own_weights, runs_server = True, True  # what it is (``llm.sampling.base.Sampler``)
    returns_logprobs, owns_torch_distributed = True, False

    def __init__(self, url: str, model_path: str, *, eos_token_id: int, max_model_len: int, timeout: float = 120.0,
                 sync_host: str = "127.0.0.1"):
        import requests

        self.url, self.model_path, self.eos, self.timeout = url.rstrip("/"), model_path, eos_token_id, timeout
        self.sync_host = sync_host
        self.session = requests.Session()
        self.session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=MAX_CONCURRENT_REQUESTS,
                                                                    max_retries=connection_retries()))
        self._tag = secrets.token_hex(4)  # this trainer process; part of every weight version it sets
        self._syncs = 0
        self.expected_version: str | None = None
        self.engine = None
        self.last_sync_bytes = 0
        served = self._get("/v1/models")["data"]
        if not _same_model(served, model_path):
            names = ", ".join(sorted({m.get("root") or m.get("id") for m in served}))
            raise ServerError(f"sampler server: {self.url} serves {names}, but the trainer loads {model_path}; "
                              "start the server with the trainer's model (python -m llm serve --model MODEL)")
        self.served_name = served[0]["id"]
        limit = min(int(m.get("max_model_len") or 1 << 30) for m in served)
        self.max_model_len = limit  # a request asks for no more than fits (an agent's later turns ask for the most)
        if limit < max_model_len:
            raise ServerError(f"sampler server: {self.url} holds sequences of up to {limit} tokens, the run needs "
                              f"{max_model_len} (restart it with --max-model-len {max_model_len})")

    # ---- HTTP --------------------------------------------------------------------------------
    # (connection_retries: a request that finds its kept-alive connection just closed by the server is sent again)
    def _request(self, method: str, path: str, json=None, timeout: float | None = None):
        import requests

        try:
            response = self.session.request(method, self.url + path, json=json, timeout=timeout or self.timeout)
        except requests.Timeout:
            raise ServerError(f"sampler server: {self.url}{path} did not answer within {timeout or self.timeout:g} s "
                              "(server overloaded or hung; raise --server-timeout or restart it)") from None
        except requests.ConnectionError:
            raise ServerError(f"sampler server: cannot reach {self.url} ({path}): connection refused or lost; start "
                              "it with python -m llm serve --model MODEL (a run stopped by this resumes with the same "
                              "command)") from None
        if response.status_code != 200:
            raise ServerError(f"sampler server: {self.url}{path} answered HTTP {response.status_code}: "
                              f"{response.text[:200]} (the server's own log has the details)")
        return response.json()

    def _get(self, path: str):
        return self._request("GET", path)

    def weight_version(self) -> str | None:
        return self._get("/weight_info").get("weight_version")

    # ---- weight sync -------------------------------------------------------------------------
    def _engine(self, source):
        if self.engine is None:
            from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

            from llm.sampling.weight_transfer import HTTPClient, register, trainer_init_info

            register()  # this process is not a vLLM process: its plugins are not loaded here
            client = HTTPClient(self.url, timeout=self.timeout, on_error=self._wrap_error)
            world = int(self._get("/get_world_size?include_dp=false")["world_size"])
            self.engine = WeightTransferTrainerFactory.trainer_init(
                trainer_init_info(self.sync_host, server_world_size=world), client=client, source=source)
        self.engine.source = source
        return self.engine

    def _wrap_error(self, route: str, exc: Exception) -> ServerError:
        import requests

        if isinstance(exc, requests.Timeout):
            why = f"no answer within {self.timeout:g} s"
        elif isinstance(exc, requests.ConnectionError):
            why = "connection refused or lost: the server stopped"
        elif isinstance(exc, requests.HTTPError) and exc.response is not None:
            why = f"HTTP {exc.response.status_code}: {exc.response.text[:200]}"
        else:
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
        return ServerError(f"sampler server: weight sync with {self.url} failed at {route} ({why}); the last "
                           "checkpoint is intact: restart the server and rerun the same command to resume")

    def load_weights(self, model: torch.nn.Module) -> None:
        """alpha <- ``model``: a full round of vLLM's weight-transfer handshake, then a version check."""
        from llm.sampling.weight_transfer import CheckpointSource

        engine = self._engine(CheckpointSource(model))
        self._syncs += 1
        version = f"{self._tag}-{self._syncs}"
        engine.send_weights()  # start, update (+ the transfer), finish: vLLM's handshake, any backend
        if not self._request("POST", "/reset_prefix_cache").get("success"):  # cached keys and values: old weights'
            raise ServerError(f"sampler server: {self.url} did not empty its prefix cache after a weight sync (a request "
                              "of another client running?)")
        self._request("POST", "/update_weight_version", json={"new_version": version})
        self.last_sync_bytes = engine.source.nbytes()
        self.expected_version = version
        self.check_version()

    def check_version(self) -> None:
        """The server must hold the weights of this trainer's last sync (not a restart's, not another run's)."""
        held = self.weight_version()
        if held != self.expected_version:
            raise ServerError(f"sampler server: {self.url} holds weights version {held!r}, the trainer sent "
                              f"{self.expected_version!r} (the server restarted or another trainer synced it); "
                              "rerun the same command to resume, which re-sends alpha's weights first")

    # ---- generation --------------------------------------------------------------------------
    def _complete(self, prompt: list[int], n: int, max_tokens: int, temperature: float, seed: int,
                  token_filter: TokenFilter = NO_FILTER) -> list[dict]:
        """One request: n completions of ``prompt`` (temperature 0: greedy)."""
        max_tokens = max(1, min(max_tokens, self.max_model_len - len(prompt)))  # the server refuses more
        body = {"model": self.served_name, "prompt": prompt, "n": n, "max_tokens": max_tokens,
                "temperature": temperature, "top_p": token_filter.top_p, "top_k": token_filter.top_k or -1,
                "min_p": token_filter.min_p, "logprobs": 0, "seed": seed,
                "stop_token_ids": [self.eos], "return_token_ids": True, "skip_special_tokens": False,
                "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
        choices = sorted(self._request("POST", "/v1/completions", json=body)["choices"], key=lambda c: c["index"])
        if len(choices) != n:
            raise ServerError(f"sampler server: {self.url} returned {len(choices)} completions, asked for {n}")
        return choices

    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                 greedy: bool = False, token_filter: TokenFilter = NO_FILTER) -> Rollout:
        """n completions per prompt, prompt-major, from the filtered distribution (``greedy``: the most likely token
        at every position)."""
        temperature = 0.0 if greedy else temperature
        if self.expected_version is not None:
            self.check_version()
        # One seed per prompt, as the in-process sampler (vLLM gives a request's n samples seed..seed+n-1).
        seeds = [(seed + j * n) % (2**31) for j in range(len(prompt_ids))]
        with cf.ThreadPoolExecutor(min(MAX_CONCURRENT_REQUESTS, max(1, len(prompt_ids)))) as pool:
            results = list(pool.map(lambda a: self._complete(*a),
                                    [(p, n, max_tokens, temperature, s, token_filter)
                                     for p, s in zip(prompt_ids, seeds)]))
        comps, lps = [], []
        for choices in results:
            for c in choices:
                ids = list(c["token_ids"])
                lp = c["logprobs"]["token_logprobs"]
                if len(lp) != len(ids):
                    raise ServerError(f"sampler server: {self.url} returned {len(lp)} log-probs for {len(ids)} tokens")
                comps.append(ids)
                lps.append([float(x) for x in lp])
        return Rollout(comps, lps)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        self.session.close()
