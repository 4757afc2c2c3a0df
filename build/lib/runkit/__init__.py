"""Run infrastructure shared by both halves of the project (no mathematics here).

- ``runkit.cli``: typed command lines (tyro) whose errors are one line and exit with status 2;
- ``runkit.runio``: run directories (``config.json``, ``metrics.jsonl``) and reading them back;
- ``runkit.validation``: the one config-validation helper, ``require``;
- ``runkit.interrupt``: graceful Ctrl-C (finish the step, checkpoint, exit; a second Ctrl-C aborts).
"""
