import os
import zlib

import pytest

# Under pytest-xdist on a machine of several GPUs (scripts/gpu_check.sh's pytest step sets
# SCRATCHOPS_TEST_GPUS to their number): worker gwK sees the GPUs rotated by K, so that the
# workers' default devices differ while a test that needs two GPUs still finds them. Set
# before anything initialises CUDA in the worker.
_worker = os.environ.get("PYTEST_XDIST_WORKER")
_gpus = int(os.environ.get("SCRATCHOPS_TEST_GPUS", "0"))
if _worker and _gpus > 1 and "CUDA_VISIBLE_DEVICES" not in os.environ:
    _first = int(_worker.removeprefix("gw"))
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str((_first + i) % _gpus) for i in range(_gpus))

import torch  # noqa: E402 (after the GPUs are set)

from scratchops.tools.timing import tf32_disabled  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _true_fp32_references():
    # torch's fp32 references must be true fp32: no TF32 in matmul or cuDNN convolutions.
    with tf32_disabled():
        yield


@pytest.fixture(autouse=True)
def _seed_of_its_own(request):
    # Each test draws its random inputs after a seed of its own (its id's CRC-32, plus
    # SCRATCHOPS_TEST_SEED where set: another draw of every test), so that what it draws does
    # not hang on which tests ran before it in the process, an order that differs when the
    # tests are spread over workers. Inputs stay random, and a failure repeats.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode())
                      + int(os.environ.get("SCRATCHOPS_TEST_SEED", "0")))
