# taotrace — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
ARGS   ?=

.PHONY: venv system-deps test demo serve sim bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

# System tools the tests drive for real (Prometheus, promtool). Installed only when missing,
# and only when we are root (CI is); otherwise the tests that need them say so and skip.
system-deps:
	@if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1 || ! command -v amtool >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus prometheus-alertmanager >/dev/null; \
	  else echo "prometheus/promtool/amtool missing and not root: their tests will skip"; fi; \
	fi

test: venv system-deps
	$(PY) -m pytest -q $(ARGS)

demo: venv
	$(VENV)/bin/taotrace demo $(ARGS)

serve: venv
	$(VENV)/bin/taotrace serve $(ARGS)

sim: venv
	$(VENV)/bin/taotrace sim $(ARGS)

bench: venv
	$(PY) tests/bench/run.py $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
