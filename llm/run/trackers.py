"""Experiment trackers (``--report-to``): every row of ``metrics.jsonl`` goes to each tracker asked for, under
the same metric names and at the same step. Each tracker's package is imported only when it is asked for;
a missing one is refused at start-up in one line. ``metrics.jsonl`` stays the source of truth.

- ``tensorboard``: event files in ``<output_dir>/tensorboard`` (``tensorboard --logdir <output_dir>``).
- ``wandb``: a run in the project ``$WANDB_PROJECT`` (default ``offpolicy-grpo``) named after ``output_dir``,
  with the config; ``WANDB_MODE=offline`` keeps it on disk under ``<output_dir>/wandb``. A resumed run continues
  the same W&B run (its id is derived from ``output_dir``).
- ``trackio``: ``trackio.init`` / ``trackio.log`` in the same project (not installed or tested here).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from runkit.cli import RunError, first_line

from llm.config import GRPOConfig
from llm.run.output import as_text

PROJECT = "offpolicy-grpo"

#: The package each tracker needs, for the start-up error.
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


def cell(value):
    """A table's cell: a number as it is, None as nan, anything else (a conversation, an episode) as one text."""
    if value is None:
        return float("nan")
    return value if isinstance(value, (int, float)) else as_text(value)


def scalars(row: dict) -> dict[str, float]:
    """The metrics of a row a tracker takes: every number but ``step`` (which is the tracker's step)."""
    return {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


class TensorBoard:
    def __init__(self, config: GRPOConfig, run_path: Path):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writer = SummaryWriter(log_dir=str(run_path / "tensorboard"))

    def log(self, step: int, row: dict) -> None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()  # a killed run keeps every row it logged

    def table(self, step: int, rows: list[dict]) -> None:
        columns = list(rows[0])
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(str(cell(r[c])).replace("|", "\\|").replace("\n", " ") for c in columns) + " |"
                  for r in rows]
        self.writer.add_text("completions", "\n".join(lines), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandB:
    def __init__(self, config: GRPOConfig, run_path: Path):
        import wandb

        run_id = hashlib.sha1(str(run_path.resolve()).encode()).hexdigest()[:12]
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=run_path.name, id=run_id,
                              resume="allow", dir=str(run_path), config=config.to_dict())

    def log(self, step: int, row: dict) -> None:
        self.run.log(scalars(row), step=step)

    def table(self, step: int, rows: list[dict]) -> None:
        import wandb

        columns = list(rows[0])
        self.run.log({"completions": wandb.Table(columns=columns, data=[[cell(r[c]) for c in columns] for r in rows])},
                     step=step)

    def close(self) -> None:
        self.run.finish()


class Trackio:
    def __init__(self, config: GRPOConfig, run_path: Path):
        import trackio

        self.trackio = trackio
        trackio.init(project=os.environ.get("TRACKIO_PROJECT", PROJECT), name=run_path.name,
                     config=config.to_dict())

    def log(self, step: int, row: dict) -> None:
        self.trackio.log(scalars(row), step=step)

    def table(self, step: int, rows: list[dict]) -> None:
        pass  # trackio's tables are not wired (it is not installed or tested here)

    def close(self) -> None:
        self.trackio.finish()


BACKENDS = {"tensorboard": TensorBoard, "wandb": WandB, "trackio": Trackio}


def missing(name: str, why: str = "") -> ValueError:
    """The one-line error for a tracker whose package is not installed."""
    return ValueError(f"report_to: {name} needs the {PACKAGES[name]} package, which is not installed "
                      f"(pip install {PACKAGES[name]}{'; ' + why if why else ''})")


def check_trackers(output) -> None:
    """Refuse, in one line, a tracker of the output group's ``report_to`` whose package is not installed (before any
    is started)."""
    for name in output.report_to:
        if name != "none" and importlib.util.find_spec(PACKAGES[name]) is None:
            raise missing(name)


class Trackers:
    """The trackers of ``config.output.report_to``; ``trackers(step, row)`` logs a row to each (a step callback of
    ``llm.train``)."""

    def __init__(self, config: GRPOConfig, run_path: Path):
        self.backends = []
        for name in config.output.report_to:
            if name == "none":
                continue
            try:
                self.backends.append(BACKENDS[name](config, Path(run_path)))
            except ImportError as exc:  # installed, but something it imports is not
                self.close()
                raise missing(name, str(exc.name or exc)) from None
            except Exception as exc:  # a tracker that will not start (W&B without a login or WANDB_MODE=offline)
                self.close()
                raise RunError(f"report_to: {name} did not start ({type(exc).__name__}: {first_line(exc)})") from None

    def __call__(self, step: int, row: dict) -> None:
        for backend in self.backends:
            backend.log(step, row)

    def table(self, step: int, rows: list[dict]) -> None:
        """``log_completions``'s rows to each tracker (TensorBoard: a markdown table as text; W&B: a table)."""
        for backend in self.backends:
            backend.table(step, rows)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
        self.backends = []
