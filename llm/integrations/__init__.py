"""This project's readings inside trainers people already use (docs/integrations.md).

- ``llm.integrations.trl.watch(trainer, ...)``: TRL 1.16's ``GRPOTrainer``, one call on the built trainer.
- ``llm.integrations.verl``: verl 0.9.1's actor update, by one line of its configuration
  (``actor_rollout_ref.model.external_lib=llm.integrations.verl_watch``) or ``watch(worker)``.
- ``llm.integrations.readings``: what every adapter shares, on tensors a host trainer already holds: the options,
  an optimiser step's completions and their lags, the per-lag table, the held-out set and its certificate, the
  declared range and its voiding. The estimators are ``llm.tensors.diagnostics``'s, the ones ``llm.train`` logs.

Each adapter observes: the host's loss, rewards, random streams and logged metrics are the same with it as without
it; it adds its own keys to the host's metrics, under the names ``llm.train`` logs.
"""
