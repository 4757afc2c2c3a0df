"""The options hold what the user said; the run's plan (``llm.run.plan``) holds what the run decided from them, each
value decided in one place. Each test below is a case the config got wrong while it stored derived values."""

import json

import pytest

from llm.config import GRPOConfig
from llm.config.ranges import UNIT_INTERVAL
from llm.tensors.diagnostics import UNIT_RANGE
from llm.rewards import BUILTIN_REWARD_FUNCS, SoftOverlongPunishment, sources_range
from llm.run.plan import PLAN_FILE, read_plan, resolve_plan
from llm.run.rundir import RunDir
from llm.sampling import BUILDERS, SAMPLERS, kind_class, resolve_sampler
from llm.sampling.hf_continuous import ContinuousBatchingSampler
from llm.sampling.hf_generate import TransformersSampler

OVERLONG = dict(reward_funcs=("soft_overlong_punishment",), soft_punish_cache=2)


# ---- the completion budget -----------------------------------------------------------------------------------------


def test_a_changed_dataset_brings_its_own_budget_however_it_is_changed():
    built = GRPOConfig(dataset="arithmetic_tools")
    replaced = GRPOConfig().replace(dataset="arithmetic_tools")
    assigned = GRPOConfig()
    assigned.dataset = "arithmetic_tools"
    for cfg in (built, replaced, assigned):
        assert cfg.max_completion_length is None  # what was said: nothing
        assert cfg.completion_budget == 40 and resolve_plan(cfg).max_completion_length == 40
        assert resolve_plan(cfg).completion_budget_origin == "the task's own"
    back = assigned.replace(dataset="arithmetic")
    assert back.completion_budget == 6


def test_max_completion_length_none_is_a_value_its_type_allows():
    cfg = GRPOConfig(max_completion_length=12)
    assert cfg.completion_budget == 12 and resolve_plan(cfg).completion_budget_origin == "given"
    cfg.max_completion_length = None  # "None: the task's own"
    assert cfg.max_completion_length is None and cfg.completion_budget == 6
    with pytest.raises(AttributeError, match="derived"):
        cfg.completion_budget = 3
    # the cross-group rule reads the budget: a cache longer than the task's budget is still refused
    with pytest.raises(ValueError, match=r"soft_punish_cache: must lie in \[0, max_completion_length = 6\]"):
        GRPOConfig(reward_funcs=("soft_overlong_punishment",), soft_punish_cache=7)


# ---- config.json: what was said, and it round-trips ----------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"dataset": "arithmetic_tools"}, OVERLONG, {"reward_range": (-1.0, 2.0)},
                                     {"max_completion_length": 9, "sync_period": 3}])
def test_config_json_round_trips_to_an_equal_config(options):
    cfg = GRPOConfig(**options)
    again = GRPOConfig(**json.loads(cfg.to_json()))
    assert again == cfg
    assert again.to_json() == cfg.to_json()
    assert json.loads(cfg.to_json())["reward_range"] == (list(options["reward_range"]) if "reward_range" in options
                                                         else None)


def test_a_reloaded_config_takes_what_a_fresh_one_takes():
    reloaded = GRPOConfig(**json.loads(GRPOConfig().to_json()))
    changed = reloaded.replace(**OVERLONG)  # refused before: the reload had "declared" the built-in task's [0, 1]
    plan = resolve_plan(changed)
    assert plan.reward_range == (-1.0, 0.0) and plan.reward_range_origin == "the reward's own sources"
    assert resolve_plan(reloaded).reward_range_origin == "the reward's own sources"  # not "declared"
    declared = resolve_plan(GRPOConfig(reward_range=(0, 2)))
    assert declared.reward_range == (0.0, 2.0) and declared.reward_range_origin == "declared with --reward-range"


# ---- one place each ------------------------------------------------------------------------------------------------


def test_every_sampler_kind_has_one_class_and_one_builder():
    import importlib

    assert set(SAMPLERS) == set(BUILDERS)
    names = set()
    for kind, (module, name) in SAMPLERS.items():
        cls = getattr(importlib.import_module(module), name)
        names.add(cls.name)
    assert len(names) == len(SAMPLERS)  # each kind is a class of its own


def test_a_transformers_mode_with_sampler_auto_resolves_to_transformers():
    """--cache-implementation static and --use-transformers-continuous-batching are both modes of the transformers
    sampler: with 'auto' both resolve to it (the static cache was refused), with another sampler both are refused."""
    static = GRPOConfig(cache_implementation="static")
    assert resolve_sampler(static.sampling)[0] == "transformers" and kind_class("transformers") is TransformersSampler
    paged = GRPOConfig(use_transformers_continuous_batching=True)
    assert resolve_sampler(paged.sampling)[0] == "transformers-continuous"
    assert kind_class("transformers-continuous") is ContinuousBatchingSampler
    assert resolve_plan(static).sampler == "transformers" and resolve_plan(static).sampler_class is TransformersSampler
    for mode in ({"cache_implementation": "static"}, {"use_transformers_continuous_batching": True}):
        with pytest.raises(ValueError, match="'vllm'; drop one of them"):
            GRPOConfig(sampler="vllm", **mode)
    with pytest.raises(ValueError, match="cache_implementation: .*continuous batching"):
        GRPOConfig(cache_implementation="static", use_transformers_continuous_batching=True)


