"""The identity registry: generated inventories vs the published NInfer facts, and refusals.

Published facts checked (NInfer docs/maintainer/*-artifact.md at troed/ninfer d02d42a, README at
b4babc2): tensor counts and per-format counts of all four identities, one v1 example descriptor,
the NVFP4 payload-region size, and the four published file sizes. The file sizes are reproduced
to the byte from our generated inventories (JSON directory + resources + aligned tensors), with
one unknown, the Qwen3.6 frontend-resource total, derived from the NVFP4 doc's payload region.
"""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pytest

from inferno.artifact import formats
from inferno.artifact.container import plan
from inferno.artifact.identities import (
    FRONTEND_RESOURCES,
    REGISTRY,
    check_inventory,
    config_from_resources,
    default_model_id,
    lookup,
    parse_identity,
)
from inferno.errors import ArtifactError
from inferno.model.config import ModelConfig

# tensor-count tables of the artifact references (§9.2 / §13.3 / §2 / §10.2)
PUBLISHED_FORMAT_COUNTS = {
    "qwen3.6-27b/groupwise-int": {"BF16": 582, "FP32": 96, "I32": 1, "Q4G64_F16S": 183, "Q5G64_F16S": 246,
                                  "Q6G64_F16S": 3, "W8G32_F16S": 7},
    "qwen3.6-27b/nvfp4": {"BF16": 591, "FP32": 343, "I32": 1, "Q4G64_F16S": 55, "Q5G64_F16S": 54,
                          "Q6G64_F16S": 1, "W8G32_F16S": 9, "NVFP4": 247},
    "qwen3.8-27b/groupwise-int": {"BF16": 582, "FP32": 96, "I32": 1, "Q4G64_F16S": 183, "Q5G64_F16S": 246,
                                  "Q6G64_F16S": 1, "W8G32_F16S": 9},
    "qwen3.6-35b-a3b/groupwise-int": {"BF16": 487, "FP32": 60, "I32": 1, "Q4G64_F16S": 95, "Q5G64_F16S": 91,
                                      "Q6G64_F16S": 5, "W8G32_F16S": 195},
}
NVFP4_PAYLOAD_REGION = 18_323_855_104  # qwen3.6-27b-artifact.md §13.5
PUBLISHED = [name for name, spec in REGISTRY.items() if not spec.is_test]


def _inventory(name: str):
    spec = REGISTRY[name]
    return spec, spec.expected(spec.builtin_config())


