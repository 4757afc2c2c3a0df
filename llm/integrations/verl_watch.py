"""Importing this module watches verl's actor in this process (``llm.integrations.verl.install``), with the options
of the ``OFFPOLICY_GRPO_WATCH`` environment variable (a JSON object; unset: the defaults). It is what verl's
``external_lib`` imports in each worker:

    actor_rollout_ref.model.external_lib=llm.integrations.verl_watch

A wrong option there is one line on standard error, and verl runs unobserved: the observer never stops its host.
"""

import sys

from llm.integrations.verl import install, options_from_env
from llm.integrations.watcher import PREFIX

try:
    install(**options_from_env())
except (ValueError, TypeError) as exc:
    print(f"{PREFIX}{exc}; verl runs unobserved", file=sys.stderr, flush=True)
