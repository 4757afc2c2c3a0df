"""What the config's groups share: the base model of every group, the resumable mark, the bounds on temperatures,
the one-line errors.

Every group is a frozen pydantic model (``ConfigGroup``) in strict mode: a boolean takes only a bool, an integer only
an integer (an integral numpy number becomes one), a ``Literal`` only one of its choices, a tuple a tuple or a list
(as config.json holds it); an unknown name is refused with the nearest one. A group's own rules are its
``model_validator``; the rules across groups are ``GRPOConfig``'s. A group never changes once built:
``config.learning_rate = x`` builds the config's new optimiser group and re-validates the config, and ``replace`` or
``model_copy`` give new groups. Built by keywords, a group's error is one line (``one_line``:
``ValueError("<field>: <what it must be>, got <value>")``); ``model_validate`` raises pydantic's ValidationError, a
ValueError too.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from runkit.validation import require

__all__ = ["ConfigGroup", "group_of", "Options", "UnknownOption", "MIN_TEMPERATURE", "MAX_TEMPERATURE", "STRICT", "is_resumable", "nearest_name", "one_line",
           "plain", "resumable", "require"]

#: Sampling temperatures accepted (vLLM treats lower ones as greedy decoding, which has no log-probabilities to
#: importance-weight; higher ones make every completion uniform noise).
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 100.0

#: pydantic's settings for the config and every group: strict types, no unknown names, finite floats (nan and +-inf
#: pass no comparison check by accident, but inf would pass ``> 0``), each field's docstring its description
#: (``model_json_schema``, ``python -m llm options``). A group is frozen besides (``ConfigGroup``).
STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True)


def resumable(default):
    """A field that may change when a run is resumed: it does not change what a step computes (up to float rounding
    for the micro-batch and chunk sizes, shared prompts, sharding with FSDP and the device: a checkpoint written on a
    GPU resumes on a CPU; a restarted server may listen elsewhere). ``llm.run.rundir`` compares every other field."""
    return Field(default, json_schema_extra={"resumable": True})


def _minus_one_is_none(value):
    return None if type(value) in (int, float) and value == -1 else value


#: An option whose "not given" was -1 before it became TRL's None: -1, from a script or a saved config.json, reads None.
WAS_MINUS_ONE = BeforeValidator(_minus_one_is_none)


#: TRL's ``report_to="wandb"``: one name, given as a string, is the tuple of that one name.
ONE_NAME_IS_A_TUPLE = BeforeValidator(lambda value: (value,) if isinstance(value, str) else value)


def none_reads(off):
    """TRL's None for an option whose None means what ``off`` means here (no two-sided clip, no floor, no URL...):
    ``GRPOConfig(delta=None)``, TRL's default as a TRL user writes it, reads ``off``; the config and its config.json
    keep the value (``llm.config.trl_names.TRL_NONE`` lists them)."""
    return BeforeValidator(lambda value: off if value is None else value)


def is_resumable(info) -> bool:
    """Whether a field (its pydantic ``FieldInfo``) was declared ``resumable``."""
    return bool((info.json_schema_extra or {}).get("resumable"))


#: Names this config does not hold but knows where they go (TRL's, filled by ``llm.config.trl_messages``): name -> a hint.
ELSEWHERE: dict[str, str] = {}


def nearest_name(name: str, names) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``names`` to a misspelt ``name``, or ''; for one of TRL's names
    (``ELSEWHERE``), where it goes."""
    import difflib

    if name in ELSEWHERE:
        return ELSEWHERE[name]
    near = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""


def plain(value):
    """A value as the config holds it: a numpy scalar as its Python value (an integral one an int), a list (config.json)
    as a tuple, each item too."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list):
        return tuple(plain(v) for v in value)
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    return value


#: pydantic's words for what a value must be, as the one-line error says them.
_EXPECTED = {"int_type": "an integer", "int_from_float": "an integer", "float_type": "a number",
             "bool_type": "True or False", "string_type": "text", "tuple_type": "a tuple (or list)",
             "finite_number": "a finite number", "none_required": "None"}


class UnknownOption(TypeError, ValueError):
    """An option the config does not have: a TypeError, as Python's for an unexpected keyword, and a ValueError, so
    that ``model_validate`` reports it as pydantic's ValidationError (it wraps a ValueError raised while validating)."""


