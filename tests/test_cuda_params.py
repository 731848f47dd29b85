"""Kernel argument packing: layouts, values, validation messages (no GPU needed)."""

import ctypes
import struct

import numpy as np
import pytest

from inferno.cuda.errors import LaunchError
from inferno.cuda.memory import DeviceBuffer
from inferno.cuda.params import ParamLayout, ParamSpec, TensorArg, pack_params, tensor_layout
from inferno.errors import InfernoError


def test_fixed_kind_sizes_and_alignments():
    for kind, size, align in [("ptr", 8, 8), ("i32", 4, 4), ("u32", 4, 4), ("i64", 8, 8), ("f32", 4, 4),
                              ("tma", 128, 64)]:
        s = ParamSpec("x", kind)
        assert (s.size, s.align) == (size, align)


@pytest.mark.parametrize("shape,stride,size", [(0, 0, 8), (1, 0, 16), (2, 0, 16), (3, 0, 24), (2, 2, 32),
                                               (1, 1, 24), (3, 2, 40)])
def test_tensor_struct_sizes_follow_the_dsl_abi(shape, stride, size):
    # {u64 ptr; i32 per dynamic shape mode; i64 per dynamic stride mode}, align 8 (research/cute-dsl.md §3)
    assert tensor_layout(shape, stride)[0] == size
    assert ParamSpec("t", "tensor", dyn_shape=shape, dyn_stride=stride).size == size


def test_spec_rejects_inconsistent_size_unknown_kind_and_stray_modes():
    with pytest.raises(LaunchError, match="kind 'i32' has size 4, the spec says 8"):
        ParamSpec("n", "i32", size=8)
    with pytest.raises(LaunchError, match="unknown kind 'f16x'"):
        ParamSpec("n", "f16x")
    with pytest.raises(LaunchError, match="tensor parameters only"):
        ParamSpec("n", "i32", dyn_shape=1)
    with pytest.raises(LaunchError, match="needs a positive size"):
        ParamSpec("b", "bytes")
    assert issubclass(LaunchError, InfernoError)


def test_offsets_respect_alignment():
    lay = ParamLayout([ParamSpec("flag", "bytes", 1), ParamSpec("n", "i32"), ParamSpec("m", "tma"),
                       ParamSpec("p", "ptr"), ParamSpec("x", "f32")], "k")
    assert lay.offsets == (0, 4, 64, 192, 200)
    assert lay.nbytes == 204
    assert lay.sizes == (1, 4, 128, 8, 4)


def test_packed_bytes_match_struct_layout():
    specs = [ParamSpec("a", "tensor", dyn_shape=2, dyn_stride=2), ParamSpec("b", "tensor", dyn_shape=1),
             ParamSpec("n", "i32"), ParamSpec("s", "f32"), ParamSpec("u", "u32"), ParamSpec("q", "i64"),
             ParamSpec("p", "ptr"), ParamSpec("m", "tma"), ParamSpec("acc", "bytes", 1)]
    buf = DeviceBuffer(0x7F00_0000_1000, 4096, "x")
    tma = bytes(range(128))
    p = pack_params(specs, [TensorArg(0x1000, (7, 9), (9, 63)), (buf, [5], []), -3, 0.5, 2**32 - 1, -(2**40),
                            buf, tma, b"\0"], kernel="k")
    assert p.raw("a") == struct.pack("<Q2i2q", 0x1000, 7, 9, 9, 63)
    assert p.raw("b") == struct.pack("<Qi4x", buf.ptr, 5)
    assert p.raw("n") == struct.pack("<i", -3)
    assert p.raw("s") == struct.pack("<f", 0.5)
    assert p.raw("u") == struct.pack("<I", 2**32 - 1)
    assert p.raw("q") == struct.pack("<q", -(2**40))
    assert p.raw("p") == struct.pack("<Q", buf.ptr)
    assert p.raw("m") == tma
    assert p.raw("acc") == b"\0"


