#!/usr/bin/env bash
# The virtualenv bench/routing_replay.py runs vllm-router from (PyPI vllm-router,
# the Rust router with Python bindings). Kept apart from the project's own
# environment: it is a peer to measure against, not a dependency, and CI
# does not install it.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv-vllm-router
.venv-vllm-router/bin/pip install -q --upgrade pip
.venv-vllm-router/bin/pip install -q "vllm-router==0.1.17"
.venv-vllm-router/bin/vllm-router --help > /dev/null
echo "vllm-router ready: $(pwd)/.venv-vllm-router/bin/vllm-router"
