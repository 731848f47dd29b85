"""Compile a registered kernel variant to sm_90a PTX text for the CPU tests that evaluate its addresses."""

from __future__ import annotations

import importlib
import tempfile

import pytest


def compile_ptx(v) -> str:
    """The PTX of variant `v` (skips the test where the CuTe DSL is not installed)."""
    pytest.importorskip("cutlass.cute", reason="CuTe DSL not installed (pip install -e '.[kernels]')")
    from inferno.kernels import build

    cutlass, cute, cuda, make_fake_tensor = build._import_dsl()
    kernel = getattr(importlib.import_module(v.source), v.cls)(**v.config)
    args = build._fake_args(v, cutlass, cute, cuda, make_fake_tensor)
    with tempfile.TemporaryDirectory(prefix="inferno-ptx-") as tmp:
        return cute.compile(kernel, *args, options=f"--gpu-arch sm_90a --keep-ptx --dump-dir {tmp}").__ptx__
