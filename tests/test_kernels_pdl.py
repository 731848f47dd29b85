"""Programmatic dependent launch: which kernels may launch early, and the launch config it takes."""

import importlib
from types import SimpleNamespace

import pytest

from inferno.kernels.registry import variants

L = importlib.import_module("inferno.cuda.launch")


def test_pdl_variants_wait_in_kernel():
    """A kernel launched early must wait for its predecessor before it touches memory."""
    pdl = [v for v in variants() if v.pdl]
    assert pdl, "the decode kernels are PDL-capable"
    for v in pdl:
        assert "griddepcontrol_wait()" in v.source_file.read_text(), v.name


@pytest.mark.parametrize("kernel_pdl,stream_pdl,want", [(True, True, True), (True, False, False),
                                                        (False, True, False), (False, False, False)])
def test_pdl_needs_kernel_and_stream(kernel_pdl, stream_pdl, want):
    assert L._pdl(SimpleNamespace(pdl=kernel_pdl), SimpleNamespace(pdl=stream_pdl)) is want
    assert L._pdl(SimpleNamespace(pdl=kernel_pdl), None) is False


def test_ex_config_attributes(monkeypatch):
    from cuda.bindings import driver as cu  # the config structs need no GPU

    monkeypatch.setattr(L, "driver", lambda: cu)
    ids = cu.CUlaunchAttributeID
    cfg = L._ex_config((4, 1, 1), (128, 1, 1), 0, (2, 1, 1), True)
    assert cfg.numAttrs == 2
    assert [a.id for a in cfg.attrs] == [ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                                         ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION]
    assert cfg.attrs[1].value.programmaticStreamSerializationAllowed == 1
    assert L._ex_config((4, 1, 1), (128, 1, 1), 0, None, True).numAttrs == 1
