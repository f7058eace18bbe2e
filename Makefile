# taotrace — the two commands a newcomer needs: `make demo` and `make test` (`make test-fast`: the unit tier).
#
# Each target installs only what it runs into .venv (pyproject.toml's extras): `demo`, `probe`,
# `doctor`, `serve`, `sim` and `bench` the runtime, `test` the runtime + [test,stack], `lint` those + [lint], `venv`
# everything ([dev]). Recipes are quiet (`@`, pip's chatter on stderr), so
# `make demo ARGS="--once --json"` prints only JSON on stdout. PYTHON (>= 3.10) makes the venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
ARGS   ?=
# What `make lint` checks (ruff's settings and mypy's are in pyproject.toml).
LINT_PATHS := proxy tests deploy

.PHONY: venv system-deps test test-fast test-otel-range lint demo probe doctor serve sim bench screenshots clean FORCE

# What a Python says of itself: "3.12.1 pip /usr/bin/python3.12" (version, pip or nopip, path).
ABOUT := -c 'import importlib.util, sys; v = sys.version_info; print("%d.%d.%d" % v[:3], "pip" if importlib.util.find_spec("pip") else "nopip", sys.executable)'
# The versions taotrace runs on (pyproject.toml's requires-python >= 3.10), as a shell `case` pattern.
NEW_ENOUGH := 3.1[0-9].*|3.[2-9][0-9].*|[4-9].*
# "ok" when $(VENV) has a Python that is new enough and has pip. Otherwise (missing, broken by a
# Python upgrade, made by a too-old Python, or left half-made by a failed `venv`) it is made
# afresh and every install below redone: FORCE makes them all out of date.
VENV_OK := $(shell found="$$($(PY) $(ABOUT) 2>/dev/null)"; case "$$found" in (*" nopip "*) ;; ($(NEW_ENOUGH)) echo ok;; esac)
STALE := $(if $(VENV_OK),,FORCE)
GOAL := $(or $(firstword $(MAKECMDGOALS)),venv)

# Check $(PYTHON) first: one line saying what was found and what is needed, not pip's errors.
$(PY): $(STALE)
	@set -- $$($(PYTHON) $(ABOUT) 2>/dev/null); case "$$1" in $(NEW_ENOUGH)) echo "creating $(VENV) with Python $$1 ($$3)" >&2;; "") echo "make: no Python found as PYTHON=$(PYTHON); taotrace needs Python >= 3.10: install one, then make $(GOAL) PYTHON=python3.12 (for example)" >&2; exit 1;; *) echo "make: PYTHON=$(PYTHON) is Python $$1 ($$3); taotrace needs Python >= 3.10: install one, then make $(GOAL) PYTHON=python3.12 (for example)" >&2; exit 1;; esac
	@if [ -e $(VENV) ] && [ ! -e $(VENV)/pyvenv.cfg ]; then echo "make: $(VENV) exists and is not a virtualenv: move it away, or set VENV=" >&2; exit 1; fi
	@if [ -e $(VENV) ]; then echo "recreating $(VENV): its Python is missing, broken, older than 3.10 or without pip" >&2; rm -rf $(VENV); fi
	@$(PYTHON) -m venv $(VENV) >&2 || { rm -rf $(VENV); echo "make: $(PYTHON) -m venv failed (on Debian/Ubuntu: apt install python3-venv)"; exit 1; } >&2

# One stamp per set of extras; each reinstalls when pyproject.toml changes. A stamp is written
# only after its install succeeded: a failed one is tried again on the next run.
INSTALLING := echo "installing dependencies into $(VENV) (first run only)..." >&2
FAILED := { echo "make: installing into $(VENV) failed (pip's message above); run make again to retry"; exit 1; }

$(VENV)/.installed-runtime: pyproject.toml $(STALE) | $(PY)
	@$(INSTALLING)
	@$(PY) -m pip install -q -e . >&2 || $(FAILED) >&2
	@touch $@

$(VENV)/.installed-test: pyproject.toml $(STALE) | $(PY)
	@$(INSTALLING)
	@$(PY) -m pip install -q -e '.[test,stack]' >&2 || $(FAILED) >&2
	@touch $@

$(VENV)/.installed-lint: pyproject.toml $(STALE) | $(PY)
	@$(INSTALLING)
	@$(PY) -m pip install -q -e '.[test,stack,lint]' >&2 || $(FAILED) >&2
	@touch $@

$(VENV)/.installed-dev: pyproject.toml $(STALE) | $(PY)
	@$(INSTALLING)
	@$(PY) -m pip install -q -e '.[dev]' >&2 || $(FAILED) >&2
	@touch $@

FORCE:

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

# The suite, then the OpenTelemetry range's two ends (below). With ARGS (a part of the suite, or
# pytest options) only the suite runs: `make test-otel-range` runs the ends on their own.
test: $(VENV)/.installed-test system-deps
	$(PY) -m pytest -q $(ARGS)
	@$(if $(ARGS),,$(MAKE) --no-print-directory test-otel-range)

