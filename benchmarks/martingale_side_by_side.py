"""martingale 0.2.0 and this project's ``watch`` on one TRL 1.16 GRPOTrainer run, side by side (docs/integrations.md).

    .venv-bench/bin/python benchmarks/martingale_side_by_side.py     # (make check-martingale) about 1 minute

Two runs of TRL's own trainer on the built-in tiny model and task, each with both attached (martingale's
``MartingaleGRPOTrainer`` with its ``MartingaleRecorder``, then ``watch(trainer, ...)`` on that trainer):

1. healthy: 8 optimiser steps over 2 generations (steps_per_generation 2, num_iterations 2: lags 0-3), float32,
   held-out prompts on; printed: martingale's ``doctor`` table and ours by lag, then one table of both;
2. the fault martingale's first real run found: a float32 trainer beside a bf16 engine whose weights never change
   (tests/llm/trl_harness.py's ``DeltaEngine``: each sync's change is added in bf16 and rounds away);
   printed: each one's alarms and our sync check per step.

martingale runs from .venv-bench (``pip install --no-deps martingale==0.2.0 click``: its ``trl`` extra pins TRL
1.13.0, and it warns that TRL 1.16 is untested). Its ``halt_on_error`` is set False, so an alarm of its own does not
stop the run. Prints the tables; exits 1 if a run fails.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "llm"))
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def run(case: str, out: Path) -> dict:
    """One run with both attached: our rows and summary, martingale's alarms and doctor report."""
    import torch
    from datasets import Dataset
    from martingale.integrations.trl import MartingaleGRPOMixin, MartingaleRecorder
    from martingale.integrations._trl_callback import MartingaleMonitor, build_callback_class
    from transformers import AutoModelForCausalLM, TrainerCallback

    import trl_harness as T
    from llm.integrations.trl import watch
    from llm.models.model import load_tokenizer
    from llm.models.tiny import tiny_model_dir

    base = T.DeltaEngine if case == "fault" else T.trl.GRPOTrainer

    class Both(MartingaleGRPOMixin, base):  # martingale's mixin on TRL's trainer (or the stand-in engine's)
        pass

    model_dir = tiny_model_dir()
    tok = load_tokenizer(str(model_dir))
    recorder = MartingaleRecorder(str(out / "martingale_ws"), tokenizer=tok)
    settings = dict(output_dir=str(out / "trl"), num_generations=8, per_device_train_batch_size=32,
                    max_completion_length=6, beta=0.0, logging_steps=1, report_to="none", save_strategy="no",
                    use_cpu=True, seed=0, bf16=False, disable_tqdm=True)
    if case == "fault":
        settings.update(max_steps=12, learning_rate=1e-4, per_device_train_batch_size=64)
    else:
        settings.update(max_steps=8, learning_rate=3e-4, steps_per_generation=2, num_iterations=2)
    rows = []

    class Logs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                rows.append(dict(logs))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Both(model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                       reward_funcs=T.exact_reward, args=T.trl.GRPOConfig(**settings),
                       train_dataset=Dataset.from_dict({"prompt": list(T.TASK.prompts), "answer": list(T.TASK.answers)}),
                       processing_class=tok, callbacks=[Logs()])
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # TRL's printed log dicts: the tables below say what both logged
    trainer.flight_recorder = recorder
    monitor = MartingaleMonitor(recorder, None, halt_on_error=False)
    callback = build_callback_class(TrainerCallback)(monitor)
    callback.trainer = trainer
    trainer.add_callback(callback)
    lines = []
    watch(trainer, reward_range=(0, 1), heldout_prompts=8 if case == "healthy" else 0, log=lines.append)
    trainer.train()
    alarms = [f"step {a.step}: {a.kind} ({a.level}): {a.message}" for a in getattr(monitor, "alarms", [])]
    doctor = subprocess.run([sys.executable, "-c", "from martingale.cli import cli; cli()", "doctor", "--dir",
                             str(out / "martingale_ws"), "--json", str(out / "doctor.json")], capture_output=True,
                            text=True)
    if doctor.returncode != 0:
        raise RuntimeError(f"martingale doctor failed: {doctor.stderr.strip()[-300:]}")
    report = json.loads((out / "doctor.json").read_text()) if (out / "doctor.json").exists() else {}
    return {"rows": rows, "ours": trainer.offpolicy_watch.summary(), "lines": lines, "alarms": alarms,
            "doctor_md": doctor.stdout, "doctor": report}


def main() -> int:
    import torch

    torch.set_num_threads(2)
    failed = 0
    for case in ("healthy", "fault"):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                res = run(case, Path(tmp))
            except Exception as exc:  # noqa: BLE001 - a comparison script: say what failed, go on
                print(f"== {case}: FAILED: {type(exc).__name__}: {exc}")
                failed += 1
                continue
        print(f"== {case}: martingale doctor")
        print(res["doctor_md"].strip() or "(no report)")
        print(f"== {case}: martingale alarms ({len(res['alarms'])})")
        for line in res["alarms"]:
            print("   ", line[:300])
        print(f"== {case}: watch, by lag")
        for row in res["ours"]["per_lag"]:
            print("   ", {k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v) for k, v in row.items()})
        print(f"== {case}: watch, per step (lag, TV +- se, ESS, sync check mean/max, engine mismatch TV)")
        for i, r in enumerate(res["rows"]):
            print(f"    step {i}: lag {r.get('lag')}, TV {r.get('tv/pi_k_alpha', float('nan')):.4f} +- "
                  f"{r.get('tv/pi_k_alpha_se', float('nan')):.4f}, ESS {r.get('ess/pi_k_alpha', float('nan')):.4f}, "
                  f"logp_diff {r.get('sampling/logp_diff_mean', float('nan')):.2e}/"
                  f"{r.get('sampling/logp_diff_max', float('nan')):.2e}, mismatch "
                  f"{r.get('tv/engine_mismatch', float('nan')):.4f}"
                  + (f", heldout improvement_lcb {r['heldout/improvement_lcb']:.3f}" if r.get("heldout/improvement_lcb")
                     is not None else ""))
        print(f"== {case}: watch, lines")
        for line in res["lines"]:
            print("   ", line.splitlines()[0][:300])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
