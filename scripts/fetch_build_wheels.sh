#!/usr/bin/env bash
# The wheels an install needs that a GPU machine with torch may lack: pip's isolated build's
# setuptools (pyproject.toml's build requirement) and CUDA's binary utilities (setup.cfg's
# install_requires, for `scratchops sass`), put in .whl/ (git-ignored) for a machine without
# a network, such as the GPU machine: run this
# where there is a network, carry .whl/ along, and install there with
#   PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl python3 -m pip install -e .
# (scripts/gpu_check.sh sets both). setuptools is pure Python (py3-none-any); the binary
# utilities are Linux x86_64 wheels, for the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download --no-deps --only-binary=:all: -d .whl "setuptools>=64"
python3 -m pip download --no-deps --only-binary=:all: --platform manylinux2014_x86_64 -d .whl \
    nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
ls .whl
