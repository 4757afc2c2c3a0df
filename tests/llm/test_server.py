"""The lagged inference server as its own process: vLLM's OpenAI server (``python -m llm serve``) on loopback, weights synced
through vLLM's weight-transfer API with the project's ``gloo_cpu`` backend, everything checked over the wire
(llm.sampling.server, llm.sampling.launch).

One server is started for the module, with the README's command (37-38 s alone on the 2-core host), and stopped at
its end; the last test kills it and starts it again."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from llm import GRPOConfig, train
from llm.tensors.batch import make_batch, padded
from llm.tensors.logprobs import completion_logprobs
from llm.models.model import load_policy
from llm.models.tiny import tiny_model_dir
from llm.run.rundir import read_metrics
from llm.sampling.vllm_engine import vllm_available
from tests.helpers import LEARNING_MARGIN, ROOT, SYNC_ATOL, long_prompts, max_logp_gap, perturb

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]


#: The trainer's warning threshold (llm.run.trainer.SYNC_LOGP_TOLERANCE["float32"]); a skipped sync is far above it.
STALE_MIN = 1e-2


class ReadmeServer:
    """``python -m llm serve --port P --extra-args '--max-num-seqs 64'``, the README's server command on the built-in
    model: llm.serve in front, vLLM's server and engine its children, everything they print in ``log``."""

    def __init__(self, log: Path, model: str = ""):
        from runkit.net import free_port

        self.port, self.log, self.proc, self.model = free_port(), log, None, model
        self.url, self.model_path = f"http://127.0.0.1:{self.port}", model or str(tiny_model_dir())

    def start(self) -> "ReadmeServer":
        seen = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "llm", "serve", *(["--model", self.model] if self.model else []),
                                          "--port", str(self.port), "--extra-args", "--max-num-seqs 64"],
                                         stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + 300
        while f"ready: {self.url}" not in self.log.read_text()[seen:]:
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.25)
        return self

    def children(self) -> list:
        import psutil

        return psutil.Process(self.proc.pid).children(recursive=True)

    def kill(self) -> list:
        """SIGKILL llm.serve, as a crash would; the children still alive a minute later (none: they die with it)."""
        import psutil

        children = self.children()
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return psutil.wait_procs(children, timeout=60)[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: llm.serve stops vLLM's server as Ctrl-C does
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = ReadmeServer(tmp_path_factory.mktemp("server") / "server.log").start()
    yield proc
    proc.stop()


def _sampler(server, tok):
    from llm.sampling.server import ServerSampler

    return ServerSampler(server.url, server.model_path, eos_token_id=tok.eos_token_id, max_model_len=64, timeout=60)


def _config(tmp_path, server, name, **kw):
    base = dict(output_dir=str(tmp_path / name), sampler="server", server_url=server.url, progress=False,
                logging_steps=1000, seed=0, server_timeout=60)
    return GRPOConfig(**{**base, **kw})


def test_sync_over_the_wire_is_exact_and_versioned(server):
    """Three perturb-and-sync rounds over HTTP + gloo: the stale server is far off before each sync, exactly the
    trainer after it, also on prompts whose first block the server cached before the sync (so the sync emptied its
    prefix cache); the server holds the version the trainer set; the bytes moved are the state dict's."""
    from llm.sampling.server import ServerError

    policy, tok = load_policy(server.model_path, torch.device("cpu"))
    sampler = _sampler(server, tok)
    try:
        for round_ in range(3):
            perturb(policy, round_)
            long = long_prompts(tok, 4)  # longer than a KV cache block: cached before the sync, not after it
            if round_ > 0:
                assert max_logp_gap(sampler, policy, tok, seed=round_) > STALE_MIN, "must fail without the sync"
                assert max_logp_gap(sampler, policy, tok, seed=round_, prompts=long) > STALE_MIN
            sampler.load_weights(policy)
            assert max_logp_gap(sampler, policy, tok, seed=round_) <= SYNC_ATOL
            assert max_logp_gap(sampler, policy, tok, seed=round_, prompts=long) <= SYNC_ATOL
            assert sampler.weight_version() == sampler.expected_version == f"{sampler._tag}-{round_ + 1}"
        assert sampler.last_sync_bytes == sum(t.numel() * t.element_size() for t in policy.state_dict().values())
        # Another trainer (or a restart) changes the server's weights: caught before any sample is used.
        sampler._request("POST", "/update_weight_version", json={"new_version": "someone-else"})
        with pytest.raises(ServerError, match=f"{server.url} holds weights version 'someone-else'"):
            sampler.generate([[1, 2]], 2, 2, 1.0, 0)
    finally:
        sampler.close()


def test_one_call_over_4096_prompt_tokens(server):
    """One generation call of 18,816 prompt tokens (48 prompts x 8 completions): above vLLM's CPU batch of 4,096 the
    server split the prefill and failed every seeded request (HTTP 500, 'CPU Generator does not use offset'); with
    chunked prefill off (``llm.serve`` on a CPU) it samples, with the trainer's log-probs."""
    policy, tok = load_policy(server.model_path, torch.device("cpu"))
    sampler = _sampler(server, tok)
    try:
        sampler.load_weights(policy)
        prompts = long_prompts(tok)
        roll = sampler.generate(prompts, 8, 3, 1.0, 5)
        assert len(roll.completion_ids) == 384 and sum(map(len, prompts)) * 8 > 16_000
        rows = list(range(0, 384, 41))
        batch = make_batch([prompts[r // 8] for r in rows], [roll.completion_ids[r] for r in rows], tok.pad_token_id,
                           "cpu")
        with torch.no_grad():
            logp = completion_logprobs(policy, batch, 1.0).logp
        gap = (padded([roll.logprobs[r] for r in rows], logp.shape[1], "cpu") - logp).abs() * batch.completion_mask
        assert float(gap.max()) <= SYNC_ATOL
    finally:
        sampler.close()


def test_the_server_command_line_follows_the_model():
    """``llm.serve`` without --max-model-len serves the model's positions (the built-in model: 64; vLLM refused the
    old fixed 2048), a length above them is one line, chunked prefill is off and the KV cache is sized on a CPU, and
    ``--extra-args '--max-num-seqs 64'`` (a value that starts with '--') reaches vLLM."""
    from llm.commands.serve import joined_extra_args
    from llm.sampling.launch import ServeConfig, model_len, served_model, server_command

    model = served_model(ServeConfig())
    assert model_len(ServeConfig(), model) == 64 and model_len(ServeConfig(max_model_len=40), model) == 40
    with pytest.raises(ValueError, match="max_model_len: 65 exceeds the model's 64 positions"):
        model_len(ServeConfig(max_model_len=65), model)
    args, _ = server_command(ServeConfig(device="cpu", extra_args="--max-num-seqs 64"), model, 8000)
    assert args[args.index("--max-model-len") + 1] == "64" and "--no-enable-chunked-prefill" in args
    assert "--enable-prefix-caching" in args and args[args.index("--block-size") + 1] == "32"
    assert int(args[args.index("--kv-cache-memory-bytes") + 1]) >= 64 * 2**20
    assert args[-2:] == ["--max-num-seqs", "64"]
    assert joined_extra_args(["--port", "1", "--extra-args", "--max-num-seqs 64"]) == [
        "--port", "1", "--extra-args=--max-num-seqs 64"]


def test_the_readme_server_command_serves(server):
    """The module's server is the README's command: it became ready on the built-in model, ``--extra-args
    '--max-num-seqs 64'`` reached vLLM's server, and it serves. (SIGKILL of the command takes vLLM's server and
    engine with it: test_server_killed_mid_run_stops_with_a_clear_error_and_the_run_resumes.)"""
    from transformers import AutoTokenizer

    assert any("--max-num-seqs" in c.cmdline() and "64" in c.cmdline() for c in server.children())
    tok = AutoTokenizer.from_pretrained(server.model_path)
    sampler = _sampler(server, tok)
    try:
        assert len(sampler.generate(long_prompts(tok, 12), 2, 2, 1.0, 0).completion_ids) == 24
    finally:
        sampler.close()


def test_bad_url_and_other_model_are_clear_errors_at_start_up(server, tmp_path):
    from llm.sampling.server import ServerError

    with pytest.raises(ServerError, match=r"cannot reach http://127\.0\.0\.1:9 "):
        train(_config(tmp_path, server, "bad", server_url="http://127.0.0.1:9"), log=lambda *a: None)
    other = shutil.copytree(server.model_path, tmp_path / "other_model")
    with pytest.raises(ServerError, match=f"{server.url} serves .* but the trainer loads {other}"):
        train(_config(tmp_path, server, "other", model_name_or_path=str(other)), log=lambda *a: None)
    with pytest.raises(ValueError, match="server_url: sampler 'server' needs"):
        GRPOConfig(sampler="server")


@pytest.mark.slow
def test_training_against_the_server_raises_exact_j_and_every_sync_is_exact(server, tmp_path):
    """v = 4 for 40 steps against the server: exact J rises by the learning margin (measured, seed 0, 2-core AVX2
    host, 2026-11-27: +0.031 at 10 steps, +0.061 at 30, +0.075 at 40, +0.101 at 60; a 40-step run: +0.075), every
    sync leaves the server with exactly the trainer's weights, and each sync's size and rate are logged."""
    rows = read_metrics(train(_config(tmp_path, server, "learn", max_steps=40, sync_period=4, exact_j_steps=40),
                              log=lambda *a: None))
    assert rows[-1]["j/pi_new"] - rows[0]["j/pi_k"] >= LEARNING_MARGIN, (rows[0]["j/pi_k"], rows[-1]["j/pi_new"])
    for row in rows:
        if row["lag"] == 0:
            assert row["sampling/logp_diff_mean"] <= 1e-5
            assert row["sampling/logp_diff_max"] <= 10 * SYNC_ATOL  # worst of ~1,500 tokens, rare ones included
            if row["step"] > 0:
                assert row["sync/mb"] > 1 and row["time/sync_mb_per_s"] > 0 and row["time/sync"] > 0


def test_two_torchrun_ranks_against_the_server_sync_it_exactly(server, tmp_path):
    """torchrun with 2 ranks and the server (rank 0 generates and syncs), v = 4 for 12 steps: every step is logged
    once and each of the 3 syncs leaves the server with the trainer's weights. (That two ranks compute one
    process's numbers is tests/llm/test_distributed.py's; that training against the server learns is
    test_training_against_the_server_raises_exact_j_and_every_sync_is_exact's.)"""
    out = tmp_path / "two_ranks"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    res = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "llm.train", "--sampler", "server",
                          "--server-url", server.url, "--sync-period", "4", "--max-steps", "12", "--num-threads", "1",
                          "--no-progress", "--output-dir", str(out)], capture_output=True, text=True,
                         cwd=ROOT)
    assert res.returncode == 0, [ln for ln in res.stderr.splitlines() if "error" in ln.lower()]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(12))
    synced = [r for r in rows if r["lag"] == 0]
    assert [r["step"] for r in synced] == [0, 4, 8]
    assert all(r["sampling/logp_diff_max"] <= 10 * SYNC_ATOL for r in synced)
    assert all(r["sync/mb"] > 1 for r in synced[1:])


