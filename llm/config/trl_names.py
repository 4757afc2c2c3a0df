"""TRL's and verl's option names and what they are here: the tables ``llm.config.trl`` translates with and
``llm.config.trl_messages`` speaks from."""

from __future__ import annotations


#: TRL 1.16 names (and verl's where TRL has none) accepted for this config's fields, on the command line
#: (``translate_trl_args``) and in ``llm.config.from_trl``: name -> (field, {their value: ours} or None).
TRL_NAMES: dict[str, tuple[str, dict | None]] = {
    "vllm_importance_sampling_mode": ("importance_sampling_mode", None),
    "vllm_importance_sampling_clip_max": ("importance_sampling_cap", None),
    "vllm_importance_sampling_cap": ("importance_sampling_cap", None),  # TRL's name before 1.16
    "vllm_importance_sampling_clip_min": ("importance_sampling_cap_min", None),
    "importance_sampling_level": ("ratio_level", {"token": "token", "sequence": "sequence_normalised"}),
    "ref_model_sync_steps": ("ref_sync_steps", None),
    "vllm_server_base_url": ("server_url", None),
    "vllm_server_timeout": ("server_timeout", None),
    "vllm_mode": ("sampler", {"colocate": "vllm", "server": "server"}),
    "entropy_coeff": ("entropy_coef", None),  # verl's
    "clip_ratio": ("epsilon", None),  # verl's (with DPPO, the divergence threshold)
    "clip_ratio_low": ("epsilon", None),  # verl's
    "clip_ratio_high": ("epsilon_high", None),  # verl's
}
#: TRL's switches: name -> (field, value when on, value when off).
TRL_SWITCHES: dict[str, tuple[str, str | bool, str | bool | None]] = {
    "bf16": ("dtype", "bfloat16", "float32"),
    "use_vllm": ("sampler", "vllm", "transformers"),
    "sync_ref_model": ("ref_sync_steps", "", "0"),  # on: ref_model_sync_steps (TRL's default 512)
    "use_transformers_paged": ("use_transformers_continuous_batching", True, False),  # TRL's deprecated alias
    # off: importance_sampling_mode none (PPO's clip of pi/pi_k alone; TRL then ignores its mode); on: the mode given
    "vllm_importance_sampling_correction": ("importance_sampling_mode", "", "none"),
}
#: TRL's None (its default for these fields) where this config writes the same meaning as a value: delta None no
#: two-sided clip, min_p None no floor, num_completions_to_print None all, reward_weights None 1 each, eval_steps None
#: no evaluation (under TRL's default eval_strategy "no"; eval_strategy itself is refused here), vllm_importance_
#: sampling_clip_min None no lower cap, vllm_server_base_url None no URL; vllm_importance_sampling_cap None (the older
#: name's default) is not given. epsilon_high and num_generations_eval hold TRL's None themselves (since 2026-12-07);
#: the fields of the others read None as their value here in GRPOConfig too (``fields.none_reads``, since 2026-12-08).
TRL_NONE = {"delta": 0.0, "min_p": 0.0, "num_completions_to_print": 0, "reward_weights": (), "eval_steps": 0,
            "vllm_importance_sampling_clip_min": 0.0, "vllm_server_base_url": ""}
#: TRL options with no field of their name here, and what does their work here (docs/trl.md's table says more): said
#: instead of the nearest name, which would point at an unrelated option.
TRL_COUNTERPARTS = {
    "num_train_epochs": "none: a run is --max-steps long",
    "model_init_kwargs": "--attn-implementation, and --dtype for torch_dtype",
    "shuffle_dataset": "none: each step always draws its prompts from (seed, step)",
    "generation_batch_size": "--sync-period (one sampler call generates a window's v steps)",
    "steps_per_generation": "--sync-period (one sampler call generates a window's v steps)",
    "generation_kwargs": "none: a sampling option outside the filters would make alpha a distribution the trainer "
                         "does not compute",
    "vllm_server_host": "--server-url http://host:port",
    "vllm_server_port": "--server-url http://host:port",
    "lora_dropout": "none: LoRA dropout is always 0 (the importance weight needs the same log-probs from every pass)",
    "fp16": "none: float16 training is not offered; --dtype float32 (the default) or bfloat16 (TRL's --bf16)",
    "eval_strategy": "--eval-steps N (an evaluation every N steps; 0, the default: none)",
    "gradient_accumulation_steps": "derived, not set: ceil(prompts_per_step x num_generations / "
                                   "--per-device-train-batch-size) micro-batches make one optimiser step (printed at "
                                   "start-up); set --per-device-train-batch-size",
    "repetition_penalty": "none (always 1): the trainer's log-probs would have to reproduce the penalty",
    "vllm_model_impl": "none: vLLM's own implementation",
    "use_liger_kernel": "none: the output layer's own chunked kernel keeps the logits small",
    "disable_dropout": "always: every log-prob is computed in eval mode",
    "log_unique_prompts": "none: every completion is shown, with its prompt",
    "multi_objective_aggregation": "sum_then_normalize (TRL's default) always",
    "vllm_max_model_length": "derived: the longest prompt plus --max-completion-length",
    "ds3_gather_for_generation": "none: DeepSpeed is not used (--fsdp shards with PyTorch's FSDP2)",
    "chat_template_kwargs": "none: --chat-template renders with the template's defaults",
    "lr_scheduler_kwargs": "none: the schedules take no extra arguments",
    "router_aux_loss_coef": "none: no mixture-of-experts auxiliary loss is added",
    "cast_lm_head_to_fp32": "always: the output layer's logits are float32 at least in every pass",
    "remove_unused_columns": "not needed: every column but prompt and completion reaches the reward functions",
    "pad_to_multiple_of": "none: passes are padded to their own longest sequence (--group-by-length)",
    "vllm_structured_outputs_regex": "none: constrained decoding changes alpha",
    "vllm_group_port": "none: the weight-transfer rendezvous takes a free port at --server-sync-address",
    "use_adaptive_entropy": "none: the entropy bonus's coefficient is fixed",
    "log_multimodal": "none: text only",
    "log_completions_hub_repo": "none: nothing is uploaded",
    "transformers_continuous_batching_config": "none: the cache is sized to the call",
    "torch_empty_cache_steps": "none; on a CPU --keep-freed-memory and --freed-memory-ceiling",
}
#: TRL's default ref_model_sync_steps, used when sync_ref_model is on without it.
TRL_REF_MODEL_SYNC_STEPS = 512


#: TRL's words for a switch's value (``--bf16 true``, as ``transformers.HfArgumentParser`` reads them).
TRUE_WORDS, FALSE_WORDS = ("true", "yes", "t", "y", "1"), ("false", "no", "f", "n", "0")


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def typed_key(arg: str) -> str:
    """An option's name as typed, with TRL's (and argparse's) underscores read as dashes: ``--use_vllm=true`` ->
    ``--use-vllm``."""
    key = arg.partition("=")[0]
    return key.replace("_", "-") if key.startswith("--") else key


def trl_fields(names) -> list[tuple[str, str]]:
    """(TRL's name, the field it sets here) for each of ``names``."""
    return [(n, TRL_NAMES[n][0] if n in TRL_NAMES else TRL_SWITCHES[n][0]) for n in names]