# pyproject.toml allows a range of OpenTelemetry releases (the API, the SDK and the OTLP exporter
# package, which brings the encoder and protos the tests compare with). Each end gets its own venv,
# cached by a stamp like .venv's: the runtime with all of them at that release, and the test
# tools; the oldest also with gRPC at the exporter's floor. OTEL_RANGE_TESTS run in each (~1 min).
# Moving an end of the range in pyproject.toml means moving it here too (docs/development.md).
OTEL_OLDEST := 1.28.0
OTEL_NEWEST := 1.45.2
GRPCIO_OLDEST := 1.63.2
# Spans, sampling, propagation, the equivalence with the SDK, OTLP encoding and export (HTTP,
# gRPC), the batch processor, GenAI metrics (our aggregation against the SDK's, handed to its
# exporters), and each worker's own span export.
OTEL_RANGE_TESTS := tests/test_spans.py tests/test_sampling.py tests/test_propagation.py tests/test_span_equivalence.py \
  tests/test_telemetry_otlp.py tests/test_span_exporter.py tests/test_span_pipeline.py tests/test_otlp_export.py \
  tests/test_otlp_env.py tests/test_otlp_metrics.py tests/test_genai_metrics.py tests/test_aggregate.py \
  tests/test_collector_log.py tests/test_semconv.py tests/test_otel_variables.py \
  tests/test_workers.py::test_each_worker_exports_its_spans_under_its_instance_id_and_exemplars_point_at_them
OTEL_PACKAGES = opentelemetry-api==$(1) opentelemetry-sdk==$(1) opentelemetry-exporter-otlp==$(1)
# The test tools of [test] that OTEL_RANGE_TESTS use (the rest of [test] stays out: tests/test_packaging.py checks the names).
OTEL_RANGE_TOOLS := pytest pytest-aiohttp pytest-timeout hypothesis trustme

$(VENV)-otel-oldest/.installed: PINS = $(call OTEL_PACKAGES,$(OTEL_OLDEST)) grpcio==$(GRPCIO_OLDEST)
$(VENV)-otel-newest/.installed: PINS = $(call OTEL_PACKAGES,$(OTEL_NEWEST))
$(VENV)-otel-%/.installed: pyproject.toml Makefile | $(PY)
	@if [ -e $(@D) ] && [ ! -e $(@D)/pyvenv.cfg ]; then echo "make: $(@D) exists and is not a virtualenv: move it away" >&2; exit 1; fi
	@$(@D)/bin/python -c '' 2>/dev/null || { rm -rf $(@D) && $(PY) -m venv $(@D); } >&2
	@echo "installing OpenTelemetry's $* end of the range into $(@D) (first run only)..." >&2
	@$(@D)/bin/python -m pip install -q -e . $(OTEL_RANGE_TOOLS) $(PINS) >&2 || { echo "make: installing into $(@D) failed (pip's message above); run make again to retry"; exit 1; } >&2
	@touch $@

test-otel-range: $(VENV)-otel-oldest/.installed $(VENV)-otel-newest/.installed
	@for end in oldest newest; do \
	  echo "OpenTelemetry range, $$end end: $$($(VENV)-otel-$$end/bin/python -c 'import importlib.metadata as m; print(", ".join(d + " " + m.version(d) for d in ("opentelemetry-api", "opentelemetry-sdk", "grpcio")))')"; \
	  $(VENV)-otel-$$end/bin/python -m pytest -q -p no:cacheprovider $(OTEL_RANGE_TESTS) || exit 1; \
	done

# The unit tier alone (tests/tiers.py): no processes, servers, browsers or Prometheus, so no
# system-deps either. `make test` runs it too, with the end-to-end tier.
test-fast: $(VENV)/.installed-test
	$(PY) -m pytest -q --unit $(ARGS)

# ruff (lint, then format check) and mypy --strict with the pydantic plugin; CI runs it first.
lint: $(VENV)/.installed-lint
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

demo: $(VENV)/.installed-runtime
	@$(VENV)/bin/taotrace demo $(ARGS)

serve: $(VENV)/.installed-runtime
	@$(VENV)/bin/taotrace serve $(ARGS)

# The client tools, from the venv (no need to put it on PATH): make probe ARGS="--base-url ..."
probe: $(VENV)/.installed-runtime
	@$(VENV)/bin/taotrace probe $(ARGS)

doctor: $(VENV)/.installed-runtime
	@$(VENV)/bin/taotrace doctor $(ARGS)

sim: $(VENV)/.installed-runtime
	@$(VENV)/bin/taotrace sim $(ARGS)

# The README's pictures of the live view, written by its browser test against `taotrace demo`.
screenshots: $(VENV)/.installed-test system-deps
	UI_SCREENSHOTS=docs $(PY) -m pytest -q tests/test_ui_browser.py

bench: $(VENV)/.installed-runtime
	@$(PY) tests/bench/run.py $(ARGS)

clean:
	rm -rf $(VENV) $(VENV)-otel-oldest $(VENV)-otel-newest build *.egg-info .pytest_cache .hypothesis .mypy_cache .ruff_cache
