"""The command lines, apart from the library: each parses its arguments, then calls the library. ``python -m
llm.train`` runs ``llm.commands.train``."""
