import pytest

from scratchops.tools.timing import tf32_disabled


@pytest.fixture(autouse=True, scope="session")
def _true_fp32_references():
    # torch's fp32 references must be true fp32: no TF32 in matmul or cuDNN convolutions.
    with tf32_disabled():
        yield
