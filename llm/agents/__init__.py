"""Agents: multi-turn tool-calling episodes, token in and token out (docs/agents.md; docs/theory.md, §8.8).

An episode is the prompt, then turns of the policy's own tokens, each ended by EOS, separated by the environment's
tokens: a tool's result rendered by the chat template, with the template's glue around it. The policy's tokens are
never re-tokenised: each turn is generated from the exact token ids before it, and the environment's tokens are
appended as the template renders them. ``Rollout.tool_mask`` marks which tokens are whose, and every off-policy
quantity (pi_k/alpha, the clip, the TV distances, the bound's terms, the exact J) runs over the policy's tokens only.

- ``llm.agents.tools``: tools (``--tools module:function``), their schemas and what the model reads of an answer;
- ``llm.agents.environments``: TRL 1.16's environment contract (``--environment-factory``);
- ``llm.agents.workers``: where user code runs: a worker thread per episode, one deadline per round;
- ``llm.agents.template``: the chat template's tool-call format: the environment's tokens and the parse of a turn
  (transformers' ``parse_response`` with the tokenizer's ``response_template``);
- ``llm.agents.episodes``: ``AgentSampler``, the turns of a group of episodes over any sampler's ``generate``;
- ``llm.agents.setup``: the run's agent from its config, checked at start-up.

The built-in agent task is a task (``llm.tasks.arithmetic_tools``), its reward functions rewards
(``llm.rewards.agents``), its data command a command (``python -m llm agent-data``).
"""
