"""The console command ``offpolicy-grpo``: every ``python -m`` command under one name, declared in pyproject.toml,
each the same as its module form."""

import tomllib

import pytest

from llm.commands import console
from tests.helpers import ROOT


def test_pyproject_declares_the_console_command():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"offpolicy-grpo": "llm.commands.console:entry"}


def test_help_lists_every_command_with_its_module_form(capsys):
    assert console.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, (_, module, _) in console.COMMANDS.items():
        assert f"  {name} " in out and f"python -m {module}" in out
    assert console.main([]) == 2  # no command: the usage, a usage error


def test_an_unknown_command_is_one_line_naming_the_nearest(capsys):
    with pytest.raises(SystemExit) as exc:
        console.main(["trian"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown command 'trian'; did you mean 'train'?" in err


def test_a_command_is_its_module_form(capsys):
    """``offpolicy-grpo options`` prints what ``python -m llm.options`` prints; a bad option is the command's own
    one-line error (under the command's own name)."""
    from llm.commands.options import markdown

    with pytest.raises(SystemExit) as exc:
        console.main(["options"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == markdown().strip()
    with pytest.raises(SystemExit) as exc:
        console.main(["train", "--learning-rate", "-1"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "error:" in err and "learning_rate: must be > 0" in err


def test_the_package_train_is_the_function():
    import llm

    assert callable(llm.train) and llm.train.__module__ == "llm"
