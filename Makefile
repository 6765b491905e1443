# The two commands a new machine needs: `make demo` and `make test` (see README).
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.asyncrl-installed
DEMO_DIR ?= outputs/demo

.PHONY: setup demo test lint format

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	VENV=$(VENV) bash scripts/setup.sh
	touch $(STAMP)

demo: setup
	$(BIN)/asyncrl init-model --preset small --output_dir $(DEMO_DIR)/base
	$(BIN)/asyncrl sft examples/reverse_text/sft.yaml --model $(DEMO_DIR)/base --output_dir $(DEMO_DIR)/sft
	$(BIN)/asyncrl eval examples/reverse_text/eval.yaml --model $(DEMO_DIR)/sft/final

test: setup lint
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .
