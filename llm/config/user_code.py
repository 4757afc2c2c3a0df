"""Python objects in a config: TRL's trainer takes functions, classes and factories themselves (``tools=[f]``,
``environment_factory=Env``, ``reward_funcs=[f]``); a config holds text (config.json), and the run imports them again
where it starts.

- ``object_spec``: 'module:name' for an object defined at a module's top level (imported again in any process), else
  'object:<what it is>' kept in ``OBJECTS`` for this process (a lambda, a ``functools.partial``, a class defined in a
  function): a resumed run from Python passes the object again;
- ``import_object``: the object of such a text, one line naming the option otherwise (a module that does not compile
  is named with its file and line).
"""

from __future__ import annotations

import functools
import importlib
import re
import traceback
from pathlib import Path

#: Python objects given to a config that cannot be imported again by name (a lambda, a ``functools.partial``, a class
#: or function defined inside a function), kept for this process under the text config.json holds of them.
OBJECTS: dict[str, object] = {}
OBJECT_PREFIX = "object:"


def describe(obj) -> str:
    """A text for an object that names what it is and where it was defined (its file's name and line: no directory of
    this machine goes into config.json), the same in every process (no address)."""
    if isinstance(obj, functools.partial):
        args = [describe(obj.func)] + [repr(a) for a in obj.args] + [f"{k}={v!r}" for k, v in obj.keywords.items()]
        return re.sub(r" at 0x[0-9a-f]+", "", f"functools.partial({', '.join(args)})")
    code = getattr(obj, "__code__", None)
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    where = f" at {Path(code.co_filename).name}:{code.co_firstlineno}" if code is not None else ""  # no machine path
    return re.sub(r" at 0x[0-9a-f]+", "", f"{getattr(obj, '__module__', '?')}:{name}{where}")


def object_spec(obj, option: str) -> str:
    """What a config holds of a Python object (TRL's ``tools=[f]``, ``environment_factory=Env``): 'module:name' for
    one defined at a module's top level (imported again where the run starts, in any process), else
    'object:<description>' kept in ``OBJECTS`` for this process (a resumed run from Python passes it again)."""
    if not callable(obj):
        raise ValueError(f"{option}: {obj!r} is not callable")
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    try:
        found = getattr(importlib.import_module(module), name) if module and name and "." not in name else None
    except (ImportError, AttributeError, TypeError):
        found = None
    if found is obj and "<" not in name:
        return f"{module}:{name}"
    spec = OBJECT_PREFIX + describe(obj)
    OBJECTS[spec] = obj
    return spec


def as_specs(value, option: str, named: bool = False) -> tuple[str, ...]:
    """A config value of names or objects as a tuple of text: a string, an object, a list of them, or (``named``)
    a dict of them by name ('name=spec')."""
    if isinstance(value, dict) and named:
        return tuple(f"{name}={as_specs(v, option)[0]}" for name, v in value.items())
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        value = (value,) if value not in ("", None) else ()
    return tuple(v if isinstance(v, str) else object_spec(v, option) for v in value)


def import_object(spec, option: str):
    """The object of ``spec``: 'package.module:name', an 'object:...' kept for this process (``llm.config.agent``),
    or the object itself; ``ValueError`` naming ``option`` in one line otherwise (a module that does not compile is
    named with its file and line)."""
    if not isinstance(spec, str):
        return spec
    if spec.startswith(OBJECT_PREFIX):
        if spec not in OBJECTS:
            raise ValueError(f"{option}: {spec!r} was a Python object given to a config in another process; pass the "
                             "object again (from Python), or name it as 'module:name'")
        return OBJECTS[spec]
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"{option}: expected 'module:name', got {spec!r}")
    try:
        obj = importlib.import_module(module)
    except SyntaxError as exc:
        raise ValueError(f"{option}: {exc.filename}:{exc.lineno}: {exc.msg} (importing {module!r})") from None
    except ImportError as exc:
        raise ValueError(f"{option}: cannot import {spec!r} ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while it was imported
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        raise ValueError(f"{option}: importing {module!r} raised {type(exc).__name__}: {exc} ({frame.filename}:"
                         f"{frame.lineno})") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{option}: cannot import {spec!r} (module {module!r} has no {attr!r})") from None
    return obj


def spec_validator(field: str, named: bool = False):
    """A group's pydantic validator (before its type's) that keeps the Python objects given to ``field`` by text
    (``as_specs``)."""
    from pydantic import field_validator

    return field_validator(field, mode="before")(lambda cls, value: as_specs(value, field, named=named))
