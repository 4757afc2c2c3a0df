"""The model and the data: what is trained, on which prompts, rewarded how."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import field_validator, model_validator

from llm.config.fields import ConfigGroup, none_reads, require, resumable
from llm.config.user_code import as_specs, spec_validator


class ModelConfig(ConfigGroup):
    """The policy's weights: where they come from, and which of them train."""

    model_name_or_path: str = ""
    """Local model directory, hub name, or a .gguf file (or a directory holding one; converted once to a cached
    model directory, see llm.models.pretrained). Empty: the built-in tiny Qwen2 (shipped in the package), or with
    --tools, --environment-factory or --dataset arithmetic_tools the built-in agent model (its format:
    docs/agents.md)."""
    trust_remote_code: bool = resumable(False)
    """Let transformers and vLLM run the Python code a model directory or hub repository ships (its own
    architecture). Off: only architectures transformers and vLLM implement load."""
    use_peft: bool = False
    """Train LoRA adapters (``peft``, TRL's name for the switch) instead of every weight: the sampler, alpha and
    pi_ref get the merged weights W + (lora_alpha / r) B A, final_model/ holds the adapters. Needs the lora extra."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: float = 32.0
    """LoRA scale numerator: the update is (lora_alpha / lora_r) B A."""
    lora_target_modules: tuple[str, ...] = ("all-linear",)
    """Modules given adapters: 'all-linear' (every linear layer but the output layer) or module names
    (e.g. q_proj v_proj). LoRA dropout is always 0: pi/alpha needs the same log-probs from every pass."""

    @model_validator(mode="after")
    def _rules(self):
        require(self, self.lora_r >= 1, "lora_r", "must be >= 1")
        require(self, self.lora_alpha > 0, "lora_alpha", "must be > 0")
        require(self, len(self.lora_target_modules) >= 1 and all(self.lora_target_modules), "lora_target_modules",
                "needs 'all-linear' or module names")
        return self


class DataConfig(ConfigGroup):
    """The prompts, their test split and their rewards."""

    dataset: str = "arithmetic"
    """'arithmetic' (built in, with its own train/test split), 'arithmetic_tools' (the built-in agent task), 'none'
    (TRL's train_dataset=None: the --environment-factory's reset() returns every prompt), 'reasoning_gym:<name>' (a procedural generator of the
    reasoning-gym package, e.g. reasoning_gym:basic_arithmetic, scored by its own checker; options below), or data in TRL's format read with ``datasets``: a
    .json/.jsonl/.parquet/.csv file, a directory written by save_to_disk (its 'train' split), or 'hf:<name>'. Rows
    have a 'prompt' (a string, or a list of messages rendered with the chat template), an optional 'answer' (the
    default reward's reference) and any other columns (passed to --reward-funcs by name); GSM8K's rows (question,
    answer ending in '#### N') are mapped onto it."""
    generator_kwargs: tuple[str, ...] = ()
    """Options of a procedural generator (``--dataset reasoning_gym:<name>``) as key=value, values read as Python
    literals: ``--generator-kwargs min_terms=2 max_terms=2 max_digits=1`` (the generator's own option names)."""
    generator_train_size: int = 1000
    """Training prompts drawn from a procedural generator (fewer when its problem space is smaller)."""
    generator_test_size: int = 100
    """Test prompts drawn from a procedural generator, none of them a training prompt."""
    generator_seed: int = 0
    """Seed of the procedural generator's entries and of their train/test split (independent of ``seed``, so runs
    with different seeds share one split)."""
    generator_instruction: str = "Reply with the final answer only."
    """Appended to every question of a procedural generator, on its own line."""
    eval_dataset: str = ""
    """Test prompts for a data set other than the built-in one, in the same formats ('test' split of a saved
    DatasetDict or a hub data set)."""
    reward_fn: str = ""
    """Optional reward as 'module:function' mapping (completion, answer) to [0, 1]; default: the task's own."""
    answer_check: Literal["math_verify", "last_number"] = "math_verify"
    """The GSM8K-format reward: math_verify (1 iff math-verify finds the completion's answer equal to the one after
    '####': '1,000' = '1000', '\\frac{1}{2}' = '0.5') or last_number (1 iff the completion's last number equals
    it). The built-in task keeps its own token-level reward."""
    reward_funcs: tuple[str, ...] = ()
    """Reward functions with TRL's signature, as 'module:function' (several allowed): f(prompts, completions,
    completion_ids, **columns) -> list[float | None], called once per batch with the data's columns (answer among
    them) and, for conversational data, TRL's message lists as prompts and completions; each is logged as
    ``rewards/<function>/mean|std``; an async one is awaited. The reward is their weighted sum (None counts as 0; a
    completion every source gives None stops the run), any finite number; its range is declared with --reward-range
    (a function with TRL's signature declares none). Replaces the task's own reward; excludes ``reward_fn``."""
    reward_weights: Annotated[tuple[float, ...], none_reads(())] = ()
    """One weight per reward function (TRL's name); empty: 1 each."""
    reward_range: tuple[float, float] | None = None
    """LOW HIGH: the range of the total reward, declared before the first step (``--reward-range 0 1``). Theorem 1's
    terms and the certificates read it; a reward outside it stops the run at that step in one line. None: the
    sources' own range when each has one (text rewards and the built-in tasks [0, 1], soft_overlong_punishment
    [-1, 0], weighted sums of them; plan.json records it), else none: reward functions with TRL's signature,
    reward models and environments declare nothing, so their runs train as usual, Theorem 1's terms use the range
    seen (no guarantee) and the certificates abstain (nan). It never widens from the rewards seen. A declaration
    that does not hold the sources' own range is refused when the run starts (its plan, plan.json)."""
    soft_punish_cache: int = 0
    """L_cache of the built-in reward ``soft_overlong_punishment`` (DAPO's soft overlong punishment; TRL's
    ``get_soft_overlong_punishment`` argument): completions longer than max_completion_length - L_cache lose up to 1
    linearly. Needed (> 0) when that reward is listed in ``reward_funcs``."""
    chat_template: bool = False
    """Render every text prompt (training, held-out and test) as one user message with the tokenizer's chat
    template and its generation prompt, as an instruct model expects; the built-in tiny model has no template and
    takes the prompts as they are (the default). Conversational prompts always go through the template. A
    tokenizer without a template is refused at start-up."""

    @field_validator("dataset", mode="before")
    @classmethod
    def _no_dataset(cls, value):
        return "none" if value is None else value  # TRL's train_dataset=None: the environment owns the data

    # TRL's trainer takes the reward functions themselves: kept here by text (config.json)
    _reward_specs = spec_validator("reward_funcs")

    @field_validator("reward_fn", mode="before")
    @classmethod
    def _reward_fn_spec(cls, value):
        return as_specs(value, "reward_fn")[0] if callable(value) else value

    @field_validator("reward_range", mode="before")
    @classmethod
    def _range_floats(cls, value):
        if isinstance(value, (list, tuple)) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                    for x in value):
            return tuple(float(x) for x in value)
        return value

    @model_validator(mode="after")
    def _rules(self):
        require(self, self.generator_train_size >= 1, "generator_train_size", "must be >= 1")
        require(self, self.generator_test_size >= 0, "generator_test_size", "must be >= 0")
        require(self, self.generator_seed >= 0, "generator_seed", "must be >= 0")
        require(self, not self.generator_kwargs or self.dataset.startswith("reasoning_gym:"), "generator_kwargs",
                "apply to --dataset reasoning_gym:<name> only")
        require(self, not (self.reward_fn and self.reward_funcs), "reward_funcs",
                "give either --reward-fn (one completion at a time) or --reward-funcs, not both")
        require(self, not self.reward_weights or len(self.reward_weights) == len(self.reward_funcs), "reward_weights",
                f"needs one weight per reward function ({len(self.reward_funcs)})")
        if self.reward_range is not None:
            require(self, self.reward_range[0] < self.reward_range[1], "reward_range",
                    "must be two finite numbers LOW < HIGH")
        require(self, self.soft_punish_cache >= 0, "soft_punish_cache", "must be >= 0")
        require(self, self.soft_punish_cache > 0 or "soft_overlong_punishment" not in self.reward_funcs,
                "soft_punish_cache", "soft_overlong_punishment needs it > 0 (the length over which the penalty grows)")
        return self
