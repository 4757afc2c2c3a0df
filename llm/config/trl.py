"""TRL's and verl's option names for this project's config, on the command line (``translate_trl_args``) and in
``from_trl`` (the names themselves: ``llm.config.trl_names``; what is said to their users: ``llm.config.trl_messages``)."""

from __future__ import annotations

import functools
import warnings

from pydantic import TypeAdapter, ValidationError
from runkit.cli import switch_name, switch_names

from llm.config.fields import STRICT, one_line, plain
from llm.config.grpo import GROUPS, GRPOConfig
from llm.config.trl_messages import as_said, unread_cap_in_python
from llm.config.trl_names import (FALSE_WORDS, TRL_COUNTERPARTS, TRL_NAMES, TRL_NONE, TRL_REF_MODEL_SYNC_STEPS,
                                  TRL_SWITCHES, TRUE_WORDS, flag_of, trl_fields, typed_key)

__all__ = ["TRL_COUNTERPARTS", "TRL_NAMES", "TRL_NONE", "TRL_REF_MODEL_SYNC_STEPS", "TRL_SWITCHES", "from_trl",
           "translate_trl_args", "trl_fields"]

_SWITCH = TypeAdapter(bool, config=STRICT)


def _switch(name: str, value) -> bool:
    """A TRL switch's value: True or False (numpy's bool too), checked by pydantic as the config's own switches."""
    try:
        return _SWITCH.validate_python(plain(value))
    except ValidationError as exc:
        raise one_line(exc, field=name) from None


def _trl_values(given: dict) -> dict:
    """TRL's names and values (``given``: name -> value, strings or Python values) as this config's fields."""
    given = {name: _switch(name, v) if name in TRL_SWITCHES else v for name, v in given.items()}
    seen: dict[str, str] = {}
    for name in given:
        if name in TRL_NAMES:
            field, values = TRL_NAMES[name]
            if field in seen:
                raise ValueError(f"{name}: {seen[field]} names the same option ({field}); give one")
            seen[field] = name
            if values is not None and given[name] not in values:  # checked even where use_vllm=False drops it
                raise ValueError(f"{name}: expected one of {', '.join(values)}, got {given[name]!r}")
    out, sync_ref = {}, given.pop("sync_ref_model", None)
    if given.pop("vllm_importance_sampling_correction", True) is False:  # TRL reads no mode without its correction
        given.pop("vllm_importance_sampling_mode", None)
        out["importance_sampling_mode"] = "none"
    steps = given.get("ref_model_sync_steps")
    if steps is not None and not sync_ref:
        raise ValueError("ref_model_sync_steps: TRL applies it only with sync_ref_model; add --sync-ref-model (or "
                         "use --ref-sync-steps)")
    if sync_ref and steps is None:
        given["ref_model_sync_steps"] = TRL_REF_MODEL_SYNC_STEPS
    if sync_ref is not None and not sync_ref:
        out["ref_sync_steps"] = 0
    use_vllm = given.get("use_vllm")
    if use_vllm is not None and not use_vllm:  # TRL reads vllm_mode only with use_vllm: the order given never matters
        given.pop("vllm_mode", None)
    vllm_mode = given.get("vllm_mode")
    for name, value in given.items():
        if name in TRL_SWITCHES:
            field, on, off = TRL_SWITCHES[name]
            if name == "use_vllm" and value and vllm_mode is not None:
                continue  # vllm_mode says which
            out[field] = on if value else off
            continue
        field, values = TRL_NAMES[name]
        out[field] = value if values is None else values[value]
    return out


@functools.cache
def own_switches() -> frozenset[str]:
    """The config's own switches (its boolean fields), which take TRL's words too: ``--use-peft true``."""
    return frozenset(switch_names(GRPOConfig))


def _switch_word(name: str, argv: list[str], i: int, inline: str | None) -> bool | None:
    """The word given to a switch as TRL writes it (``--bf16 true``, ``--bf16=no``): True, False, or None for none
    (the next argument is another option). A value that is no such word is refused: no option here takes a
    positional argument, so it could only be a mistake."""
    word = inline if inline is not None else (argv[i + 1] if i + 1 < len(argv) else "-")
    if inline is None and word.startswith("-"):
        return None
    if word.lower() not in TRUE_WORDS + FALSE_WORDS:
        raise ValueError(f"{name}: a switch (--{name.replace('_', '-')} or --no-{name.replace('_', '-')}), "
                         f"or TRL's --{name.replace('_', '-')} true|false; got {word!r}")
    return word.lower() in TRUE_WORDS


def _mode_beside_switch(switch, own_mode) -> bool:
    """TRL's ``vllm_importance_sampling_correction`` (``switch``) beside this project's ``importance_sampling_mode``
    (``own_mode``; each None when not given): False beside an own mode other than none, or True beside none, is refused
    in one line. True: the own mode stands alone (the switch adds nothing), so the caller drops its translation."""
    if switch is None or own_mode is None:
        return False
    name = "vllm_importance_sampling_correction"
    if not _switch(name, switch) and own_mode != "none":
        raise ValueError(f"{name}: False is importance_sampling_mode none, but importance_sampling_mode "
                         f"{own_mode!r} was given beside it; give one")
    if _switch(name, switch) and own_mode == "none":
        raise ValueError(f"{name}: True contradicts importance_sampling_mode 'none' (the correction off); give one")
    return True