def one_line(exc: ValidationError, names=(), field: str = "") -> Exception:
    """A pydantic error as this package's one line: ``ValueError("<field>: must be <what>, got <value>")``, or for an
    unknown name ``TypeError`` with the nearest of ``names``."""
    err = exc.errors()[0]
    if err["type"] == "value_error" and isinstance(err.get("ctx", {}).get("error"), ValueError):
        return err["ctx"]["error"]  # a group's own check (``__post_init__``), already one line
    field = next((str(p) for p in reversed(err["loc"]) if not isinstance(p, int)), "") or field or "config"
    if err["type"] in ("unexpected_keyword_argument", "extra_forbidden", "no_such_attribute"):
        return UnknownOption(f"unexpected option {field!r}{nearest_name(field, names)}")
    if err["type"] == "missing" and any(isinstance(p, int) for p in err["loc"]):  # a tuple with too few items
        what = f"a tuple of more items (item {[p for p in err['loc'] if isinstance(p, int)][-1]} is missing)"
    elif err["type"] in ("too_long", "too_short"):
        bound = ("at most", err["ctx"].get("max_length")) if err["type"] == "too_long" else \
            ("at least", err["ctx"].get("min_length"))
        what = f"a tuple of {bound[0]} {bound[1]} items"
    elif err["type"] == "literal_error":
        what = f"one of {err['ctx']['expected']}"
    elif err["type"] in _EXPECTED:
        what = _EXPECTED[err["type"]]
    else:
        what = err["msg"].removeprefix("Input should be ").removeprefix("Value error, ")
    value = err.get("input")
    shown = f"{type(value).__name__}(...)" if isinstance(value, (BaseModel, dict)) else \
        f"{value!r} ({type(value).__name__})" if not isinstance(value, (str, type(None))) else repr(value)
    return ValueError(f"{field}: must be {what}, got {shown if len(shown) <= 200 else shown[:197] + '...'}")


class Options(BaseModel):
    """What ``GRPOConfig`` and its groups share: ``STRICT``, numpy's scalars and lists read as Python's (``plain``),
    and built by keywords an error in one line, an unknown name naming the nearest of ``option_names``."""

    model_config = STRICT

    def __init__(self, /, **values):
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise one_line(exc, type(self).option_names()) from None

    @classmethod
    def option_names(cls) -> list[str]:
        """The names a keyword may have (the fields)."""
        return list(cls.model_fields)

    @field_validator("*", mode="before")
    @classmethod
    def _plain(cls, value):
        return plain(value)


class ConfigGroup(Options):
    """A group of the config: a frozen pydantic model whose fields' types and choices pydantic checks, then the group's
    own rules (its ``model_validator``)."""

    model_config = ConfigDict(frozen=True)

    def __setattr__(self, name: str, value) -> None:
        """A group never changes once built: refused in one line, naming what does change a config."""
        names = list(type(self).model_fields)
        if name not in names:
            raise AttributeError(f"{type(self).__name__}: {name!r} is not a field{nearest_name(name, names)}")
        raise AttributeError(f"{type(self).__name__} is frozen: set config.{name} = ... (the config takes a new "
                             f"group, validated with the rest), or build one ({type(self).__name__}(...), "
                             "model_copy, GRPOConfig.replace)")


def attribute_docstrings(cls) -> dict[str, str]:
    """Each field's docstring in ``cls``'s source (the string under its declaration), as pydantic reads a model's."""
    import ast
    import inspect
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {a.target.id: inspect.cleandoc(b.value.value) for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)}


def group_of(settings: type) -> type[ConfigGroup]:
    """A config group holding the fields of the frozen dataclass ``settings`` (a declaration ``grpo_theory`` shares
    with the bandit simulator): their types, defaults and docstrings. A group derived from it adds its own fields
    and rules."""
    import dataclasses
    import typing

    from pydantic import create_model

    hints, docs = typing.get_type_hints(settings), attribute_docstrings(settings)
    return create_model(settings.__name__, __base__=ConfigGroup, __module__=__name__, **{
        f.name: (hints[f.name], Field(f.default, description=docs.get(f.name))) for f in dataclasses.fields(settings)})
