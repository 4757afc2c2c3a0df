"""GRPOConfig is composed of groups by what consumes them: each group checks its own fields, the trainer's parts
read a setting through its group, and no file of the config outgrows a reader."""

import ast
import dataclasses
import re

import pytest

from llm.config import FIELD_GROUP, GROUPS, RESUMABLE_FIELDS, GRPOConfig, OptimConfig, flat_fields
from llm.config.grpo import GROUP_PROPERTIES
from tests.helpers import ROOT

#: Names the modules of llm/ give a GRPOConfig; (file, name) pairs where that name holds another config.
CONFIG_NAMES = {"config", "cfg", "base", "self.config", "run.config"}
OTHER_CONFIGS = {("llm/sampling/launch.py", "config"),  # ServeConfig
                 ("llm/analysis/ablation.py", "cfg")}  # AblationConfig


def flat_reads(rel: str, source: str) -> list[str]:
    """``config.learning_rate``-style reads of a group's field or property past its group in the module at ``rel``
    (its ``source``), as 'file:line: text'."""
    names = {n for n in CONFIG_NAMES if (rel, n) not in OTHER_CONFIGS}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and (node.attr in FIELD_GROUP or node.attr in GROUP_PROPERTIES):
            if ast.unparse(node.value) in names:
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_every_part_of_the_trainer_reads_a_setting_through_its_group():
    files = [p for p in (ROOT / "llm").rglob("*.py") if "config" not in p.relative_to(ROOT / "llm").parts]
    assert len(files) > 40
    assert [r for p in files for r in flat_reads(p.relative_to(ROOT).as_posix(), p.read_text())] == []


def test_the_check_finds_a_flat_read():
    source = (ROOT / "llm" / "step" / "step.py").read_text()
    assert "config.sampling.num_generations" in source
    bad = source.replace("config.sampling.num_generations", "config.num_generations", 1)
    assert len(flat_reads("llm/step/step.py", bad)) == 1


def test_each_group_checks_its_own_fields_and_the_config_the_rules_across_them():
    with pytest.raises(ValueError, match="^learning_rate: must be > 0"):
        OptimConfig(learning_rate=0.0)
    with pytest.raises(ValueError, match="^sync_policy: divergence decides from the held-out TV estimate"):
        GRPOConfig(sync_policy="divergence")  # sync and diagnostics: checked by GRPOConfig
    assert GRPOConfig(sync_policy="divergence", heldout_prompts=8).sync.sync_policy == "divergence"
    with pytest.raises(TypeError, match="unexpected option 'learning_rat'"):
        GRPOConfig(learning_rat=1e-3)


def test_flat_names_groups_and_replace_agree():
    cfg = GRPOConfig(learning_rate=1e-5, optim=OptimConfig(adam_beta1=0.8), top_p=0.9)
    assert (cfg.learning_rate, cfg.optim.learning_rate, cfg.optim.adam_beta1) == (1e-5, 1e-5, 0.8)
    assert cfg.token_filter == cfg.sampling.token_filter and cfg.token_filter.top_p == 0.9
    again = cfg.replace(max_steps=7, epsilon=0.3)
    assert (again.max_steps, again.objective.epsilon, again.optim) == (7, 0.3, cfg.optim)
    assert GRPOConfig(**cfg.to_dict()).to_dict() == cfg.to_dict()  # config.json's view (its reward_range resolved)
    cfg.learning_rate = 2e-5  # a flat assignment lands in the group, not beside it
    assert cfg.optim.learning_rate == 2e-5 and "learning_rate" not in vars(cfg)
    assert len({name for _, name, _ in flat_fields()}) == len(flat_fields()) == 138


def test_the_resumable_fields_are_marked_in_their_groups():
    # the set the run directory compared before the groups (llm/run/rundir.py's hand-kept list then)
    assert RESUMABLE_FIELDS == {
        "max_steps", "logging_steps", "save_steps", "progress", "report_to", "num_threads", "output_dir", "server_url",
        "server_timeout", "server_sync_address", "per_device_train_batch_size", "gradient_checkpointing",
        "group_by_length", "attn_implementation", "logit_chunk_tokens", "trust_remote_code",
        "max_consecutive_skipped_updates", "fsdp", "share_prompts", "keep_freed_memory", "freed_memory_ceiling",
        "device", "padding_free", "token_budget"}
    for group, cls in GROUPS.items():
        assert all(FIELD_GROUP[name] == group for name in cls.model_fields)


def test_no_file_of_the_config_is_over_300_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (ROOT / "llm" / "config").glob("*.py")}
    assert len(sizes) >= 7 and max(sizes.values()) <= 300, sizes


def test_the_options_carry_no_benchmark_figures():
    assert not re.search(r"\d+(\.\d+)?x faster|\d+% faster", (ROOT / "docs" / "options.md").read_text())
