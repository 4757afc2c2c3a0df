"""What users hold from before the config was split into groups still works: the same command-line flags, the same
``from_trl`` configs and a run directory written then resumes (tests/data/before_groups/README.md)."""

import contextlib
import io
import json
import math
import re
import shutil
import warnings

import tyro

from llm.config import GRPOConfig, from_trl
from tests.helpers import ROOT

BEFORE = ROOT / "tests" / "data" / "before_groups"
#: Options added since the snapshot (each with a default that keeps the earlier behaviour): they come on top of the
#: saved flags and configs.
ADDED_FIELDS = {"padding_free": False, "use_transformers_continuous_batching": False, "improvement_lcb_weight_cap": 2.0,
                "rollout_rs_threshold": 0.5 * math.log(2.0) ** 2,
                "tools": [], "environment_factory": [], "max_tool_calling_iterations": None, "tool_timeout": 10.0,
                "max_tool_response_length": 256, "chat_template_path": "", "cache_implementation": None,
                "token_budget": 0, "exact_j_steps": 1, "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05,
                "vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0,
                "off_policy_mask_threshold": None, "clip_ratio_c": 10000.0,
                "ess_scaling": "none", "ess_scaling_base_ess_ratio": 1.0, "grad_baselining": False,
                "grad_baselining_scope": "group", "grad_baselining_use_is_weights": True,
                "grad_baselining_normalize_by_length": False}
ADDED_FLAGS = {f"--{p}{name.replace('_', '-')}" for name, default in ADDED_FIELDS.items()
               for p in (("", "no-") if isinstance(default, bool) else ("",))} | {"--reward-range"}
#: Defaults changed since the snapshot: field -> (then, now). The certificate's bound is now the betting bound, whose
#: level is a theorem (docs/theory.md, §8.6); a run directory written with the old default still resumes.
#: Defaults changed since the snapshot: (then, now), where a case did not give the option. epsilon_high and
#: num_generations_eval hold TRL's None since 2026-12-07 (before: -1 for epsilon, 8 whatever num_generations was).
CHANGED_DEFAULTS = {"improvement_lcb_method": ("cantelli", "betting"), "epsilon_high": (-1.0, None),
                    "num_generations_eval": (8, None)}


def option_strings() -> set[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # tyro 1.0 keeps get_parser, deprecated
        parser = tyro.extras.get_parser(GRPOConfig)
    return {s for action in parser._actions for s in action.option_strings}


def help_flags() -> set[str]:
    """The options ``python -m llm.train --help`` prints at the start of its lines (``--sync-period INT``,
    ``--use-peft, --no-use-peft``)."""
    from llm.commands.train import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(["--help"])
    first = re.compile(r"^[│\s]*((?:-{1,2}[a-z0-9][a-z0-9-]*)(?:, -{1,2}[a-z0-9][a-z0-9-]*)*),?(?:\s|$)")  # a pair may wrap after its comma
    return {flag for line in out.getvalue().splitlines() if (m := first.match(line)) for flag in m.group(1).split(", ")}


def test_the_command_line_offers_exactly_the_flags_it_offered_before():
    before = set(BEFORE.joinpath("train_flags.txt").read_text().split())
    assert len(before) == 134
    for now in (option_strings(), help_flags()):  # the parser's, and what --help prints
        assert sorted(now - before) == sorted(ADDED_FLAGS) and sorted(before - now) == []


def test_from_trl_gives_the_configs_it_gave_before():
    cases = json.loads(BEFORE.joinpath("from_trl.json").read_text())
    assert len(cases) == 3
    for name, case in cases.items():
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in case["kwargs"].items()}
        got = json.loads(from_trl(**kwargs).to_json())
        assert {k: got.pop(k) for k in ADDED_FIELDS} == ADDED_FIELDS, name  # the new options at their defaults
        assert got.pop("reward_range") is None, name  # config.json records what was said (none was)
        want = dict(case["config"])
        if kwargs.get("max_completion_length") is None:  # the snapshot recorded the task's budget it resolved
            assert got["max_completion_length"] is None, name
            assert from_trl(**kwargs).completion_budget == want["max_completion_length"], name
            want["max_completion_length"] = None
        for k, (then, now) in CHANGED_DEFAULTS.items():
            if kwargs.get(k) is not None:
                continue
            assert want[k] == then and got[k] == now, name
            want[k] = now
        assert got == want, name


def test_a_run_directory_written_before_resumes(tmp_path, monkeypatch):
    from llm.run.trainer import train

    monkeypatch.chdir(ROOT)  # the run's model path is relative to the repository
    run = tmp_path / "run"
    shutil.copytree(BEFORE / "run", run)
    old_rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    config = GRPOConfig.from_json_file(run / "config.json").replace(output_dir=str(run), max_steps=4)
    train(config, log=lambda *a, **k: None)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[:2] == old_rows  # the steps before the checkpoint are kept as they were written
    assert rows[2]["lag"] == 0 and rows[3]["lag"] == 1  # v = 2: synced at step 2, from the checkpoint's clock