def _tensor_region(expected, start: int) -> int:
    cursor = start
    for e in expected:
        cursor = -(-cursor // 256) * 256 + formats.packed_nbytes(e.format, e.layout, e.shape)
    return cursor


def _file_bytes(spec, expected, resource_bytes: list[int]) -> int:
    """Total size of an artifact NInfer-style: prefix + compact JSON, padded to 4096, then payloads."""
    entries = plan([(e.name, e.shape, e.format, e.layout) for e in expected],
                   list(zip(FRONTEND_RESOURCES, resource_bytes)))
    objects = []
    for o in entries:
        if hasattr(o, "shape"):
            objects.append({"name": o.name, "kind": "tensor", "shape": list(o.shape), "format": o.format,
                            "layout": o.layout, "offset": o.offset, "bytes": o.bytes})
        else:
            objects.append({"name": o.name, "kind": "resource", "encoding": o.encoding, "offset": o.offset,
                            "bytes": o.bytes})
    root = {"identity": {"model_id": spec.model_id, "weights_id": spec.weights_id}, "objects": objects}
    directory = json.dumps(root, separators=(",", ":")).encode()
    payload_offset = -(-(16 + len(directory)) // 4096) * 4096
    return payload_offset + entries[-1].offset + entries[-1].bytes


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_inventory_counts(name):
    spec, expected = _inventory(name)
    assert len(expected) == spec.tensor_count == sum(PUBLISHED_FORMAT_COUNTS[name].values())
    assert dict(Counter(e.format for e in expected)) == PUBLISHED_FORMAT_COUNTS[name]
    assert len({e.name for e in expected}) == len(expected)
    assert all(e.layout == {"BF16": formats.CONTIGUOUS, "FP32": formats.CONTIGUOUS, "I32": formats.CONTIGUOUS,
                            "NVFP4": formats.BLOCKSCALE}.get(e.format, formats.ROW_SPLIT) for e in expected)


def test_published_sizes_are_reproduced_to_the_byte():
    nvfp4_spec, nvfp4 = _inventory("qwen3.6-27b/nvfp4")
    resources_36 = NVFP4_PAYLOAD_REGION - _tensor_region(nvfp4, 0)
    assert 12_000_000 < resources_36 < 14_000_000  # tokenizer.json dominates; 20 MB would mean a wrong inventory
    # only the digit counts of single resources matter for the JSON length; the total is exact
    sizes = [resources_36 - 24_000, 13_000, 7_000, 2_000, 1_000, 1_000]
    assert sum(sizes) == resources_36
    for name in ("qwen3.6-27b/groupwise-int", "qwen3.6-27b/nvfp4", "qwen3.6-35b-a3b/groupwise-int"):
        spec, expected = _inventory(name)
        assert _file_bytes(spec, expected, sizes) == spec.published_bytes, name
    spec, expected = _inventory("qwen3.8-27b/groupwise-int")  # Qwen3.8 ships its own tokenizer files
    assert abs(_file_bytes(spec, expected, sizes) - spec.published_bytes) < 64 * 1024


def test_published_descriptors_and_exceptions():
    _, gw = _inventory("qwen3.6-27b/groupwise-int")
    by = {e.name: e for e in gw}
    qk = by["text/layers/3/attention/query_key"]  # the v1 container doc's example object
    assert (qk.shape, qk.format, qk.layout) == ((7168, 5120), "Q4G64_F16S", "row-split-k128-v1")
    assert formats.packed_nbytes(qk.format, qk.layout, qk.shape) == 19_496_960
    assert by["text/layers/0/gdn/convolution"].shape == (4, 10240)
    assert by["text/layers/0/gdn/value_z"].shape == (12288, 5120)
    assert by["mtp/layer/attention/query_key_gate_value"].shape == (14336, 5120)
    assert by["text/draft_head"].shape == (131072, 5120)
    assert [e.name for e in gw[:3]] == ["text/token_embedding", "text/layers/0/input_norm", "text/layers/0/gdn/a_log"]

    _, nv = _inventory("qwen3.6-27b/nvfp4")
    by = {e.name: e for e in nv}
    assert by["text/layers/23/attention/query_key_gate_value"].format == "BF16"
    assert by["text/layers/27/attention/query_key_gate_value"].format == "NVFP4"
    assert by["text/layers/7/attention/output"].format == "BF16"
    assert by["text/layers/11/attention/output"].format == "NVFP4"
    assert by["text/layers/4/gdn/output"].format == "BF16"
    assert by["text/layers/5/gdn/output"].format == "NVFP4"
    assert "text/layers/4/gdn/output_projection/input_scale_divisor" not in by
    names = [e.name for e in nv]
    i = names.index("text/layers/0/gdn/query_key_value_z")
    assert names[i + 1] == "text/layers/0/gdn/input_projection/input_scale_divisor"
    assert by[names[i + 1]].shape == () and by[names[i + 1]].format == "FP32"

    _, moe = _inventory("qwen3.6-35b-a3b/groupwise-int")
    by = {e.name: e for e in moe}
    assert by["text/layers/34/moe/routed_down"].format == "Q6G64_F16S"
    assert by["text/layers/33/moe/routed_down"].format == "Q5G64_F16S"
    assert by["text/layers/0/moe/routed_gate_up"].shape == (262144, 2048)
    assert by["text/layers/0/moe/routed_down"].shape == (524288, 512)
    assert by["text/layers/0/moe/router_shared_gate"].shape == (257, 2048)
    assert by["text/layers/0/gdn/a_b_projection"].shape == (64, 2048)
    assert by["dflash/feature_projection"].shape == (2048, 16384)
    assert moe[-1].name == "dflash/final_norm"


def test_lookup_and_parse():
    assert parse_identity("qwen3.6-27b/nvfp4").weights_id == "nvfp4"
    with pytest.raises(ArtifactError, match="unknown artifact identity qwen3.6-27b/q8"):
        lookup("qwen3.6-27b", "q8")
    with pytest.raises(ArtifactError, match="model_id/weights_id"):
        parse_identity("qwen3.6-27b")


def test_default_model_id():
    assert default_model_id(REGISTRY["qwen3.6-27b/groupwise-int"].builtin_config()) == "qwen3.6-27b"
    assert default_model_id(REGISTRY["qwen3.6-35b-a3b/groupwise-int"].builtin_config()) == "qwen3.6-35b-a3b"
    from inferno.checkpoint.presets import get_preset
    from inferno.checkpoint.synth import hf_config

    tiny = ModelConfig.from_hf(hf_config(get_preset("tiny-moe"), 0))
    assert default_model_id(tiny) == "inferno-test-tiny-moe"


def _tiny_artifact_view(weights_id: str = "groupwise-int"):
    """(spec, config, fake tensor entries, resources) of a well-formed tiny-dense test artifact."""
    from inferno.checkpoint.presets import get_preset
    from inferno.checkpoint.synth import hf_config

    spec = lookup("inferno-test-tiny-dense", weights_id)
    resources = {"frontend/config.json": json.dumps(hf_config(get_preset("tiny-dense"), 0)).encode()}
    config = config_from_resources(spec, resources)
    tensors = {e.name: SimpleNamespace(shape=e.shape, format=e.format, layout=e.layout)
               for e in spec.expected(config)}
    return spec, config, tensors, resources


def test_test_identity_follows_its_config():
    spec, config, tensors, resources = _tiny_artifact_view()
    assert config.hidden == 256 and config.n_layers == 4
    check_inventory(spec, config, tensors, resources)
    assert tensors["text/layers/3/attention/query_key"].shape == (4 * 256 + 2 * 256, 256)
    assert tensors["text/draft_head"].shape == (1024, 256)  # half the vocab rows
    assert tensors["vision/merger/fc1"].shape == (128, 128)


@pytest.mark.parametrize("break_it, message", [
    (lambda t, r: t.pop("text/layers/1/gdn/value_z"), "tensor text/layers/1/gdn/value_z is missing"),
    (lambda t, r: setattr(t["text/final_norm"], "shape", (255,)), "text/final_norm has shape \\[255\\], expected \\[256\\]"),
    (lambda t, r: setattr(t["text/layers/0/mlp/down"], "format", "Q4G64_F16S"),
     "text/layers/0/mlp/down is Q4G64_F16S/row-split-k128-v1, expected Q5G64_F16S/row-split-k128-v1"),
    (lambda t, r: t.__setitem__("text/extra", SimpleNamespace(shape=(1,), format="BF16", layout="contiguous-le-v1")),
     "tensor text/extra is not part of"),
    (lambda t, r: r.__setitem__("frontend/notes.txt", b"x"), "resource frontend/notes.txt is not part of"),
])
def test_inventory_mismatch_names_the_first_problem(break_it, message):
    spec, config, tensors, resources = _tiny_artifact_view()
    break_it(tensors, resources)
    with pytest.raises(ArtifactError, match=message):
        check_inventory(spec, config, tensors, resources)


def test_test_identity_needs_its_config_resource():
    spec = lookup("inferno-test-tiny-dense", "groupwise-int")
    with pytest.raises(ArtifactError, match="frontend/config.json"):
        config_from_resources(spec, {})