def translate_trl_args(argv: list[str]) -> list[str]:
    """A command line with TRL's option names (``--vllm-importance-sampling-mode token_mask``, ``--bf16``...) as this
    project's (``--importance-sampling-mode token_mask``, ``--dtype bfloat16``); other arguments unchanged. TRL's
    spellings work too: underscores (``--use_vllm``) and a switch's value (``--bf16 true``, ``--use-vllm=False``).
    A field given under both names is refused, as ``from_trl`` refuses it."""
    counterparts = {flag_of(n): n for n in TRL_COUNTERPARTS}
    for key in map(typed_key, argv):
        if key in counterparts:
            raise ValueError(f"{counterparts[key]}: TRL's option; here {TRL_COUNTERPARTS[counterparts[key]]} "
                             "(docs/trl.md)")
    names = {flag_of(n): n for n in TRL_NAMES}
    switches = {flag_of(n): (n, True) for n in TRL_SWITCHES} | {flag_of(f"no_{n}"): (n, False) for n in TRL_SWITCHES}
    given, rest, i = {}, [], 0
    while i < len(argv):
        arg, key = argv[i], typed_key(argv[i])
        _, eq, inline = arg.partition("=")
        if key in names:
            name = names[key]
            if eq:
                given[name] = inline
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                given[name] = argv[i + 1]
                i += 1
            else:
                raise ValueError(f"{name}: missing value (--{key[2:]} VALUE)")
            if name == "ref_model_sync_steps":
                try:
                    given[name] = int(given[name])
                except ValueError:
                    raise ValueError(f"{name}: must be an integer, got {given[name]!r}") from None
        elif key in switches:
            name, on = switches[key]
            word = _switch_word(name, argv, i, inline if eq else None)
            if word is not None:
                on = on == word  # --no-bf16 false: on
                i += 0 if eq else 1
            given[name] = on
        elif (name := switch_name(key)) in own_switches():
            word = _switch_word(name, argv, i, inline if eq else None)
            on = key.startswith("--no-") != (word is not False)
            rest.append(flag_of(name if on else f"no_{name}"))
            i += 0 if word is None or eq else 1
        else:
            rest.append(arg)
        i += 1
    out = []
    own = [rest[j + 1] if "=" not in a and j + 1 < len(rest) else a.partition("=")[2]
           for j, a in enumerate(rest) if typed_key(a) == "--importance-sampling-mode"]
    if _mode_beside_switch(given.get("vllm_importance_sampling_correction"), own[-1] if own else None):
        given.pop("vllm_importance_sampling_correction")
    translated = _trl_values(given)
    typed = {typed_key(a) for a in rest}
    for field, value in translated.items():
        if {flag_of(field), flag_of(f"no_{field}")} & typed:
            trl = ", ".join(flag_of(n) for n, f in trl_fields(given) if f == field)
            raise ValueError(f"{field}: given both under its own name and under TRL's ({trl}); give one")
        out += [flag_of(field if value else f"no_{field}")] if isinstance(value, bool) else [flag_of(field), str(value)]
    return rest + out


def from_trl(**kwargs) -> GRPOConfig:
    """A ``GRPOConfig`` from keyword arguments that may use TRL's names (``TRL_NAMES``, ``TRL_SWITCHES``) beside
    this project's: ``from_trl(vllm_importance_sampling_mode="token_mask", bf16=True, max_steps=50)``."""
    from llm.config.fields import nearest_name
    from llm.config.grpo import FIELD_GROUP, TOP_FIELDS

    known = [*TOP_FIELDS, *FIELD_GROUP, *TRL_NAMES, *TRL_SWITCHES, *GROUPS]
    for k in kwargs:
        if k in TRL_COUNTERPARTS:
            raise TypeError(f"from_trl: {k} is TRL's option; here {TRL_COUNTERPARTS[k]} (docs/trl.md)")
        if k not in known:
            raise TypeError(f"from_trl got an unexpected keyword argument {k!r}{nearest_name(k, known)}")
    if "bf16" in kwargs and kwargs["bf16"] is None:
        raise ValueError("bf16: None is TRL's 'on unless fp16' (bfloat16); here the default dtype is float32: give "
                         "bf16=True or False")
    for name in TRL_NONE:  # TRL's defaults, given as TRL writes them: this config's defaults, as if not given (so a
        if name in kwargs and kwargs[name] is None:  # None cap is no cap given, and warns of nothing)
            del kwargs[name]
    if "vllm_importance_sampling_cap" in kwargs and kwargs["vllm_importance_sampling_cap"] is None:
        del kwargs["vllm_importance_sampling_cap"]
    if isinstance(kwargs.get("scale_rewards"), bool):  # TRL 1.16's GRPOConfig maps True and False so
        kwargs["scale_rewards"] = "group" if kwargs["scale_rewards"] else "none"
    if isinstance(kwargs.get("report_to"), str):  # TRL takes one name as a string
        kwargs["report_to"] = (kwargs["report_to"],)
    trl = {k: kwargs.pop(k) for k in list(kwargs) if k in TRL_NAMES or k in TRL_SWITCHES}
    if _mode_beside_switch(trl.get("vllm_importance_sampling_correction"), kwargs.get("importance_sampling_mode")):
        trl.pop("vllm_importance_sampling_correction")
    translated = _trl_values(trl)
    both = sorted(set(translated) & set(kwargs))
    if both:
        raise ValueError(f"{both[0]}: given both under its own name and under TRL's; give one")
    try:
        config = GRPOConfig(**kwargs, **translated)
    except ValueError as exc:
        raise as_said(exc, {field: (name, f"={trl[name]!r}") for name, field in trl_fields(trl)}) from None
    if (warning := unread_cap_in_python(trl, kwargs)) is not None:  # of a config that builds: a refusal says enough
        warnings.warn(warning, UserWarning, stacklevel=2)
    return config
