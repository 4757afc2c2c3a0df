"""Test callbacks that reach a run through its public seam: ``train(config, callbacks=[...])`` hands each callback with
an ``on_setup`` method the run's ``llm.step.weights.Weights`` before step 0, and calls it with every step's row; and
``tag_generations``, which records which weights the transformers sampler held at each generation call."""

from __future__ import annotations

import torch

from llm.models.model import plain_state_dict


def fingerprint(model) -> tuple[float, ...]:
    """The model's weights, summarised exactly enough to tell the policies of different steps apart."""
    return tuple(float(t.double().sum()) for _, t in sorted(plain_state_dict(model).items()))


class TrainerPasses:
    """Per step, how many times the trainer ran the decoder of ``which`` (policy, alpha or ref) outside generation:
    the decoder's calls less those of the whole model (``generate`` calls the whole model, the trainer's passes call
    its decoder), counting only calls with gradients on or off as ``grad`` says (None: both)."""

    def __init__(self, which: str, grad: bool | None = None):
        self.which, self.grad, self.per_step, self._decoder, self._whole = which, grad, [], 0, 0

    def on_setup(self, weights) -> None:
        model = getattr(weights, self.which)
        model.get_decoder().register_forward_hook(lambda *a: self._count("_decoder"))
        model.register_forward_hook(lambda *a: self._count("_whole"))

    def _count(self, name: str) -> None:
        if self.grad is None or torch.is_grad_enabled() == self.grad:
            setattr(self, name, getattr(self, name) + 1)

    def __call__(self, step: int, row: dict) -> None:
        self.per_step.append(self._decoder - self._whole)
        self._decoder = self._whole = 0


class SkipSyncs:
    """The sampler never receives the weights of a sync (as a sampler that silently failed to load them): its
    ``load_weights`` does nothing from step 0 on."""

    def on_setup(self, weights) -> None:
        weights.sampler.load_weights = lambda model: None

    def __call__(self, step: int, row: dict) -> None:
        pass


class PolicyFingerprints:
    """The policy's weights before any update (``before[0]``) and after each step (``before[k + 1]``): pi_k of step k is
    ``before[k]``."""

    def __init__(self):
        self.before, self.weights = [], None

    def on_setup(self, weights) -> None:
        self.weights = weights
        self.before.append(fingerprint(weights.policy))

    def __call__(self, step: int, row: dict) -> None:
        self.before.append(fingerprint(self.weights.policy))


def tag_generations(monkeypatch) -> dict:
    """Record, for every call of the transformers sampler, its weights' fingerprint under the call's seed: the
    returned dict fills in as the run generates (seed -> fingerprint of the weights that generated the call)."""
    from llm.sampling import TransformersSampler

    generated, real_generate = {}, TransformersSampler.generate

    def tagged_generate(self, prompt_ids, n, max_tokens, temperature, seed, greedy=False, **kwargs):
        generated[seed] = fingerprint(self.model)
        return real_generate(self, prompt_ids, n, max_tokens, temperature, seed, greedy, **kwargs)

    monkeypatch.setattr(TransformersSampler, "generate", tagged_generate)
    return generated
