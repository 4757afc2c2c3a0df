"""``python -m llm.train``: the trainer's command line (``llm.commands.train``), kept because it is the entry point the
project has named from the start; ``python -m llm train`` is the same. Imported, ``llm.train`` is the function
``llm.train`` (``from llm import train``), never this module."""

import sys

if __name__ == "__main__":
    from runkit.cli import run_main

    from llm.commands.train import PROG, main

    run_main(main, prog=PROG)
else:  # the import system binds what sys.modules holds when the module's code ends: the function, not the module
    from llm import train as _train_function

    sys.modules[__name__] = _train_function
