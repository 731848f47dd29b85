"""`inferno migrate X.ninfer`: rewrite a version-1 header as version 2, in place (metadata only)."""

import sys
from pathlib import Path

import typer

V1_WEIGHTS_ID = "groupwise-int"  # the only weights contract published as version 1 (NVFP4 came with v2)


def migrate(
    target: Path = typer.Argument(..., help="version-1 .ninfer artifact (changed in place)"),
    model_id: str = typer.Option(None, "--model-id", help="model_id (default: the v1 header's model_id)"),
    weights_id: str = typer.Option(None, "--weights-id", help=f"weights_id (default: {V1_WEIGHTS_ID})"),
    no_hash: bool = typer.Option(False, "--no-hash", help="skip the check against the published v1 SHA-256"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
) -> None:
    """Give a v1 artifact its v2 identity after checking its inventory; payload bytes are untouched.

    For identities NInfer published as version 1, the file must also be that published file
    (SHA-256), as NInfer's own migration requires; --no-hash skips this.
    """
    from inferno.artifact.container import Identity, open_artifact, rewrite_header_v1_to_v2
    from inferno.artifact.identities import check_inventory, config_from_resources, lookup
    from inferno.errors import ArtifactError

    with open_artifact(target, allow_v1=True) as art:
        if art.revision != 1:
            print(f"{target} is already version {art.revision} ({art.identity}); nothing to do", file=sys.stderr)
            return
        if model_id is not None and model_id != art.model_id:
            raise ArtifactError(f"{target} holds model_id {art.model_id!r}, not {model_id!r}; "
                                "drop --model-id or pick the matching artifact")
        spec = lookup(art.model_id, weights_id or V1_WEIGHTS_ID)
        config = config_from_resources(spec, {n: art.resource(n) for n in art.resources})
        check_inventory(spec, config, art.tensors, art.resources)
    if spec.v1_sha256 is not None and not no_hash:
        from inferno.cli.verify import sha256_file

        digest = sha256_file(target, not quiet)
        if digest != spec.v1_sha256:
            raise ArtifactError(f"{target} is not the published v1 {spec.name} (sha256 {digest[:16]}...); "
                                "pass --no-hash to migrate it anyway")
    rewrite_header_v1_to_v2(target, Identity(spec.model_id, spec.weights_id))
    print(f"migrated {target} to version 2 as {spec.name} (payload unchanged)", file=sys.stderr)
