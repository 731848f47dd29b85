"""CudaError formatting and result-tuple unwrapping (no GPU needed)."""

import pytest
from cuda.bindings import driver as cu

from inferno.cuda import gpu_count
from inferno.cuda.errors import CudaError, check
from inferno.errors import InfernoError


def test_check_unwraps_values():
    ok = cu.CUresult.CUDA_SUCCESS
    assert check((ok,), "cuCtxSynchronize") is None
    assert check((ok, 7), "cuDeviceGetCount") == 7
    assert check((ok, 1, 2), "cuMemGetInfo") == (1, 2)


def test_check_raises_with_call_and_result_name():
    with pytest.raises(CudaError) as e:
        check((cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None), "cuMemAlloc")
    err = e.value
    assert (err.call, err.result) == ("cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY")
    assert str(err).startswith("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY")
    assert "free GPU memory" in str(err)  # the hint says what to do
    assert isinstance(err, InfernoError)


def test_context_prefix_and_hint():
    with pytest.raises(CudaError, match=r"^loading 'gemm': cuLibraryLoadData failed: CUDA_ERROR_NO_BINARY_FOR_GPU.*rebuild"):
        check((cu.CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU, None), "cuLibraryLoadData", "loading 'gemm'")


def test_message_is_one_line():
    err = CudaError("cuLaunchKernel", "CUDA_ERROR_INVALID_VALUE", "invalid argument", "kernel k")
    assert "\n" not in str(err)


def test_gpu_count_never_raises():
    n = gpu_count()
    assert isinstance(n, int) and n >= 0
