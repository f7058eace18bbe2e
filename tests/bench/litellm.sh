#!/usr/bin/env bash
# LiteLLM proxy for the benchmark, in its own virtual environment (never the project's).
#   litellm.sh install          create tests/bench/.litellm-venv with the pinned version
#   litellm.sh run CONFIG PORT  run the proxy: one worker, on 127.0.0.1 only
# Pinned: the newest release whose [proxy] extra resolves from PyPI here (1.107.0 was a
# compromised release; later ones need a litellm-proxy-extras that is not published).
set -euo pipefail
LITELLM_VERSION="${LITELLM_VERSION:-1.106.12}"
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="$HERE/.litellm-venv"
PYTHON="${PYTHON:-python3}"

case "${1:-}" in
  install)
    if [ -x "$VENV/bin/litellm" ] && "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('litellm') != '$LITELLM_VERSION')"; then
      exit 0
    fi
    echo "installing litellm[proxy]==$LITELLM_VERSION into $VENV (a few minutes, once)" >&2
    test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2
    "$VENV/bin/python" -m pip install -q "litellm[proxy]==$LITELLM_VERSION" >&2
    ;;
  run)
    CONFIG="$2"; PORT="$3"
    # No telemetry, no cost-map download, no UI, no feedback banner: its forwarding path only.
    export LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY=False LITELLM_LOG=ERROR \
           LITELLM_DONT_SHOW_FEEDBACK_BOX=true DISABLE_ADMIN_UI=True NO_DOCS=True NO_REDOC=True \
           LITELLM_MODE=PRODUCTION
    # A master key is required to start; the bench client sends it (no database: a plain compare).
    export LITELLM_MASTER_KEY="${LITELLM_MASTER_KEY:-sk-bench-7f3a9c2e4b1d8f6a0e5c3b7d9a1f2e4c}"
    exec "$VENV/bin/litellm" --config "$CONFIG" --host 127.0.0.1 --port "$PORT" --num_workers 1
    ;;
  *) echo "usage: $0 install | run CONFIG PORT" >&2; exit 2 ;;
esac
