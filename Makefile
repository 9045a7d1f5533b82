# The two commands a fresh clone needs: `make demo` and `make test`. Each creates .venv if missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export XLA_FLAGS := --xla_force_host_platform_device_count=8
export WANDB_MODE ?= offline
export JAX_PLATFORMS := cpu

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]" --config-settings editable_mode=compat
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m shardgym.demo

test: $(STAMP)
	WANDB_MODE=disabled $(BIN)/python -m pytest -n 2 --durations=15 tests

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info
