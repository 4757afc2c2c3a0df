"""What the config's groups share: the resumable mark, the bounds on temperatures, the one-line checks."""

from __future__ import annotations

import dataclasses

from runkit.validation import require, require_finite

__all__ = ["ConfigGroup", "MIN_TEMPERATURE", "MAX_TEMPERATURE", "nearest_name", "resumable", "require",
           "require_finite"]

#: Sampling temperatures accepted (vLLM treats lower ones as greedy decoding, which has no log-probabilities to
#: importance-weight; higher ones make every completion uniform noise).
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 100.0


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


class ConfigGroup:
    """A group of the config whose assignments are checked as its construction is: an unknown name raises, naming the
    nearest field; a new value runs the group's own checks (``__post_init__``) and, when the group belongs to a
    ``GRPOConfig``, that config's rules across groups; a refused value leaves the group as it was. One object per
    group: ``config.learning_rate = x`` and ``config.optim.learning_rate = x`` change the same object, so a group held
    elsewhere never goes stale."""

    def __setattr__(self, name: str, value) -> None:
        if not self.__dict__.get("_checked", False) or name.startswith("_"):  # during construction
            object.__setattr__(self, name, value)
            return
        names = [f.name for f in dataclasses.fields(self)]
        if name not in names:
            derived = isinstance(getattr(type(self), name, None), property)
            raise AttributeError(f"{type(self).__name__}: {name!r} " + (
                "is derived from the fields, not set" if derived else f"is not a field{nearest_name(name, names)}"))
        old = getattr(self, name)
        object.__setattr__(self, name, value)
        try:
            self.check()
        except Exception:
            object.__setattr__(self, name, old)
            raise

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