def test_a_builtin_reward_declares_its_range_on_its_class(monkeypatch):
    assert BUILTIN_REWARD_FUNCS["soft_overlong_punishment"] is SoftOverlongPunishment
    assert sources_range(("soft_overlong_punishment",), (), False) == SoftOverlongPunishment.reward_range
    monkeypatch.setattr(SoftOverlongPunishment, "reward_range", (-2.0, 0.0))  # the class is what is read
    assert sources_range(("soft_overlong_punishment",), (0.5,), False) == (-1.0, 0.0)
    assert resolve_plan(GRPOConfig(**OVERLONG)).reward_range == (-2.0, 0.0)


def test_the_unit_range_is_written_once():
    assert (UNIT_RANGE.lo, UNIT_RANGE.hi) == UNIT_INTERVAL == sources_range((), (), False)


# ---- the run directory: plan.json, and a resume compares options and plans ------------------------------------------


def fake_checkpoint(path):
    import torch

    torch.save({"step": 1}, path / "checkpoint.pt")


def test_the_plan_is_written_beside_the_options_and_a_resume_compares_resolved_values(tmp_path):
    cfg = GRPOConfig(sampler="transformers", output_dir=str(tmp_path / "run"))
    with RunDir(cfg) as run:
        assert run.open() is None
    stored = json.loads((tmp_path / "run" / "config.json").read_text())
    assert stored["max_completion_length"] is None and stored["reward_range"] is None
    assert read_plan(tmp_path / "run") == resolve_plan(cfg).to_dict()
    assert read_plan(tmp_path / "run")["max_completion_length"] == 6
    fake_checkpoint(tmp_path / "run")
    with RunDir(cfg.replace(max_completion_length=6)) as run:  # the task's budget said aloud: the same run
        assert run.open()["step"] == 1
    with RunDir(cfg.replace(reward_range=(0.0, 1.0))) as run:  # the sources' range declared: the same range
        assert run.open()["step"] == 1
    for changed, name in ((dict(max_completion_length=7), "max_completion_length"),
                          (dict(reward_range=(0.0, 2.0)), "reward_range"), (dict(dataset="arithmetic_tools"),
                                                                            "dataset, max_completion_length")):
        with RunDir(cfg.replace(**changed)) as run, pytest.raises(ValueError, match=f"different config \\({name}\\)"):
            run.open()


def test_a_run_written_before_plans_resumes_on_its_resolved_values(tmp_path):
    """A config.json written before plans recorded the budget and the range it resolved, with no plan.json."""
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    cfg = GRPOConfig(sampler="transformers", output_dir=str(run_dir))
    old = {**cfg.to_dict(), "max_completion_length": 6, "reward_range": [0.0, 1.0]}
    (run_dir / "config.json").write_text(json.dumps(old))
    fake_checkpoint(run_dir)
    with RunDir(cfg) as run:
        assert run.open()["step"] == 1
    assert (run_dir / PLAN_FILE).is_file()
    (run_dir / PLAN_FILE).unlink()
    (run_dir / "config.json").write_text(json.dumps({**old, "max_completion_length": 8}))
    with RunDir(cfg) as run, pytest.raises(ValueError, match=r"different config \(max_completion_length\)"):
        run.open()


def test_the_plan_says_why_the_sampler_was_chosen():
    assert resolve_plan(GRPOConfig(sampler="transformers")).sampler_origin == "given"
    static = resolve_plan(GRPOConfig(cache_implementation="static"))
    assert (static.sampler, static.sampler_origin) == ("transformers", "auto: --cache-implementation static")
    paged = resolve_plan(GRPOConfig(use_transformers_continuous_batching=True))
    assert (paged.sampler, paged.sampler_origin) == ("transformers-continuous",
                                                      "auto: --use-transformers-continuous-batching")
    assert resolve_plan(GRPOConfig()).sampler_origin in ("auto: vLLM imports", "auto: no vLLM")
    assert "sampler transformers (auto: --cache-implementation static)" in static.lines()[0]


def test_a_run_that_saved_no_checkpoint_is_replaced_with_a_notice(tmp_path):
    """A run stopped before its first checkpoint holds nothing to resume: the next run starts afresh and says so,
    naming the options that differ."""
    cfg = GRPOConfig(sampler="transformers", output_dir=str(tmp_path / "run"))
    with RunDir(cfg) as run:
        assert run.open() is None and run.notice == ""
    with RunDir(cfg.replace(num_generations=2)) as run:
        assert run.open() is None
    assert run.notice == f"{tmp_path / 'run'} held a run that saved no checkpoint, with other options (num_generations)" \
                         ": starting afresh"
    assert json.loads((tmp_path / "run" / "config.json").read_text())["num_generations"] == 2


def test_the_report_counts_the_syncs_the_plan_counts(tmp_path):
    from llm.analysis.report import summarise

    cfg = GRPOConfig(sampler="transformers", max_steps=3, output_dir=str(tmp_path / "run"))
    with RunDir(cfg) as run:
        run.open()
        for step, reason in enumerate(["", "period", "period"]):  # v = 1: step 0's sampler holds the initial policy
            run.append_metrics({"step": step, "sync/reason": reason, "lag": 0, "reward": 0.5})
    text = summarise(tmp_path / "run")
    assert resolve_plan(cfg).num_syncs == 3
    assert "weight syncs: 3 (step 0's, then by reason: period 2)" in text
