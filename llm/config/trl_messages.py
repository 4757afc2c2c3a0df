"""What the config says to a user who writes TRL's names: where a TRL name goes when this project's own constructor
meets it (``fields.ELSEWHERE``), an error about an option given under TRL's name stated as the user typed it
(``as_said``), and TRL's cap given where this project's default mode reads none (``unread_cap``)."""

from __future__ import annotations

from llm.config.fields import ELSEWHERE
from llm.config.trl_names import TRL_COUNTERPARTS, TRL_NAMES, TRL_SWITCHES, flag_of, typed_key, trl_fields

#: TRL's importance-sampling caps: read by TRL's default mode (sequence_mask), by none of this project's default.
TRL_CAPS = ("vllm_importance_sampling_clip_max", "vllm_importance_sampling_cap", "vllm_importance_sampling_clip_min")


def _where(name: str) -> str:
    """The constructor's answer to one of TRL's names: the field it sets here, and how its values translate."""
    if name in TRL_COUNTERPARTS:
        return f" (TRL's option; here {TRL_COUNTERPARTS[name]})"
    (_, field), = trl_fields([name])
    if name in TRL_SWITCHES:
        _, on, off = TRL_SWITCHES[name]
        values = {True: on, False: off}
    else:
        values = {k: v for k, v in (TRL_NAMES[name][1] or {}).items() if k != v}
    said = ", ".join(f"{name}={k!r} is {field}={v!r}" for k, v in values.items() if v not in ("", None))
    return (f" (TRL's name for {field}: llm.config.from_trl(...) and the command line take it"
            + (f"; {said}" if said else "") + ")")


ELSEWHERE.update({name: _where(name) for name in [*TRL_NAMES, *TRL_SWITCHES, *TRL_COUNTERPARTS]})


def as_said(exc: Exception, said: dict[str, tuple[str, str]]) -> Exception:
    """``exc`` stated as the user typed it where it is about a field given under one of TRL's names. ``said`` maps
    the field to (what was typed, its value as typed): ("importance_sampling_level", "='sequence'") from Python,
    ("--importance-sampling-level", " sequence") from the command line. A message "<field>: ..." gets the typed
    name and value in front; one naming this project's flag (a type, choice or missing-value error of the command
    line's parser) names the typed flag beside it."""
    text = str(exc)
    field, sep, rest = text.partition(": ")
    if sep and field in said:
        name, value = said[field]
        return type(exc)(f"{name}{value} (here {field}): {rest}")
    for field, (name, _) in said.items():
        own = flag_of(field)
        if name.startswith("--") and own in text:
            return type(exc)(text.replace(own, f"{name} (here {own})", 1))
    return exc


def trl_flags_said(argv: list[str]) -> dict[str, tuple[str, str]]:
    """The fields that ``argv`` gave under TRL's names, and how (``as_said``): {"ratio_level":
    ("--importance-sampling-level", " sequence")}."""
    names = {flag_of(n): n for n in [*TRL_NAMES, *TRL_SWITCHES]}
    said = {}
    for i, arg in enumerate(argv):
        key, eq, value = typed_key(arg), *arg.partition("=")[1:]
        name = names.get(key) or (names.get("--" + key[5:]) if key.startswith("--no-") else None)
        if name is not None:
            nxt = argv[i + 1] if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--") else ""
            (_, field), = trl_fields([name])
            said[field] = (key, f" {value if eq else nxt}".rstrip())
    return said


def unread_cap(caps: list[str], mode_given: bool) -> str | None:
    """A warning where one of TRL's caps is given (``caps``: each as it was typed) without a mode: TRL's default mode
    (sequence_mask) reads it, this project's (paper) reads none, so the cap would change nothing. A saved from_trl
    dict of this shape still loads (issue 80's compatibility): a warning, not an error."""
    if not caps or mode_given:
        return None
    return (f"{caps[0]} is read by TRL's default mode sequence_mask; here the default mode is paper (the exact weight "
            "pi_k/alpha, untruncated), which reads no cap: give vllm_importance_sampling_mode (e.g. 'sequence_mask', "
            "TRL's default) for the cap to act")


#: Every name, TRL's or this project's, that chooses the correction (``unread_cap``).
MODES = ("vllm_importance_sampling_mode", "vllm_importance_sampling_correction", "importance_sampling_mode")


def unread_cap_in_python(trl: dict, own: dict) -> str | None:
    """``unread_cap`` for ``from_trl``'s keyword arguments (``trl``: TRL's names, ``own``: this project's)."""
    caps = [f"{n}={trl[n]!r}" for n in TRL_CAPS if trl.get(n) is not None]
    return unread_cap(caps, any(trl.get(m) is not None or own.get(m) is not None for m in MODES))


def unread_cap_in_argv(argv: list[str]) -> str | None:
    """``unread_cap`` for a command line."""
    said = {field: name + value for field, (name, value) in trl_flags_said(argv).items()}
    typed = {typed_key(a)[2:].replace("-", "_") for a in argv if a.startswith("--")}
    typed |= {t[3:] for t in typed if t.startswith("no_")}
    caps = [said[field] for name, field in trl_fields(TRL_CAPS) if name in typed and field in said]
    return unread_cap(caps, any(m in typed for m in MODES))
