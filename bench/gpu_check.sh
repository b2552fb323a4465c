#!/usr/bin/env bash
# `make gpu-check OUT=DIR`: bench/gpu_check.py with a Python that has torch, on a machine that
# may have no network. The checkout's venv where there is one (this machine: no GPU, so the plan
# is printed); else python3 (a GPU machine's own torch), with the wheels bench/gpu_wheels.py put
# in .whl/ installed beside it first for what that machine lacks (pydantic, paramiko, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bench/gpu_check.sh OUT_DIR [gpu_check.py options]}"
shift
if [ -x .venv/bin/python ]; then
    py=.venv/bin/python
else
    py=$(command -v python3)
    if ! "$py" -c 'import pydantic, paramiko' 2>/dev/null; then
        if ! ls .whl/*.whl >/dev/null 2>&1; then
            echo "gpu-check: $py lacks pydantic/paramiko and .whl/ holds no wheels: run bench/gpu_wheels.py where pip works" >&2
            exit 2
        fi
        site=$(mktemp -d /tmp/labctl-gpu-site.XXXXXX)
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
fi
exec "$py" bench/gpu_check.py "$out" "$@"
