"""The one training config of off-policy GRPO (Algorithm 1, docs/theory.md §7), in groups by what consumes them.

Field names follow TRL's GRPOConfig where the concept is the same; new concepts carry their paper symbol in the
docstring. Every bad value raises ``ValueError("<field>: <reason>")``: each group checks its own fields, and
``GRPOConfig`` the few rules that span groups. The command line, ``from_trl``, config.json and the constructor stay
flat (``GRPOConfig(learning_rate=1e-5)``, ``config.learning_rate``); the trainer's parts read their group
(``config.optim.learning_rate``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import tyro
from pydantic import Field, model_validator
from pydantic.fields import FieldInfo

from llm.config.agent import AgentConfig
from llm.config.algorithm import ObjectiveConfig, OptimConfig, SyncConfig
from llm.config.fields import Options, is_resumable, nearest_name, require, resumable
from llm.config.machinery import MachineConfig, SamplingConfig
from llm.config.model import DataConfig, ModelConfig
from llm.config.observation import DiagnosticsConfig, EvaluationConfig, OutputConfig

#: The completion budget of a task when ``max_completion_length`` is None: the built-in agent task's episodes need
#: 34 tokens (a call, the tool's answer, the answer), every other task gets the built-in task's 6.
TASK_COMPLETION_LENGTHS = {"arithmetic_tools": 40}
DEFAULT_COMPLETION_LENGTH = 6


def completion_budget(dataset: str, max_completion_length: int | None) -> int:
    """The most tokens a completion may have: ``max_completion_length`` when given, else the task's own budget. The
    one place this is decided; the config stores what was said (None stays None) and reads this on demand."""
    if max_completion_length is not None:
        return max_completion_length
    return TASK_COMPLETION_LENGTHS.get(dataset, DEFAULT_COMPLETION_LENGTH)

#: The groups, by the attribute that holds each; the command line shows their fields without a prefix.
GROUPS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "sync": SyncConfig, "objective": ObjectiveConfig,
                           "optim": OptimConfig, "sampling": SamplingConfig, "machine": MachineConfig,
                           "diagnostics": DiagnosticsConfig, "evaluation": EvaluationConfig, "output": OutputConfig,
                           "agent": AgentConfig}


def _group(cls):
    return Field(default_factory=cls)


class GRPOConfig(Options):
    """Off-policy GRPO (Mroueh et al., arXiv 2505.22257) on a causal language model."""

    max_steps: int = resumable(100)
    """Number of training steps k."""
    seed: int = 0
    """Seeds prompt order, sampling and initialisation."""

    model: Annotated[ModelConfig, tyro.conf.OmitArgPrefixes] = _group(ModelConfig)
    data: Annotated[DataConfig, tyro.conf.OmitArgPrefixes] = _group(DataConfig)
    sync: Annotated[SyncConfig, tyro.conf.OmitArgPrefixes] = _group(SyncConfig)
    objective: Annotated[ObjectiveConfig, tyro.conf.OmitArgPrefixes] = _group(ObjectiveConfig)
    optim: Annotated[OptimConfig, tyro.conf.OmitArgPrefixes] = _group(OptimConfig)
    sampling: Annotated[SamplingConfig, tyro.conf.OmitArgPrefixes] = _group(SamplingConfig)
    machine: Annotated[MachineConfig, tyro.conf.OmitArgPrefixes] = _group(MachineConfig)
    diagnostics: Annotated[DiagnosticsConfig, tyro.conf.OmitArgPrefixes] = _group(DiagnosticsConfig)
    evaluation: Annotated[EvaluationConfig, tyro.conf.OmitArgPrefixes] = _group(EvaluationConfig)
    output: Annotated[OutputConfig, tyro.conf.OmitArgPrefixes] = _group(OutputConfig)
    agent: Annotated[AgentConfig, tyro.conf.OmitArgPrefixes] = _group(AgentConfig)

    # Built from groups (``optim=OptimConfig(...)`` or a dict of its fields), flat fields (``learning_rate=1e-5``,
    # TRL's habit) or both: a flat field replaces its value in the group given beside it.
    @classmethod
    def option_names(cls) -> list[str]:
        """The names a keyword may have: GRPOConfig's own fields and every group's, flat."""
        return [*TOP_FIELDS, *FIELD_GROUP]

    @model_validator(mode="before")
    @classmethod
    def _flat_names(cls, given):
        """Each flat name into its group: the group's dict of what was said to it before (a group object's
        ``model_fields_set``) and the flat names beside it, which pydantic then validates as the group. An unknown
        name is left for pydantic to refuse (``extra="forbid"``)."""
        if not isinstance(given, dict):
            return given
        out, flat = {}, {name: {} for name in GROUPS}
        for name, value in given.items():
            if name in FIELD_GROUP:
                flat[FIELD_GROUP[name]][name] = value
            else:
                out[name] = value
        for name, group in GROUPS.items():
            base = out.get(name)
            if flat[name] and (base is None or isinstance(base, (dict, group))):
                said = {k: getattr(base, k) for k in base.model_fields_set} if isinstance(base, group) else base
                out[name] = {**(said or {}), **flat[name]}
        return out

    def __getattr__(self, name: str):
        """A group's field or property by its flat name (``config.learning_rate`` is ``config.optim.learning_rate``)."""
        owner = FIELD_GROUP.get(name) or GROUP_PROPERTIES.get(name)
        if owner is None:
            return super().__getattr__(name)
        return getattr(getattr(self, owner), name)

    def __setattr__(self, name: str, value) -> None:
        """TRL's habit of setting ``args.x = ...``: the config is rebuilt with the change (a flat name in its group, a
        field of GRPOConfig itself, or a whole group) and validated as a new one; a refused value leaves the config as
        it was. The groups are frozen: a group held elsewhere keeps what it said. An unknown name, or a derived value,
        raises AttributeError."""
        if name not in TOP_FIELDS and name not in GROUPS and name not in FIELD_GROUP:
            known = [*TOP_FIELDS, *FIELD_GROUP]
            derived = name in GROUP_PROPERTIES or isinstance(getattr(type(self), name, None), property)
            raise AttributeError(f"GRPOConfig: {name!r} " + ("is derived from the fields, not set" if derived else
                                                           f"is not an option{nearest_name(name, known)}"))
        new = self.replace(**{name: value})
        self.__dict__.update(new.__dict__)
        object.__setattr__(self, "__pydantic_fields_set__", set(new.model_fields_set))

    def __dir__(self):
        return sorted({*super().__dir__(), *FIELD_GROUP, *GROUP_PROPERTIES})

    def model_copy(self, *, update=None, deep: bool = False) -> "GRPOConfig":
        """A copy (the groups are frozen, so shared); with ``update`` (flat names or groups, as ``replace``) a new
        config validated as one, where pydantic's own would store the names unvalidated beside their groups."""
        return self.replace(**update) if update else super().model_copy(deep=deep)

    @model_validator(mode="after")
    def _across_groups(self):
        """The rules that tie two groups together."""
        require(self, self.max_steps >= 1, "max_steps", "must be >= 1")
        require(self, 0 <= self.seed < 2**63, "seed",
                "must lie in [0, 2**63) (numpy's generators take non-negative seeds, torch's a 64-bit integer)")
        require(self, not (self.machine.fsdp and self.model.use_peft), "fsdp",
                "shards whole weights; LoRA's adapters are small enough for data parallel: drop one of --fsdp and "
                "--use-peft")
        require(self, self.data.soft_punish_cache <= self.completion_budget, "soft_punish_cache",
                f"must lie in [0, max_completion_length = {self.completion_budget}]")
        require(self, not (self.sampling.filter_groups and self.sync.async_generation), "filter_groups",
                "draws more rounds from alpha during the step, while asynchronous generation's sampler already holds "
                "the next window's weights; drop one of --filter-groups and --async-generation")
        require(self, not (self.agent.environment_factory and self.data.dataset == "arithmetic_tools"),
                "environment_factory", "the built-in task arithmetic_tools has its own tool and reward; give its tools "
                "with --tools, or an environment with your own --dataset")
        require(self, self.data.dataset != "none" or bool(self.agent.environment_factory), "dataset",
                "'none' means the environment owns the data (its reset() returns each prompt); give "
                "--environment-factory, or a data set")
        require(self, self.data.dataset != "none" or not self.diagnostics.heldout_prompts, "heldout_prompts",
                "with --dataset none the environment owns the data: held-out episodes would take pooled instances "
                "that replay the questions the training episodes draw, so no held-out estimate or certificate would be "
                "independent of training; give a data set, or --heldout-prompts 0")
        require(self, not (self.agent.chat_template_path and self.data.dataset == "arithmetic_tools"
                           and not self.model.model_name_or_path), "chat_template_path",
                "the built-in agent model knows its own template only; drop it or give --model-name-or-path")
        require(self, not (self.sampling.filter_groups and (self.agent.enabled or self.data.dataset == "arithmetic_tools")),
                "filter_groups", "dynamic sampling with tools is not supported yet; drop --filter-groups")
        require(self, self.sync.sync_policy != "divergence" or self.diagnostics.heldout_prompts > 0, "sync_policy",
                "divergence decides from the held-out TV estimate; add --heldout-prompts (e.g. 8)")
        return self

    # ---- derived values that span groups (computed on demand, never stored: the run's plan records them) ----------
    @property
    def completion_budget(self) -> int:
        """The most tokens a completion may have (``completion_budget``): ``max_completion_length``, or the task's."""
        return completion_budget(self.data.dataset, self.sampling.max_completion_length)

    @property
    def micro_batch_size(self) -> int:
        """Completions per pass: ``per_device_train_batch_size``, or the whole step when it is 0."""
        return self.machine.per_device_train_batch_size or self.sampling.completions_per_step

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per optimiser step (TRL's name): ceil(P x G / per_device_train_batch_size). With
        ``group_by_length`` a step may run more, shorter passes (never longer ones)."""
        return -(-self.sampling.completions_per_step // self.micro_batch_size)

    @property
    def num_syncs(self) -> int:
        """Weight copies into the sampler over the run with the fixed policy (one at every step k with k % v == 0;
        the divergence policy's count is known only at the end)."""
        return -(-self.max_steps // self.sync.sync_period)

    # ---- flat views: config.json, replace ---------------------------------------------------------
    def to_dict(self) -> dict:
        """Every field by its flat name (config.json's keys; the values the run derives from them are its plan's,
        ``llm.run.plan``). ``model_dump`` gives the same by group."""
        out = {name: getattr(self, name) for name in TOP_FIELDS}
        for name in GROUPS:
            out.update(dict(getattr(self, name)))
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json_file(cls, path: str | Path) -> "GRPOConfig":
        """The config a config.json holds (flat, or by group as ``model_dump`` writes it); a file that is not one is
        a ValueError naming the file (a field missing from it takes its default: a field added after the file was
        written)."""
        try:
            stored = json.loads(Path(path).read_text())
            if not isinstance(stored, dict):
                raise ValueError(f"holds a JSON {type(stored).__name__}, not an object of options")
            return cls(**stored)
        except (TypeError, ValueError) as exc:  # json's errors, a field's value, an unknown name
            raise ValueError(f"{path}: {exc}") from None

    def replace(self, **changes) -> "GRPOConfig":
        """A new config with ``changes`` (flat fields or whole groups), validated as one; what was said before
        (``model_fields_set``, each group's too) stays said."""
        return GRPOConfig(**{**{name: getattr(self, name) for name in self.model_fields_set}, **changes})


#: The fields GRPOConfig holds itself (the run's length and seed), by name.
TOP_FIELDS = {name: info for name, info in GRPOConfig.model_fields.items() if name not in GROUPS}
#: Each group's field -> the group that holds it.
FIELD_GROUP = {name: group for group, cls in GROUPS.items() for name in cls.model_fields}
#: Each group's derived value (a property) -> the group that holds it.
GROUP_PROPERTIES = {name: group for group, cls in GROUPS.items() for name, value in vars(cls).items()
                    if isinstance(value, property)}


def flat_fields() -> list[tuple[str, str, FieldInfo]]:
    """(group, name, pydantic's FieldInfo) for every option, in the order of ``--help``: GRPOConfig's own (group ""),
    then each group's."""
    return [("", name, info) for name, info in TOP_FIELDS.items()] + [
        (group, name, info) for group, cls in GROUPS.items() for name, info in cls.model_fields.items()]


#: Fields that may change when a run resumes (``resumable`` beside each field).
RESUMABLE_FIELDS = {name for _, name, info in flat_fields() if is_resumable(info)}
