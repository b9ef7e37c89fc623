"""Device parametrization: every test that takes `device` runs on the CPU and, where this
machine, torch and the hdk build allow, on CUDA; otherwise the CUDA case is skipped with the
reason."""

import pytest
import torch

import hdk


def cuda_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    if not hdk.extension_has_cuda():
        return "the hdk torch extension was built without CUDA support"
    if not hdk.built_with_cuda():
        return "libhdk was built without its CUDA backend (build with HDK_PREBUILT_LIB)"
    return None


CUDA_SKIP = cuda_skip_reason()

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(CUDA_SKIP is not None, reason=str(CUDA_SKIP))),
]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def pytest_report_header(config):
    return (
        f"hdk {hdk.__version__}: torch {torch.__version__}, libhdk CUDA backend "
        f"{hdk.built_with_cuda()}, extension CUDA {hdk.extension_has_cuda()}, "
        f"CUDA tests: {'run' if CUDA_SKIP is None else 'skipped: ' + CUDA_SKIP}"
    )
