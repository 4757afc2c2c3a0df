"""One step of Algorithm 1, phase by phase: the sync clock, the rollouts, the phases, the weights."""
