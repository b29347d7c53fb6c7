#!/usr/bin/env bash
# The wheels pip's isolated build needs (setuptools: pyproject.toml's build requirement), put
# in .whl/ (git-ignored) for a machine without a network, such as the GPU machine: run this
# where there is a network, carry .whl/ along, and install there with
#   PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl python3 -m pip install -e .
# (scripts/gpu_check.sh sets both). The wheel is pure Python (py3-none-any): any platform.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download --no-deps --only-binary=:all: -d .whl "setuptools>=64"
ls .whl
