"""What a code image is built for, read without a GPU: cubin ELF headers and PTX `.target`.

A CUDA cubin is an ELF64 file with e_machine 190 (EM_CUDA). Its SM number sits in e_flags:
bits 8..15 for ELF ABI version 8 (CUDA 13 toolchains; sm_90 -> 0x5a00), bits 0..7 for older
ones. ptxas records its command line (`-arch sm_90a`) in the `.note.nv.tkinfo` note, which is
where the arch-specific suffix is read from when present.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from inferno.errors import InfernoError

EM_CUDA = 190
STO_CUDA_ENTRY = 0x10
_FATBIN_MAGIC = b"\x50\xed\x55\xba"
_ARCH_RE = re.compile(r"^sm_(\d+)([af]?)$")


class ImageError(InfernoError):
    """A code image that is malformed or built for another GPU."""


@dataclass(frozen=True)
class ImageInfo:
    kind: str  # "cubin", "ptx" or "fatbin"
    sm: int | None  # 90 for sm_90/sm_90a; None for a fatbin
    arch: str | None  # "sm_90a" when the suffix is known, else "sm_90"
    ptx_version: str | None = None  # PTX `.version`, e.g. "8.0"


def parse_arch(arch: str) -> tuple[int, str]:
    """"sm_90a" -> (90, "a"); ImageError for anything else."""
    m = _ARCH_RE.match(arch or "")
    if not m:
        raise ImageError(f"bad arch name {arch!r}; expected e.g. sm_90a, sm_120a, sm_89")
    return int(m.group(1)), m.group(2)


def _sections(image: bytes) -> list[tuple[str, int, int, int]]:
    """(name, type, offset, size) for every ELF section."""
    shoff = struct.unpack_from("<Q", image, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
    if shoff == 0 or shnum == 0 or shoff + shnum * shentsize > len(image) or shstrndx >= shnum:
        return []
    raw = [struct.unpack_from("<IIQQQQ", image, shoff + i * shentsize) for i in range(shnum)]
    stroff = raw[shstrndx][4]

    def name(off: int) -> str:
        end = image.find(b"\0", stroff + off)
        return image[stroff + off:end].decode(errors="replace") if end >= 0 else ""

    return [(name(r[0]), r[1], r[4], r[5]) for r in raw]


def _tkinfo_arch(image: bytes, sections) -> str | None:
    for name, _t, off, size in sections:
        if name == ".note.nv.tkinfo":
            m = re.search(rb"-arch[ =](sm_\d+[af]?)", image[off:off + size])
            return m.group(1).decode() if m else None
    return None


def inspect_image(image: bytes, what: str = "image") -> ImageInfo:
    """Identify a cubin, PTX text or fatbin and the arch it targets."""
    if image[:4] == b"\x7fELF":
        if len(image) < 64 or image[4] != 2 or image[5] != 1:
            raise ImageError(f"{what}: not a 64-bit little-endian ELF; rebuild the cubin")
        machine = struct.unpack_from("<H", image, 18)[0]
        if machine != EM_CUDA:
            raise ImageError(f"{what}: ELF machine {machine} is not a CUDA cubin (190)")
        abi = image[8]
        flags = struct.unpack_from("<I", image, 48)[0]
        sm = (flags >> 8) & 0xFF if abi >= 8 else flags & 0xFF
        arch = _tkinfo_arch(image, _sections(image))
        if arch is None or parse_arch(arch)[0] != sm:
            arch = f"sm_{sm}"
        return ImageInfo("cubin", sm, arch)
    if image[:4] == _FATBIN_MAGIC:
        return ImageInfo("fatbin", None, None)
    head = image[:65536].decode("utf-8", errors="replace")
    target = re.search(r"^\s*\.target\s+(sm_\d+[af]?)", head, re.M)
    version = re.search(r"^\s*\.version\s+(\d+\.\d+)", head, re.M)
    if target and version:
        arch = target.group(1)
        return ImageInfo("ptx", parse_arch(arch)[0], arch, version.group(1))
    raise ImageError(f"{what}: neither a cubin (ELF), a fatbin nor PTX text with .version/.target; rebuild it")


def check_arch(info: ImageInfo, device_arch: str, what: str, manifest_arch: str | None = None,
               device_name: str = "this GPU") -> None:
    """Refuse an image that cannot run on `device_arch`, naming both archs and what to do.

    A cubin must match the GPU's SM exactly (our kernels are arch-specific builds). PTX may target
    an older SM (the driver JIT-compiles it forward) unless it is arch-specific ("a"), which must
    match exactly. A manifest arch, when given, must agree with both the GPU and the image.
    """
    dev_sm, _ = parse_arch(device_arch)
    fix = f"rebuild it for {device_arch} (inferno kernels build --arch {device_arch})"
    if manifest_arch is not None:
        m_sm, _ = parse_arch(manifest_arch)
        if m_sm != dev_sm:
            raise ImageError(f"{what} is built for {manifest_arch} (manifest) but {device_name} is {device_arch}; {fix}")
        if info.sm is not None and info.sm != m_sm:
            raise ImageError(f"{what}: manifest says {manifest_arch} but the {info.kind} targets {info.arch}; {fix}")
    if info.kind == "cubin" and info.sm != dev_sm:
        raise ImageError(f"{what} is a cubin for {info.arch} but {device_name} is {device_arch}; {fix}")
    if info.kind == "ptx" and info.arch is not None:
        sm, suffix = parse_arch(info.arch)
        if sm > dev_sm or (suffix and sm != dev_sm):
            raise ImageError(f"{what} is PTX for {info.arch} but {device_name} is {device_arch}; {fix}")


def cubin_entries(image: bytes) -> list[str]:
    """Kernel entry names in a cubin (global FUNC symbols marked as CUDA entries)."""
    info = inspect_image(image)
    if info.kind != "cubin":
        raise ImageError(f"cubin_entries needs a cubin, got {info.kind}")
    secs = _sections(image)
    symtab = next((s for s in secs if s[1] == 2), None)  # SHT_SYMTAB
    if symtab is None:
        return []
    shoff = struct.unpack_from("<Q", image, 0x28)[0]
    shentsize = struct.unpack_from("<H", image, 0x3A)[0]
    idx = secs.index(symtab)
    link = struct.unpack_from("<I", image, shoff + idx * shentsize + 40)[0]
    stroff = secs[link][2]
    out = []
    _n, _t, off, size = symtab
    for p in range(off, off + size, 24):
        st_name, st_info, st_other = struct.unpack_from("<IBB", image, p)
        if st_info & 0xF == 2 and st_other & STO_CUDA_ENTRY:
            end = image.find(b"\0", stroff + st_name)
            out.append(image[stroff + st_name:end].decode())
    return out