def test_asynchronous_generation_against_the_server(server, tmp_path):
    """--async-generation, v = 2: the server generates each window while the trainer trains the previous one; the
    logged lag runs v..2v-1 after the first window, each sync moves the weights, and the server's log-probs at the
    first step of every window equal the trainer's copy of the weights that generated it."""
    rows = read_metrics(train(_config(tmp_path, server, "async", max_steps=7, sync_period=2, async_generation=True,
                                      prompts_per_step=8), log=lambda *a: None))
    assert [r["lag"] for r in rows] == [0, 1, 2, 3, 2, 3, 2]
    for row in rows:
        if row["step"] % 2 == 0:
            assert row["sampling/logp_diff_max"] <= 10 * SYNC_ATOL, row["step"]
            if row["step"] > 0:
                assert row["sync/mb"] > 1 and row["time/sync"] > 0


def test_a_sync_that_moves_no_weights_is_caught(server, tmp_path, monkeypatch, capsys):
    """A sync that reports success (the version is set) but moves no weights: from the start, the start-up probe
    refuses the run; later in a run, the lag-0 log-prob check after it fails and the trainer warns. A sync skipped
    altogether stops the run at the version check."""
    from llm.sampling.server import ServerError, ServerSampler

    real = ServerSampler.load_weights

    def hollow_after(n_real):
        def load(self, model):
            if self._syncs < n_real:
                return real(self, model)
            self._syncs += 1
            self.expected_version = f"{self._tag}-{self._syncs}"
            self._request("POST", "/update_weight_version", json={"new_version": self.expected_version})
        return load

    monkeypatch.setattr(ServerSampler, "load_weights", hollow_after(0))  # the probe's syncs are hollow
    with pytest.raises(ValueError, match="do not reach its forward pass for Qwen2ForCausalLM"):
        train(_config(tmp_path, server, "hollow0", max_steps=3, beta=0.0), log=lambda *a: None)

    monkeypatch.setattr(ServerSampler, "load_weights", hollow_after(2))  # the probe's two syncs are real
    rows = read_metrics(train(_config(tmp_path, server, "hollow", max_steps=3, beta=0.0), log=lambda *a: None))
    assert rows[0]["sampling/logp_diff_max"] <= 10 * SYNC_ATOL
    assert all(r["sampling/logp_diff_max"] > STALE_MIN for r in rows[1:])
    assert "may hold stale weights" in capsys.readouterr().out

    monkeypatch.setattr(ServerSampler, "load_weights", _skip_after_first(real))
    with pytest.raises(ServerError, match="holds weights version"):
        train(_config(tmp_path, server, "skipped", max_steps=3, beta=0.0), log=lambda *a: None)


