"""log pi_k/alpha at lag 0 under top-p on the real model: ``python benchmarks/archive/lag0_bias.py --dtype float32|bfloat16``.

With ``--top-p 1 --dtype bfloat16`` it measures the bfloat16 sync check's rounding floor (the logged
``sampling/logp_diff_mean`` and ``_max`` per step), and with ``--skip-syncs`` the same after syncs that never reach the
engine (one and two steps stale): the numbers ``llm.tensors.sync_probe.SYNC_CHECKS`` quotes.

SmolLM2-135M-Instruct with the in-process vLLM engine on ``make run-real``'s task and settings, top-p 0.9, v = 1 (every
step at lag 0, so pi_k's weights are alpha's and any mean of log pi_k/alpha is the rule's or the rounding's), 3 steps.
Per step, over the completion tokens: how many the trainer's or the sampler's filter dropped (one side's off-set
value: the two engines' roundings put a boundary token on different sides), and over the rest the mean of
log pi_k/alpha = the trainer's log-probability minus vLLM's, with its standard error. docs/theory.md, §1.1 quotes it.
"""

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--skip-syncs", action="store_true", help="the engine never gets the synced weights")
    args = ap.parse_args()
    import llm.tensors.sync_probe as sync_probe
    from llm import GRPOConfig, train
    from llm.tensors.token_filter import ON_SET_LOGP
    from llm.models.pretrained import smollm2_dir

    plain = sync_probe.sampler_gap

    def report(logp_sampler, logp_trainer, mask):  # the trainer's comparison of the two, every step with --tv-diagnostics
        on = mask > 0
        a, b = logp_sampler[on].double(), logp_trainer[on].double()
        both = (a > ON_SET_LOGP) & (b > ON_SET_LOGP)
        d = (b - a)[both]
        print(f"{int(on.sum())} tokens, {int((b <= ON_SET_LOGP).sum())} off the trainer's kept set, "
              f"{int((a <= ON_SET_LOGP).sum())} off vLLM's; mean log pi_k/alpha over the rest {float(d.mean()):+.2e} "
              f"(standard error {float(d.std() / d.numel() ** 0.5):.1e})", flush=True)
        return plain(logp_sampler, logp_trainer, mask)

    sync_probe.sampler_gap = report
    config = GRPOConfig(
        model_name_or_path=str(smollm2_dir(log=lambda *a: None)), dataset="reasoning_gym:basic_arithmetic",
        generator_kwargs=("min_terms=2", "max_terms=2", "min_digits=1", "max_digits=1"), generator_test_size=150,
        chat_template=True, temperature=0.7, max_completion_length=24, prompts_per_step=8, learning_rate=1e-5,
        beta=0.0, max_steps=3, sync_period=1, sampler="vllm", dtype=args.dtype, tv_diagnostics=True, exact_j=False,
        top_p=args.top_p, progress=False, output_dir=tempfile.mkdtemp(prefix="lag0_bias_"))
    from llm.run.rundir import read_metrics
    from fixtures.seams import SkipSyncs

    print("the start-up probe's 16 tokens first, then the 3 steps:")
    rows = read_metrics(train(config, log=lambda *a: None, callbacks=[SkipSyncs()] if args.skip_syncs else []))
    for r in rows:
        print(f"step {r['step']}: sampling/logp_diff_mean {r['sampling/logp_diff_mean']:.3g}, "
              f"sampling/logp_diff_max {r['sampling/logp_diff_max']:.3g}")


if __name__ == "__main__":
    main()
