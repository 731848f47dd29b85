"""`.ninfer` v2 artifacts: container, weight formats, identity registry, convert, weights view.

`model_source(path)` opens an artifact for inference (the `.ninfer` branch of
`inferno.checkpoint.source.open_model`).
"""

from __future__ import annotations

from pathlib import Path

from inferno.artifact.container import Artifact, open_artifact


def open_checked(path: str | Path):
    """Open an artifact and check it against its registered identity.

    Returns (artifact, spec, config, expected inventory); refuses an unknown identity or any
    inventory mismatch (missing/unexpected tensor, shape, format, layout, resources).
    """
    from inferno.artifact.identities import check_inventory, config_from_resources, lookup
    from inferno.errors import ArtifactError

    artifact = open_artifact(path)
    try:
        if artifact.identity is None:
            raise ArtifactError(f"{path} is a version-1 artifact; run `inferno migrate {path}` first")
        spec = lookup(artifact.identity.model_id, artifact.identity.weights_id)
        resources = {name: artifact.resource(name) for name in artifact.resources}
        config = config_from_resources(spec, resources)
        expected = check_inventory(spec, config, artifact.tensors, artifact.resources)
    except BaseException:
        artifact.close()
        raise
    return artifact, spec, config, expected


def model_source(path: str | Path):
    """The `ModelSource` (config, dequantizing weights, resources by file name) of a `.ninfer` file."""
    from inferno.artifact.weights import ArtifactWeights
    from inferno.checkpoint.source import ModelSource

    artifact, spec, config, expected = open_checked(path)
    resources = {name.removeprefix("frontend/"): artifact.resource(name) for name in artifact.resources}
    weights = ArtifactWeights(artifact, spec, config, expected)
    return ModelSource(config, weights, resources, spec.name, Path(path))


__all__ = ["Artifact", "model_source", "open_artifact", "open_checked"]