def _skip_after_first(real):
    """load_weights that syncs once, then bumps only the trainer's expectation (the server never hears of it)."""

    def skip(self, model):
        if self.expected_version is None:
            return real(self, model)
        self._syncs += 1
        self.expected_version = f"{self._tag}-{self._syncs}"

    return skip


@pytest.mark.slow
def test_server_killed_mid_run_stops_with_a_clear_error_and_the_run_resumes(server, tmp_path):
    """SIGKILL the README's server command after step 5 (checkpoint after step 3): vLLM's server and engine die with
    it (they run in their own session, and were once left holding the port and the memory), so the port is free;
    the next sync fails with one line naming the URL; with the server restarted, the same command resumes (alpha's
    weights re-sent first) and finishes with every step's row exactly once."""
    import socket

    from llm.sampling.server import ServerError

    cfg = _config(tmp_path, server, "killed", max_steps=10, sync_period=2, save_steps=4, beta=0.0)
    alive = []

    def kill_after_step_5(step, row):
        if step == 5:
            alive.extend(server.kill())

    with pytest.raises(ServerError) as err:
        train(cfg, log=lambda *a: None, callbacks=[kill_after_step_5])
    assert not alive, [c.cmdline()[:4] for c in alive]
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", server.port)) != 0  # nothing listens any more
    message = str(err.value)
    assert server.url in message and "\n" not in message and "rerun the same command" in message
    server.start()
    rows = read_metrics(train(cfg, log=lambda *a: None))
    assert [r["step"] for r in rows] == list(range(10))
    assert all(r["sampling/logp_diff_max"] <= 10 * SYNC_ATOL for r in rows if r["lag"] == 0)


def test_agent_episodes_against_the_server(tmp_path):
    """The built-in agent task against vLLM's server serving the built-in agent model, v = 2 for 4 steps: every turn
    of an episode comes from the server, and right after each sync its log-probs equal the trainer's on the policy's
    tokens."""
    from llm.models.tiny import agent_model_dir

    server = ReadmeServer(tmp_path / "agent_server.log", str(agent_model_dir())).start()
    try:
        rows = read_metrics(train(_config(tmp_path, server, "agent", dataset="arithmetic_tools",
                                          max_completion_length=40, max_steps=4, sync_period=2, prompts_per_step=4),
                                  log=lambda *a: None))
    finally:
        server.stop()
    assert [r["lag"] for r in rows] == [0, 1, 0, 1]
    assert all(r["sampling/logp_diff_max"] <= 10 * SYNC_ATOL for r in rows if r["lag"] == 0)
    assert all(r["tools/call_frequency"] > 0 for r in rows)
