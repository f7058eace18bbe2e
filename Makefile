# taotrace — the two commands a newcomer needs: `make demo` and `make test`.
#
# Each target installs only what it runs into .venv (pyproject.toml's extras): `demo`, `serve`,
# `sim` and `bench` the runtime, `test` the runtime + [test,stack], `lint` those + [lint], `venv`
# everything ([dev]). Recipes are quiet (`@`, pip's chatter on stderr), so
# `make demo ARGS="--once --json"` prints only JSON on stdout.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
ARGS   ?=
# What `make lint` checks (ruff's settings and mypy's are in pyproject.toml).
LINT_PATHS := proxy tests deploy

.PHONY: venv system-deps test lint demo serve sim bench screenshots clean

$(PY):
	@$(PYTHON) -m venv $(VENV)

# One stamp per set of extras; each reinstalls when pyproject.toml changes.
$(VENV)/.installed-runtime: pyproject.toml | $(PY)
	@$(PY) -m pip install -q -e . >&2
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(PY)
	@$(PY) -m pip install -q -e '.[test,stack]' >&2
	@touch $@

$(VENV)/.installed-lint: pyproject.toml | $(PY)
	@$(PY) -m pip install -q -e '.[test,stack,lint]' >&2
	@touch $@

$(VENV)/.installed-dev: pyproject.toml | $(PY)
	@$(PY) -m pip install -q -e '.[dev]' >&2
	@touch $@

venv: $(VENV)/.installed-dev

# System tools the tests drive for real (Prometheus, promtool; chromium for the live view; ss from
# iproute2). Installed only when missing, and only when we are root (CI is); otherwise the tests
# that need them say so and skip.
system-deps:
	@if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1 || ! command -v amtool >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus prometheus-alertmanager >/dev/null; \
	  else echo "prometheus/promtool/amtool missing and not root: their tests will skip"; fi; \
	fi
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null; \
	  else echo "chromium missing and not root: the live view's browser tests will skip"; fi; \
	fi
	@if ! command -v ss >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null; \
	  else echo "ss (iproute2) missing and not root: the TCP_INFO cross-check will skip"; fi; \
	fi

test: $(VENV)/.installed-test system-deps
	$(PY) -m pytest -q $(ARGS)

# ruff (lint, then format check) and mypy --strict with the pydantic plugin; CI runs it first.
lint: $(VENV)/.installed-lint
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy

demo: $(VENV)/.installed-runtime
	@$(VENV)/bin/taotrace demo $(ARGS)

serve: $(VENV)/.installed-runtime
	@$(VENV)/bin/taotrace serve $(ARGS)

sim: $(VENV)/.installed-runtime
	@$(VENV)/bin/taotrace sim $(ARGS)

# The README's pictures of the live view, written by its browser test against `taotrace demo`.
screenshots: $(VENV)/.installed-test system-deps
	UI_SCREENSHOTS=docs $(PY) -m pytest -q tests/test_ui_browser.py

bench: $(VENV)/.installed-runtime
	@$(PY) tests/bench/run.py $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis .mypy_cache .ruff_cache
