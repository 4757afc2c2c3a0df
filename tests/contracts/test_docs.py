"""The repository explains itself: every reference to the theory document names a section that exists, every docs
page is reachable from the README, and nothing cites a file that is not in the repository."""

import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

THEORY = ROOT / "docs" / "theory.md"


SOURCES = [p for d in ("grpo_theory", "llm", "runkit", "benchmarks", "figures", "tests") for p in (ROOT / d).rglob("*.py")]


DOCS = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]


#: "docs/theory.md, §3", "docs/theory.md §3", "docs/theory.md, §1-§6", "§2, §5, §6" after a theory.md mention.
REFERENCE = re.compile(r"docs/theory\.md,?\s*((?:§\d+(?:\.\d+)?(?:\s*(?:-|,|and)\s*)?)+)")


def sections() -> set[str]:
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.", THEORY.read_text(), flags=re.M))


def references(text: str) -> list[str]:
    found = []
    for group in REFERENCE.findall(text):
        nums = re.findall(r"§(\d+(?:\.\d+)?)", group)
        found += nums
        for a, b in re.findall(r"§(\d+)\s*-\s*§(\d+)", group):
            found += [str(n) for n in range(int(a), int(b) + 1)]
    return found


def test_every_theory_reference_resolves():
    have = sections()
    assert {"1", "3", "6", "8"} <= have
    missing, n = [], 0
    for path in SOURCES + DOCS:
        for num in references(path.read_text()):
            n += 1
            if num not in have:
                missing.append(f"{path.relative_to(ROOT)}: §{num}")
    assert n >= 15, "docstrings should cite the theory document"
    assert not missing, missing


def test_reference_parser_sees_ranges_and_lists():
    assert references("see docs/theory.md, §1-§3 and docs/theory.md §8") == ["1", "3", "1", "2", "3", "8"]


#: A cited file of the repository's code, with an optional ``:function`` (``tests/llm/test_loss.py:test_x``). A
#: citation may break across a line inside its backticks only at the colon; none does.
CITED = re.compile(r"\b((?:tests|llm|grpo_theory|runkit|benchmarks|figures|notebooks)/[\w/]*\.py)(?::(\w+))?")


def cited_files(text: str) -> list[tuple[str, str]]:
    """(path, function or '') of every repository file the text cites."""
    return CITED.findall(text)


def broken_citations(paths) -> list[str]:
    """Each citation in ``paths`` whose file does not exist, or whose function or class that file does not define,
    or (``file.py:123``, as pytest prints) whose line the file does not have."""
    broken = []
    for path in paths:
        for file, name in cited_files(path.read_text()):
            target = ROOT / file
            if not target.is_file():
                broken.append(f"{path.relative_to(ROOT)}: {file} (no such file)")
            elif name.isdigit():
                if int(name) > len(target.read_text().splitlines()):
                    broken.append(f"{path.relative_to(ROOT)}: {file}:{name} (no such line)")
            elif name and not re.search(rf"^\s*(?:async )?(?:def|class) {name}\b", target.read_text(), flags=re.M):
                broken.append(f"{path.relative_to(ROOT)}: {file}:{name} (no such function)")
    return broken


def test_every_cited_test_file_and_function_exists():
    """Docs, docstrings and comments cite tests and modules by path (``tests/theory/test_estimators.py``, with
    ``:function`` where one test is meant); every one must resolve. Files move; this catches the citation left
    behind."""
    paths = [p for p in SOURCES + DOCS if p != Path(__file__).resolve()]  # this file's examples are broken on purpose
    assert sum(len(cited_files(p.read_text())) for p in paths) >= 30
    assert not broken_citations(paths)


def test_the_citation_check_fails_on_a_missing_file_or_function(tmp_path):
    page = ROOT / "docs" / "_citations_probe.md"
    try:
        page.write_text("see `tests/test_theorem1.py` and `tests/theory/test_theorem1.py:test_no_such_thing` and "
                        "`tests/theory/test_theorem1.py:test_surrogate_identity`, lines `tests/theory/test_theorem1.py:2` "
                        "and `tests/theory/test_theorem1.py:99999`")
        assert broken_citations([page]) == [
            "docs/_citations_probe.md: tests/test_theorem1.py (no such file)",
            "docs/_citations_probe.md: tests/theory/test_theorem1.py:test_no_such_thing (no such function)",
            "docs/_citations_probe.md: tests/theory/test_theorem1.py:99999 (no such line)"]
    finally:
        page.unlink()


def test_no_reference_to_files_outside_the_repository():
    for path in SOURCES + DOCS:
        if path == Path(__file__).resolve():
            continue
        text = path.read_text()
        assert "PAPER.md" not in text and "DESIGN.md" not in text and "../shared" not in text, path


#: ``[text](target)`` with a relative target (no scheme), optionally ``#anchor``.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_slug_matches_githubs_rule():
    assert slug("A real model: `make run-real`") == "a-real-model-make-run-real"
    assert slug("8.2 TV(pi_k, alpha), unbiased") == "82-tvpi_k-alpha-unbiased"


def test_every_relative_link_and_anchor_resolves():
    broken, n = [], 0
    for path in DOCS:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            n += 1
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert n >= 30
    assert not broken, broken


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(readme)}
    unlinked = [p.name for p in (ROOT / "docs").glob("*.md") if p.name not in linked]
    assert not unlinked, unlinked


