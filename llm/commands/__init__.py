"""The command lines, apart from the library: each parses its arguments, then calls the library once. ``python -m llm
train`` (``llm/train.py``, only that entry point) runs ``llm.commands.train``; serve, report, ablation, tiny,
options and pretrained alike."""
