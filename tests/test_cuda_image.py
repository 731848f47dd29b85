"""Reading a code image's target arch without a GPU, and refusing images for another GPU."""

import shutil
import struct
import subprocess

import pytest

from inferno.cuda.device import arch_name
from inferno.cuda.image import ImageError, check_arch, cubin_entries, inspect_image, parse_arch
from inferno.errors import InfernoError

PTX = """//
.version {version}
.target {target}
.address_size 64

.visible .entry add_one(.param .u64 p, .param .u32 n)
{{
  .reg .pred %p<2>; .reg .b32 %r<6>; .reg .b64 %rd<5>; .reg .f32 %f<3>;
  ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.u32 %p1, %r5, %r1; @%p1 bra DONE;
  cvta.to.global.u64 %rd2, %rd1; mul.wide.u32 %rd3, %r5, 4; add.s64 %rd4, %rd2, %rd3;
  ld.global.f32 %f1, [%rd4]; add.f32 %f2, %f1, 0f3F800000; st.global.f32 [%rd4], %f2;
DONE:
  ret;
}}
"""


def elf_header(flags: int, abi: int = 8, machine: int = 190) -> bytes:
    """A bare 64-byte ELF64 header (no sections) as a cubin would start."""
    ident = b"\x7fELF" + bytes([2, 1, 1, 0x41, abi]) + bytes(7)
    return ident + struct.pack("<HHIQQQIHHHHHH", 2, machine, 1, 0, 0, 0, flags, 64, 0, 0, 64, 0, 0)


def test_arch_names_for_compute_capabilities():
    assert arch_name((9, 0)) == "sm_90a"
    assert arch_name((12, 0)) == "sm_120a"
    assert arch_name((10, 0)) == "sm_100a"
    assert arch_name((8, 9)) == "sm_89"
    assert arch_name((8, 0)) == "sm_80"
    assert parse_arch("sm_120a") == (120, "a")
    with pytest.raises(ImageError, match="bad arch name"):
        parse_arch("hopper")


@pytest.mark.parametrize("flags,abi,sm", [(0x6005A04, 8, 90), (0x6007802, 8, 120), (0x6005004, 8, 80),
                                         (0x5A055A, 7, 90), (0x500550, 7, 80)])
def test_sm_from_elf_flags(flags, abi, sm):
    info = inspect_image(elf_header(flags, abi))
    assert (info.kind, info.sm, info.arch) == ("cubin", sm, f"sm_{sm}")


def test_non_cuda_elf_and_garbage_are_refused():
    with pytest.raises(ImageError, match="not a CUDA cubin"):
        inspect_image(elf_header(0x6005A04, machine=62))
    with pytest.raises(ImageError, match="neither a cubin"):
        inspect_image(b"hello world")
    assert issubclass(ImageError, InfernoError)


def test_ptx_target_and_version():
    info = inspect_image(PTX.format(version="8.0", target="sm_90a").encode())
    assert (info.kind, info.sm, info.arch, info.ptx_version) == ("ptx", 90, "sm_90a", "8.0")


def test_cubin_must_match_the_gpu_exactly():
    sm120 = inspect_image(elf_header(0x6007802))
    with pytest.raises(ImageError) as e:
        check_arch(sm120, "sm_90a", "kernel image 'gemm'", device_name="NVIDIA H200")
    msg = str(e.value)
    assert "sm_120" in msg and "sm_90a" in msg and "NVIDIA H200" in msg and "rebuild" in msg
    check_arch(inspect_image(elf_header(0x6005A04)), "sm_90a", "k")  # same SM: fine
    with pytest.raises(ImageError):
        check_arch(inspect_image(elf_header(0x6005004)), "sm_90a", "k")  # sm_80 SASS is not loaded on sm_90


def test_manifest_arch_must_agree_with_gpu_and_image():
    sm90 = inspect_image(elf_header(0x6005A04))
    with pytest.raises(ImageError, match=r"built for sm_120a \(manifest\) but .* is sm_90a"):
        check_arch(sm90, "sm_90a", "k", manifest_arch="sm_120a")
    check_arch(sm90, "sm_90a", "k", manifest_arch="sm_90a")
    check_arch(inspect_image(elf_header(0x6007802)), "sm_120a", "k", manifest_arch="sm_120a")


def test_manifest_and_image_disagreeing_is_refused():
    sm120 = inspect_image(elf_header(0x6007802))
    with pytest.raises(ImageError, match="manifest says sm_90a but the cubin targets sm_120"):
        check_arch(sm120, "sm_90a", "k", manifest_arch="sm_90a")


def test_ptx_runs_forward_unless_arch_specific():
    ptx80 = inspect_image(PTX.format(version="8.0", target="sm_80").encode())
    check_arch(ptx80, "sm_90a", "k")  # JIT-compiled forward
    ptx90a = inspect_image(PTX.format(version="8.0", target="sm_90a").encode())
    check_arch(ptx90a, "sm_90a", "k")
    with pytest.raises(ImageError, match="PTX for sm_90a"):
        check_arch(ptx90a, "sm_120a", "k")
    with pytest.raises(ImageError, match="PTX for sm_120a"):
        check_arch(inspect_image(PTX.format(version="8.7", target="sm_120a").encode()), "sm_90a", "k")


ptxas = shutil.which("ptxas")


@pytest.mark.skipif(ptxas is None, reason="ptxas not installed")
@pytest.mark.parametrize("arch,sm", [("sm_90a", 90), ("sm_120a", 120), ("sm_89", 89)])
def test_real_cubins_from_ptxas(tmp_path, arch, sm):
    src = tmp_path / "k.ptx"
    src.write_text(PTX.format(version="8.7", target=arch))
    out = tmp_path / "k.cubin"
    subprocess.run([ptxas, f"-arch={arch}", str(src), "-o", str(out)], check=True, capture_output=True)
    image = out.read_bytes()
    info = inspect_image(image)
    assert (info.kind, info.sm, info.arch) == ("cubin", sm, arch)
    assert cubin_entries(image) == ["add_one"]


@pytest.mark.skipif(ptxas is None, reason="ptxas not installed")
def test_gpu_test_kernels_assemble(tmp_path):
    """The PTX that tests/gpu/test_cuda_runtime.py JIT-loads on the GPU machine is valid sm_90 PTX."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent / "gpu" / "test_cuda_runtime.py"
    spec = importlib.util.spec_from_file_location("gpu_runtime_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    src = tmp_path / "k.ptx"
    src.write_text(mod.PTX)
    out = tmp_path / "k.cubin"
    subprocess.run([ptxas, "-arch=sm_90a", str(src), "-o", str(out)], check=True, capture_output=True)
    assert set(cubin_entries(out.read_bytes())) == {"add_one", "scale2", "axpy_t", "cluster_rank", "smem_echo",
                                                    "tma_tile"}
