"""The recipe of the built-in tiny model and its command, ``python -m llm tiny --out DIR | --ship``: supervised
warm-up of ``llm.models.tiny.build_model`` on the arithmetic task's training prompts until its sampled accuracy
(temperature 1, the transformers sampler) reaches WARMUP_TARGET, then a model directory with its checksums. Nothing
builds a model at run time: the shipped one (``llm.models.tiny.tiny_model_dir``) is the built-in model."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from runkit.cli import parse
from runkit.validation import require

from llm.models.tiny import (AGENT_DIR, BUILTIN_DIR, WARMUP_BAND, WARMUP_TARGET, TinySpec, build_model,
                             build_tokenizer, tiny_model_dir, write_checksums)
from llm.sampling import TransformersSampler
from llm.tasks import Task, arithmetic_task

PROG = "python -m llm tiny"


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


#: The agent model's warm-up: AdamW steps of this many episodes at this rate, exact J read every this many steps.
AGENT_WARMUP = {"batch": 64, "lr": 1e-3, "max_steps": 2000, "eval_every": 10, "seed": 0}


def build_agent_model(dest: Path, log=print) -> Path:
    """The built-in agent model: the built-in model (its weights, ``tiny_model_dir``) with the tool-call chat template
    and response template of ``llm.tasks.arithmetic_tools`` in its tokenizer, warmed up on the accepted episodes of the
    ``arithmetic_tools`` training prompts (labels on the policy's tokens only: the environment's are given) until
    the exact J over the training prompts (temperature 1) reaches WARMUP_TARGET."""
    from transformers import AutoModelForCausalLM

    from llm.models.model import load_tokenizer

    from llm.tasks.arithmetic_tools import BUILTIN_CHAT_TEMPLATE, BUILTIN_RESPONSE_TEMPLATE, arithmetic_tools_task
    from llm.agents.setup import build_agent
    from llm.config.agent import AgentConfig
    from llm.evaluation.exact import mean_exact_j

    w = AGENT_WARMUP
    torch.manual_seed(w["seed"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    tokenizer = load_tokenizer(str(tiny_model_dir()))
    tokenizer.chat_template = BUILTIN_CHAT_TEMPLATE
    tokenizer.response_template = BUILTIN_RESPONSE_TEMPLATE
    task = arithmetic_tools_task()
    bound = task.bind(tokenizer, agent=build_agent(AgentConfig(), task, tokenizer, log))
    pad = tokenizer.pad_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=w["lr"])
    rng = np.random.default_rng(w["seed"])
    j = 0.0
    for step in range(1, w["max_steps"] + 1):
        model.train()
        idx = task.sample(rng, w["batch"])
        seqs = [(bound.prompt_ids[i], bound.accepted_ids[i][0], bound.accepted_masks[i][0]) for i in idx]
        n = max(len(p) + len(c) for p, c, _ in seqs)
        x = torch.tensor([p + c + [pad] * (n - len(p) - len(c)) for p, c, _ in seqs])
        y = torch.tensor([[-100] * len(p) + [t if m else -100 for t, m in zip(c, mk)] + [-100] * (n - len(p) - len(c))
                          for p, c, mk in seqs])
        loss = model(input_ids=x, attention_mask=(x != pad).long(), labels=y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % w["eval_every"] == 0:
            model.eval()
            j = mean_exact_j(model, bound, 1.0, pad)
            log(f"  agent warm-up step {step}: loss {loss.item():.3f}, exact J {j:.1%}")
            if j >= WARMUP_TARGET:
                break
    if not WARMUP_BAND[0] <= j <= WARMUP_BAND[1]:
        raise RuntimeError(f"agent model warm-up ended at exact J {j:.1%}, outside {WARMUP_BAND}")
    dest.mkdir(parents=True, exist_ok=True)
    for f in dest.iterdir():
        f.unlink()
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    (dest / "warmup.json").write_text(json.dumps({"from": "builtin_model", "warmup": w, "exact_j": j,
                                                  "task": "arithmetic_tools"}, indent=1))
    for f in dest.iterdir():
        f.chmod(0o644)
    log(f"agent model: exact J after warm-up {j:.1%}")
    return dest


@dataclass
class BuildArgs:
    """Build the default tiny model (TinySpec()) with its checksums. The shipped one in llm/models/builtin_model/ was
    made this way; rebuilding it on another CPU gives other bits, so after --ship re-measure every margin the tests
    and docs rest on."""

    out: Path | None = None
    """A directory for the new model (replaced if it exists)."""
    ship: bool = False
    """Rebuild llm/models/builtin_model/ itself instead."""
    agent: bool = False
    """Build the built-in agent model (llm/models/builtin_agent_model/ with --ship) from the built-in model."""

    def __post_init__(self):
        require(self, (self.out is None) == self.ship, "out", "give exactly one of --out DIR and --ship")


def main(argv: list[str] | None = None) -> int:
    args = parse(BuildArgs, argv, prog=PROG, description=BuildArgs.__doc__)
    dest = (AGENT_DIR if args.agent else BUILTIN_DIR) if args.ship else args.out.resolve()
    if args.agent:
        build_agent_model(dest)
    else:
        build_tiny_model(TinySpec(), dest)
    write_checksums(dest)
    print(dest)
    return 0