def test_void_pointer_array_points_at_each_value():
    specs = [ParamSpec("p", "ptr"), ParamSpec("m", "tma"), ParamSpec("n", "i32")]
    p = pack_params(specs, [0xABCDEF, b"\x07" * 128, 41], kernel="k")
    ptrs = (ctypes.c_void_p * 3).from_address(p.address)
    assert ctypes.string_at(ptrs[0], 8) == struct.pack("<Q", 0xABCDEF)
    assert ctypes.string_at(ptrs[1], 128) == b"\x07" * 128
    assert ptrs[1] % 64 == 0  # the CUtensorMap sits 64-byte aligned
    assert ctypes.string_at(ptrs[2], 4) == struct.pack("<i", 41)


def test_set_and_update_rewrite_in_place():
    lay = ParamLayout([ParamSpec("p", "ptr"), ParamSpec("n", "i32")], "k")
    p = lay.pack([16, 1])
    addr = p.address
    p.set("n", 99)
    p.set(0, 32)
    assert (p.raw(0), p.raw(1)) == (struct.pack("<Q", 32), struct.pack("<i", 99))
    p.update([48, np.int32(7)])
    assert (p.raw(0), p.raw(1)) == (struct.pack("<Q", 48), struct.pack("<i", 7))
    assert p.address == addr
    with pytest.raises(LaunchError, match="no parameter 'm'"):
        p.set("m", 1)


@pytest.mark.parametrize("kind,value,expects", [
    ("i32", 1.5, "expects i32"), ("i32", 2**31, "expects i32"), ("i32", True, "expects i32"),
    ("i32", "3", "expects i32"), ("u32", -1, "expects u32"), ("i64", 2**63, "expects i64"),
    ("ptr", -8, "expects a device address"), ("ptr", 1.0, "expects a device address"),
    ("f32", "x", "expects f32"), ("f32", 1e39, "float32 range"), ("f32", False, "expects f32"),
    ("tma", b"\0" * 64, "expects 128 bytes"),
])
def test_bad_values_name_kernel_argument_and_types(kind, value, expects):
    specs = [ParamSpec("a", "ptr"), ParamSpec("b", "ptr"), ParamSpec("c", "ptr"), ParamSpec("n", kind)]
    with pytest.raises(LaunchError) as e:
        pack_params(specs, [0, 0, 0, value], kernel="rmsnorm")
    msg = str(e.value)
    assert msg.startswith("kernel rmsnorm: argument 3 'n' ")
    assert expects in msg
    assert type(value).__name__ in msg


def test_numpy_scalars_are_accepted():
    p = pack_params([ParamSpec("n", "i32"), ParamSpec("x", "f32"), ParamSpec("p", "ptr")],
                    [np.int64(5), np.float32(2.0), np.uint64(4096)])
    assert p.raw(0) == struct.pack("<i", 5) and p.raw(1) == struct.pack("<f", 2.0)
    assert p.raw(2) == struct.pack("<Q", 4096)


def test_count_mismatch_lists_parameters():
    with pytest.raises(LaunchError, match=r"kernel add: expects 2 arguments \(x, n\), got 3"):
        pack_params([ParamSpec("x", "ptr"), ParamSpec("n", "i32")], [1, 2, 3], kernel="add")


def test_tensor_argument_mode_counts_and_types_are_checked():
    spec = [ParamSpec("t", "tensor", dyn_shape=2, dyn_stride=1)]
    with pytest.raises(LaunchError, match=r"argument 0 't' expects a tensor \(ptr, shape\[2\], stride\[1\]\)"):
        pack_params(spec, [TensorArg(0x100, (1,), (2,))], kernel="k")
    with pytest.raises(LaunchError, match="i32 shapes"):
        pack_params(spec, [TensorArg(0x100, (2**31, 1), (2,))], kernel="k")
    with pytest.raises(LaunchError, match="i32 shapes"):
        pack_params(spec, [TensorArg(0x100, (1.0, 1), (2,))], kernel="k")
    with pytest.raises(LaunchError, match="expects a tensor"):
        pack_params(spec, [0x100], kernel="k")
    # fully static tensors take a bare address
    p = pack_params([ParamSpec("s", "tensor")], [0x200])
    assert p.raw(0) == struct.pack("<Q", 0x200)


def test_duplicate_names_are_refused():
    with pytest.raises(LaunchError, match="duplicate parameter names"):
        ParamLayout([ParamSpec("x", "ptr"), ParamSpec("x", "i32")], "k")


def test_empty_parameter_list_packs():
    p = pack_params([], [], kernel="noargs")
    assert p.address != 0
