"""The code's layers point one way: a module imports only modules of its own layer or below (function-level imports
included), and no chain of imports comes back to where it started. A new module must be given a layer here."""

import ast
from pathlib import Path

from tests.helpers import ROOT

#: Layers, lowest first; a module may import its own layer and those listed before it.
LAYERS = [
    ["runkit", "runkit.cli", "runkit.host_memory", "runkit.interrupt", "runkit.net", "runkit.quiet", "runkit.runio",
     "runkit.tables", "runkit.validation"],
    ["grpo_theory.validation", "grpo_theory.numerics", "grpo_theory.core", "grpo_theory.betting", "grpo_theory.estimators",
     "grpo_theory.amplification", "grpo_theory.instances", "grpo_theory.symbolic", "grpo_theory.corrections", "grpo_theory.trm",
     "grpo_theory.sync_policy", "grpo_theory.truncation", "grpo_theory.loss_types", "grpo_theory.objectives", "grpo_theory.vcpo", "grpo_theory"],
    ["grpo_theory.simulate", "grpo_theory.check", "grpo_theory.sigma_bias", "grpo_theory.experiments",
     "grpo_theory.certificate"],
    # llm/, its folders in the order of a step's data flow
    ["llm.config.fields", "llm.config.user_code", "llm.config.ranges", "llm.config.model", "llm.config.algorithm", "llm.config.machinery", "llm.config.observation",
     "llm.config.agent", "llm.config.grpo", "llm.config.trl_names", "llm.config.trl_messages", "llm.config.trl", "llm.config", "llm.tensors.metrics",
     "llm.tensors", "llm.models", "llm.step", "llm.run", "llm.commands"],  # settings and conventions, no torch
    ["llm.tasks.data", "llm.rewards.functions", "llm.rewards.overlong", "llm.rewards.model", "llm.rewards",
     "llm.rewards.agents", "llm.tasks.procedural", "llm.tasks", "llm.tasks.arithmetic_tools", "llm.tasks.sources"],
    # tasks/, rewards/: prompts and their rewards (the built-in agent task among them)
    ["llm.models.distributed", "llm.models.vml", "llm.models.model", "llm.models.tiny",
     "llm.models.pretrained"],  # models/: processes, models, where weights come from (built-in, GGUF, a directory)
    ["llm.tensors.token_filter", "llm.tensors.batch", "llm.tensors.logit_head", "llm.tensors.logprobs", "llm.tensors.loss", "llm.tensors.diagnostics", "llm.tensors.sync_probe", "llm.tensors.agent_metrics",
     "llm.tensors.passes"],  # tensors/: the tensors of a step and the passes that compute them
    ["llm.sampling.token_filter", "llm.sampling.base", "llm.sampling.vllm_settings", "llm.sampling.weight_transfer",
     "llm.sampling.static_decode",
     "llm.sampling.hf_generate", "llm.sampling.hf_continuous", "llm.sampling.vllm_engine", "llm.sampling.server",
     "llm.sampling", "llm.sampling.launch"],  # sampling/: who holds alpha
    ["llm.agents.tools", "llm.agents.workers", "llm.agents.environments", "llm.agents.template", "llm.agents.episodes",
     "llm.agents.setup",
     "llm.agents"],  # agents/: episodes of turns and tool calls over any sampler
    ["llm.evaluation.exact", "llm.evaluation.passk", "llm.evaluation.policy_eval", "llm.evaluation"],  # evaluation/
    ["llm.optim.schedule", "llm.optim.baseline", "llm.optim.update", "llm.optim"],  # optim/: the optimiser
    ["llm.step.clock", "llm.step.rollout", "llm.step.score", "llm.step.behaviour", "llm.step.diagnose",
     "llm.step.weights", "llm.step.monitors"],  # step/: one step's stages, phase by phase
    ["llm.step.step"],  # step/step.py: run_step, the stages in order
    ["llm.run.plan", "llm.run.specs"],  # run/plan.py: what the run decides from the options, once; run/specs.py: the
    # rooms' specs from the config
    ["llm.run.rundir", "llm.run.trackers", "llm.run.output"],
    ["llm.run.trainer"],  # run/: the loop over steps
    ["llm.integrations.readings", "llm.integrations.watcher", "llm.integrations.async_grpo", "llm.integrations.trl",
     "llm.integrations.verl", "llm.integrations.verl_watch", "llm.integrations"],  # integrations/: our readings in other
    # trainers, on their tensors (the step's monitors and the estimators of tensors/)
    ["llm", "llm.analysis.report", "llm.analysis.ablation", "llm.analysis.warning", "llm.analysis"],  # analysis/
    ["llm.commands.train", "llm.commands.serve", "llm.commands.report", "llm.commands.ablation",
     "llm.commands.options", "llm.commands.tiny", "llm.commands.pretrained", "llm.commands.agent_data",
     "llm.train"],  # commands/: parse, then call; llm/train.py: python -m llm.train
    ["llm.commands.console", "llm.__main__"],  # python -m llm, offpolicy-grpo: every command by name (at dispatch)
]


LAYER = {m: i for i, names in enumerate(LAYERS) for m in names}


PACKAGES = ("runkit", "grpo_theory", "llm")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The project's modules ``path`` imports, anywhere in it (a name imported from a package counts as the package
    or, when it is one, the submodule)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in LAYER else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t.split(".")[0] in PACKAGES}
    return found


def graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    return {module_name(p): imports(p) - {module_name(p)} for p in files}


def test_every_module_has_a_layer_and_imports_none_above_its_own():
    edges = graph()
    assert not sorted(set(edges) - set(LAYER)), "give these modules a layer in tests/contracts/test_layers.py"
    upward = sorted(f"{src} -> {dst}" for src, dsts in edges.items() for dst in dsts if LAYER[dst] > LAYER[src])
    assert not upward, upward


def test_no_import_cycle():
    edges, state, cycles = graph(), {}, []

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_the_checker_sees_function_level_and_relative_imports(tmp_path):
    edges = graph()
    assert "grpo_theory.core" in edges["grpo_theory.check"]  # a module-level relative import
    assert "llm.sampling.vllm_engine" in edges["llm.sampling"]  # a function-level one
