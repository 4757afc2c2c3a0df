"""The command lines, apart from the library: each parses its arguments, then calls the library once. ``python -m llm
<command>`` (``llm/__main__.py``) and ``offpolicy-grpo <command>`` dispatch to them through ``console``; ``python -m
llm.train`` (``llm/train.py``) runs ``train`` directly."""