def test_the_readme_stays_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert readme.count("\n") <= 200
    first_block = re.search(r"```bash\n(.*?)```", readme, flags=re.S).group(1)
    assert [line.split()[:2] for line in first_block.strip().splitlines()] == [["make", "run"], ["make", "test"]]
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1].strip() == "make test"


def test_the_options_page_is_the_config():
    from llm.commands.options import documented_fields, markdown

    assert (ROOT / "docs" / "options.md").read_text() == markdown(), "rerun: python -m llm options > docs/options.md"
    from llm.config import flat_fields

    documented = [name for _, name, doc in documented_fields() if doc]
    assert documented == [name for _, name, _ in flat_fields()], "every field has a docstring"
    # 114, the agent group (tools, ... chat_template_path), reward_range, cache_implementation, token_budget,
    # exact_j_steps
    assert len(documented) == 138


def test_the_readme_python_example_runs_and_says_what_it_prints(capsys):
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", readme, flags=re.S).group(1)
    exec(compile(block, "README.md", "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert abs(float(lines[1]) - 0.4) < 1e-12  # the comment's "0.4 = J(pi) - J(pi_k)"


#: The fields of TRL 1.16's GRPOConfig and those its base config overrides, read from trl/trainer/grpo_config.py and
#: base_config.py of the trl==1.16.0 wheel (``pip download --no-deps trl==1.16.0``, the dataclass fields in order).
TRL_116_FIELDS = """learning_rate model_init_kwargs trust_remote_code router_aux_loss_coef disable_dropout cast_lm_head_to_fp32
remove_unused_columns num_generations num_generations_eval max_completion_length ds3_gather_for_generation
shuffle_dataset pad_to_multiple_of generation_batch_size steps_per_generation temperature top_p top_k min_p
generation_kwargs chat_template_kwargs repetition_penalty cache_implementation use_vllm vllm_mode vllm_model_impl
vllm_enable_sleep_mode vllm_structured_outputs_regex vllm_server_base_url vllm_server_host vllm_server_port
vllm_server_timeout vllm_group_port vllm_gpu_memory_utilization vllm_max_model_length vllm_tensor_parallel_size beta
num_iterations epsilon delta epsilon_high sapo_temperature_neg sapo_temperature_pos vespo_k_pos vespo_lambda_pos
vespo_k_neg vespo_lambda_neg importance_sampling_level reward_weights multi_objective_aggregation scale_rewards
loss_type mask_truncated_completions sync_ref_model ref_model_mixup_alpha ref_model_sync_steps top_entropy_quantile
entropy_coef use_adaptive_entropy entropy_coef_min entropy_coef_max entropy_coef_delta entropy_target
max_tool_calling_iterations vllm_importance_sampling_correction vllm_importance_sampling_mode
vllm_importance_sampling_clip_max vllm_importance_sampling_clip_min off_policy_mask_threshold use_bias_correction_kl
log_completions log_multimodal num_completions_to_print log_unique_prompts log_completions_hub_repo
use_transformers_continuous_batching transformers_continuous_batching_config use_transformers_paged
vllm_importance_sampling_cap logging_steps gradient_checkpointing bf16 lr_scheduler_kwargs use_liger_kernel
torch_empty_cache_steps""".split()


def test_the_trl_page_has_a_row_for_every_field_of_trls_grpo_config():
    rows = [line.split("|")[1] for line in (ROOT / "docs" / "trl.md").read_text().splitlines()
            if line.startswith("| `")]
    named = {name for cell in rows for name in re.findall(r"`(\w+)`", cell)}
    assert len(TRL_116_FIELDS) == 85
    assert not [f for f in TRL_116_FIELDS if f not in named]


def test_trls_names_on_the_command_line_become_the_projects():
    from llm.config import from_trl, translate_trl_args

    argv = translate_trl_args(["--max-steps", "3", "--vllm-importance-sampling-mode", "token_mask",
                               "--vllm-importance-sampling-clip-min=0.5", "--vllm-importance-sampling-clip-max", "5",
                               "--importance-sampling-level", "sequence", "--bf16", "--sync-ref-model",
                               "--ref-model-sync-steps", "64", "--use-vllm", "--vllm-mode", "server",
                               "--entropy-coeff", "0.01"])
    assert argv[:2] == ["--max-steps", "3"]
    pairs = dict(zip(argv[2::2], argv[3::2]))
    assert pairs == {"--importance-sampling-mode": "token_mask", "--importance-sampling-cap-min": "0.5",
                     "--importance-sampling-cap": "5", "--ratio-level": "sequence_normalised", "--dtype": "bfloat16",
                     "--ref-sync-steps": "64", "--sampler": "server", "--entropy-coef": "0.01"}
    cfg = from_trl(vllm_importance_sampling_mode="token_mask", bf16=True, sync_ref_model=True, use_vllm=False,
                   loss_type="grpo", importance_sampling_level="sequence")
    assert (cfg.importance_sampling_mode, cfg.dtype, cfg.ref_sync_steps, cfg.sampler, cfg.ratio_level) == (
        "token_mask", "bfloat16", 512, "transformers", "sequence_normalised")
    with pytest.raises(ValueError, match="^importance_sampling_level: expected one of token, sequence"):
        translate_trl_args(["--importance-sampling-level", "word"])
    with pytest.raises(ValueError, match="^ref_model_sync_steps: TRL applies it only with sync_ref_model"):
        from_trl(ref_model_sync_steps=8)
    with pytest.raises(ValueError, match="^dtype: given both"):
        from_trl(bf16=True, dtype="float32")
