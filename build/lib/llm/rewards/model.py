"""A reward model as a reward function: a sequence-classification model directory (or hub name) in
``--reward-funcs``, as TRL's ``reward_funcs`` takes one.

The model scores each prompt and completion together: text prompts joined with their completion; conversations
(TRL's conversational format) rendered with the reward model's own chat template, the completion as the assistant's
message. The score is the first logit (``num_labels`` 1), any real number: the run maps rewards outside [0, 1] onto
the range Theorem 1 needs by the range seen (docs/data.md), as for any reward function.
"""

from __future__ import annotations

from pathlib import Path

import torch

from runkit.cli import first_line

#: Sequences per forward pass of a reward model.
REWARD_MODEL_BATCH = 32


def is_reward_model(spec: str) -> bool:
    """A ``--reward-funcs`` entry that names a model rather than ``module:function`` or a built-in: a local
    directory with a config.json whose architecture is a sequence classifier."""
    path = Path(spec)
    if ":" in spec or not (path / "config.json").is_file():
        return False
    import json

    archs = json.loads((path / "config.json").read_text()).get("architectures") or []
    return any(a.endswith("ForSequenceClassification") for a in archs)


class RewardModel:
    """Scores (prompt, completion) pairs with a sequence-classification model, in TRL's reward-function signature."""

    def __init__(self, path: str, device: str | torch.device = "cpu", trust_remote_code: bool = False):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
            self.model = AutoModelForSequenceClassification.from_pretrained(
                path, num_labels=1, trust_remote_code=trust_remote_code).to(device).eval()
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"reward_funcs: cannot load the reward model {path}: {first_line(exc)}") from None
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.__name__ = Path(path).name or str(path)
        self.device = device

    def texts(self, prompts: list, completions: list) -> list[str]:
        """What the model reads: the prompt followed by the completion (conversations through its template)."""
        out = []
        for p, c in zip(prompts, completions, strict=True):
            if isinstance(p, list):
                messages = p + (c if isinstance(c, list) else [{"role": "assistant", "content": c}])
                out.append(self.tokenizer.apply_chat_template(messages, tokenize=False))
            else:
                out.append(p + (c[0]["content"] if isinstance(c, list) else c))
        return out

    @torch.no_grad()
    def __call__(self, prompts: list, completions: list, **kwargs) -> list[float]:
        texts, scores = self.texts(prompts, completions), []
        for s in range(0, len(texts), REWARD_MODEL_BATCH):
            enc = self.tokenizer(texts[s:s + REWARD_MODEL_BATCH], return_tensors="pt", padding=True,
                                 add_special_tokens=False).to(self.device)
            scores += self.model(**enc).logits[:, 0].float().tolist()
        return scores
