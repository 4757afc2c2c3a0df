"""Every command under one name: ``python -m llm <command>`` and the console command ``offpolicy-grpo`` (declared in
pyproject.toml) are one dispatcher; ``python -m llm.train`` stays the trainer's; ``llm.train`` is always the
function."""

import tomllib

import pytest

from llm.commands import console
from tests.helpers import ROOT


def test_pyproject_declares_the_console_command():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"offpolicy-grpo": "llm.commands.console:entry"}


def test_help_lists_every_command(capsys):
    assert console.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, (_, what) in console.COMMANDS.items():
        assert f"  {name} " in out and what in out
    assert "python -m llm <command> is the same" in out
    assert console.main([]) == 2  # no command: the usage, a usage error


def test_python_m_llm_is_the_dispatcher_and_python_m_llm_train_still_trains_help():
    import subprocess
    import sys

    for argv, prog in ((["-m", "llm", "--help"], "usage: python -m llm <command>"),
                       (["-m", "llm", "train", "--help"], "python -m llm train"),
                       (["-m", "llm.train", "--help"], "usage: python -m llm train")):  # the same command
        res = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0 and prog in res.stdout, (argv, res.stdout[:300], res.stderr[-500:])
    bad = subprocess.run([sys.executable, "-m", "llm", "serv"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "python -m llm: error: unknown command 'serv'; did you mean 'serve'? (commands: "
        + ", ".join(console.COMMANDS) + ")")


def test_an_unknown_command_is_one_line_naming_the_nearest(capsys):
    with pytest.raises(SystemExit) as exc:
        console.main(["trian"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown command 'trian'; did you mean 'train'?" in err


def test_a_command_is_its_module_form(capsys):
    """``offpolicy-grpo options`` prints what ``python -m llm options`` prints; a bad option is the command's own
    one-line error (under the command's own name)."""
    from llm.commands.options import markdown

    with pytest.raises(SystemExit) as exc:
        console.main(["options"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == markdown().strip()
    with pytest.raises(SystemExit) as exc:
        console.main(["train", "--learning-rate", "-1"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "error:" in err and "learning_rate: must be > 0" in err


def test_the_package_train_is_the_function_even_after_import_llm_train():
    import subprocess
    import sys

    code = ("import llm, llm.train; from llm import train; import llm.train as t; "
            "print(callable(train), train is t is llm.train, train.__module__, type(train).__name__)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.stdout.split() == ["True", "True", "llm", "function"], res.stderr[-1000:]


def test_the_options_command_takes_no_options(capsys):
    from llm.commands import options

    assert options.main(["--help"]) == 0 and "Takes no options" in capsys.readouterr().out
    with pytest.raises(ValueError, match="takes no options, got --bogus"):
        options.main(["--bogus"])
