"""The training config: ``GRPOConfig``, composed of groups by what consumes them (``llm.config.grpo``), with TRL's
names accepted (``llm.config.trl``, ``trl_names``, ``trl_messages``)."""

from llm.config.agent import AgentConfig
from llm.config.algorithm import ObjectiveConfig, OptimConfig, SyncConfig
from llm.config.fields import MAX_TEMPERATURE, MIN_TEMPERATURE
from llm.config.grpo import FIELD_GROUP, GROUPS, RESUMABLE_FIELDS, GRPOConfig, flat_fields
from llm.config.machinery import MachineConfig, SamplingConfig
from llm.config.model import DataConfig, ModelConfig
from llm.config.observation import DiagnosticsConfig, EvaluationConfig, OutputConfig
from llm.config.trl import TRL_NAMES, TRL_REF_MODEL_SYNC_STEPS, TRL_SWITCHES, from_trl, translate_trl_args

__all__ = ["GRPOConfig", "GROUPS", "FIELD_GROUP", "RESUMABLE_FIELDS", "flat_fields", "ModelConfig", "DataConfig",
           "SyncConfig", "ObjectiveConfig", "OptimConfig", "SamplingConfig", "MachineConfig", "DiagnosticsConfig",
           "EvaluationConfig", "OutputConfig", "AgentConfig", "MIN_TEMPERATURE", "MAX_TEMPERATURE", "TRL_NAMES", "TRL_SWITCHES",
           "TRL_REF_MODEL_SYNC_STEPS", "from_trl", "translate_trl_args"]
