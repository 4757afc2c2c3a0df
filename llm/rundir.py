"""Run directory: config.json, metrics.jsonl, atomic checkpoints, resume.

Layout of ``output_dir``:
    config.json       resolved config, written before step 0
    metrics.jsonl     one JSON object per completed step, flushed per line
    checkpoint.pt     latest checkpoint (written to a temporary file, then renamed: atomic)
    samples.jsonl     a few decoded completions at every checkpoint
    final_model/      the trained model and tokenizer (transformers format)
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from runkit.runio import MetricsWriter, atomic_write_text, read_metrics, write_config

from .config import GRPOConfig

__all__ = ["RunDir", "read_metrics", "RESUMABLE_FIELDS"]

#: Fields that may change when a run is resumed (they do not change what a step computes, up to float rounding
#: for the micro-batch and chunk sizes; a restarted server may listen elsewhere).
RESUMABLE_FIELDS = {"max_steps", "logging_steps", "save_steps", "progress", "num_threads", "output_dir",
                    "server_url", "server_timeout", "server_sync_address", "per_device_train_batch_size",
                    "gradient_checkpointing", "logit_chunk_tokens"}


class RunDir:
    def __init__(self, config: GRPOConfig):
        self.path = Path(config.output_dir)
        self.config = config

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoint.pt"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    def open(self) -> dict | None:
        """Create the directory, check a previous run is compatible, write config.json.

        Returns the checkpoint to resume from, or None for a fresh start.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        ckpt = None
        if self.checkpoint_path.is_file():
            old_path = self.path / "config.json"
            if old_path.is_file():
                new = json.loads(self.config.to_json())
                # A field the stored config lacks was added after that run started, which ran with its default.
                old = {**json.loads(GRPOConfig().to_json()), **json.loads(old_path.read_text())}
                diff = sorted(k for k in set(old) | set(new) if k not in RESUMABLE_FIELDS and old.get(k) != new.get(k))
                if diff:
                    raise ValueError(
                        f"output_dir: {self.path} holds a run with a different config ({', '.join(diff)}); "
                        "use a new output_dir or the same settings to resume")
            ckpt = torch.load(self.checkpoint_path, map_location="cpu", weights_only=False)
            self._truncate_metrics(ckpt["step"])
        else:
            for name in ("metrics.jsonl", "samples.jsonl"):
                (self.path / name).unlink(missing_ok=True)
        write_config(self.path, self.config)
        return ckpt

    def _truncate_metrics(self, next_step: int) -> None:
        """Keep exactly the rows of steps < next_step (rows written after the checkpoint are redone)."""
        if not self.metrics_path.is_file():
            return
        keep = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash
            if row.get("step", math.inf) < next_step:
                keep.append(line)
        atomic_write_text(self.metrics_path, "".join(k + "\n" for k in keep))

    def append_metrics(self, row: dict) -> None:
        MetricsWriter(self.path, fresh=False).write(row)

    def append_samples(self, rows: list[dict]) -> None:
        with (self.path / "samples.jsonl").open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")

    def save_checkpoint(self, state: dict) -> None:
        tmp = self.checkpoint_path.with_name("checkpoint.pt.tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.checkpoint_path)
