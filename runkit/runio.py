"""Run directories shared by the bandit simulator and the LLM trainer: ``config.json`` + ``metrics.jsonl``."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_config(run_dir: str | Path, config) -> Path:
    """Write the resolved config (a dataclass) as config.json, atomically; returns the directory."""
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    data = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    atomic_write_text(path / "config.json", json.dumps(data, indent=1, sort_keys=True))
    return path


class MetricsWriter:
    """Append one JSON object per step to metrics.jsonl, flushed per line."""

    def __init__(self, run_dir: str | Path, fresh: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        if fresh:
            self.path.unlink(missing_ok=True)

    def write(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def read_metrics(run_dir: str | Path) -> list[dict]:
    """All rows of a run's metrics.jsonl (lines cut by a crash are skipped)."""
    rows = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_config(run_dir: str | Path) -> dict:
    return json.loads((Path(run_dir) / "config.json").read_text())


def load_runs(root: str | Path) -> dict[str, list[list[dict]]]:
    """{configuration directory name: [metrics rows of each ``seed*`` run directory]} under ``root``."""
    out = {}
    for conf in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        out[conf.name] = [read_metrics(s) for s in sorted(conf.glob("seed*"))]
    return out
