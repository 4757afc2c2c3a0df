"""What the config's groups share: types and choices checked by pydantic wherever a group is built or changed, the
resumable mark, the bounds on temperatures, the one-line checks.

Every group is a pydantic dataclass (``config_group``) in strict mode: a boolean takes only a bool, an integer only an
integer (an integral numpy number becomes one), a ``Literal`` only one of its choices, a tuple a tuple or a list (as
config.json holds it); an unknown name is refused with the nearest one. The same validation runs on construction, on
assignment (``config.learning_rate = x``), in ``replace``, on loading config.json and in ``from_trl``. Each error is one
line: ``ValueError("<field>: <what it must be>, got <value>")``. The rules that read several fields stay named
functions: each group's ``__post_init__`` (its own), ``GRPOConfig._check_across_groups`` (across groups).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
from pydantic import ConfigDict, ValidationError, field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from runkit.validation import require, require_finite

__all__ = ["ConfigGroup", "MIN_TEMPERATURE", "MAX_TEMPERATURE", "config_group", "nearest_name", "one_line", "plain",
           "resumable", "require", "require_finite"]

#: Sampling temperatures accepted (vLLM treats lower ones as greedy decoding, which has no log-probabilities to
#: importance-weight; higher ones make every completion uniform noise).
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 100.0

#: pydantic's settings for every group: strict types, no unknown names, assignments validated.
STRICT = ConfigDict(strict=True, extra="forbid", validate_assignment=True)


def resumable(default):
    """A field that may change when a run is resumed: it does not change what a step computes (up to float rounding
    for the micro-batch and chunk sizes, shared prompts, sharding with FSDP and the device: a checkpoint written on a
    GPU resumes on a CPU; a restarted server may listen elsewhere). ``llm.run.rundir`` compares every other field."""
    return dataclasses.field(default=default, metadata={"resumable": True})


def nearest_name(name: str, names) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``names`` to a misspelt ``name``, or ''."""
    import difflib

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


def one_line(exc: ValidationError, names=(), field: str = "") -> Exception:
    """A pydantic error as this package's one line: ``ValueError("<field>: must be <what>, got <value>")``, or for an
    unknown name ``TypeError`` with the nearest of ``names``."""
    err = exc.errors()[0]
    if err["type"] == "value_error" and isinstance(err.get("ctx", {}).get("error"), ValueError):
        return err["ctx"]["error"]  # a group's own check (``__post_init__``), already one line
    field = ".".join(str(p) for p in err["loc"] if not isinstance(p, int)) or field or "config"
    if err["type"] in ("unexpected_keyword_argument", "extra_forbidden", "no_such_attribute"):
        return TypeError(f"unexpected option {field!r}{nearest_name(field, names)}")
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
    shown = f"{value!r} ({type(value).__name__})" if not isinstance(value, (str, type(None))) else repr(value)
    return ValueError(f"{field}: must be {what}, got {shown}")


def _checked_setattr(self, name: str, value) -> None:
    """A group's assignment (``ConfigGroup``): pydantic validates the value, then the group's checks run; a refused
    value leaves the group as it was."""
    if not self.__dict__.get("_checked", False):  # during construction
        object.__setattr__(self, name, value)
        return
    if name.startswith("_"):  # the group's own marks (checked, its config): no user of the group sets them
        raise AttributeError(f"{type(self).__name__}: {name!r} is internal, not an option")
    names = [f.name for f in dataclasses.fields(self)]
    if name not in names:
        derived = isinstance(getattr(type(self), name, None), property)
        raise AttributeError(f"{type(self).__name__}: {name!r} " + (
            "is derived from the fields, not set" if derived else f"is not a field{nearest_name(name, names)}"))
    old = getattr(self, name)
    private = {k: v for k, v in self.__dict__.items() if k.startswith("_")}
    try:
        type(self).__pydantic_validator__.validate_assignment(self, name, value)
    except ValidationError as exc:
        raise one_line(exc, names) from None
    finally:
        self.__dict__.update(private)  # pydantic's assignment replaces the instance's dict
    try:
        self.check()
    except Exception:
        object.__setattr__(self, name, old)
        raise


@pydantic_dataclass(config=STRICT)
class ConfigGroup:
    """A group of the config (``config_group``): its fields' types and choices checked by pydantic at construction and
    at every assignment, then the group's own checks (``__post_init__``) and, when it belongs to a ``GRPOConfig``,
    that config's rules across groups; a refused value leaves the group as it was; an unknown name raises, naming the
    nearest field. One object per group: ``config.learning_rate = x`` and ``config.optim.learning_rate = x`` change the
    same object, so a group held elsewhere never goes stale."""

    @field_validator("*", mode="before")
    @classmethod
    def _plain(cls, value):
        return plain(value)

    def __init_subclass__(cls, **kwargs):
        """A group's own ``__post_init__`` marks the object checked when it returns: from then on assignments are."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__post_init__")
        if own is not None:
            def post_init(self, _own=own):
                _own(self)
                object.__setattr__(self, "_checked", True)

            post_init.__doc__ = own.__doc__
            cls.__post_init__ = post_init

    def check(self) -> None:
        """The group's own checks, then its config's rules across groups (if it belongs to one)."""
        self.__post_init__()
        owner = self.__dict__.get("_owner")
        if owner is not None:
            owner._check_across_groups()

    def __post_init__(self):
        object.__setattr__(self, "_checked", True)


ConfigGroup.__setattr__ = _checked_setattr


def config_group(cls):
    """``cls`` (a subclass of ``ConfigGroup``) as a pydantic dataclass whose errors are one line each: its
    construction validated by pydantic, its assignments by ``ConfigGroup.__setattr__``."""
    cls = pydantic_dataclass(cls, config=STRICT)
    cls.__setattr__ = _checked_setattr  # pydantic's own would set a refused value before the group's checks
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except ValidationError as exc:
            raise one_line(exc, [f.name for f in dataclasses.fields(cls)]) from None

    cls.__init__ = __init__
    return cls
