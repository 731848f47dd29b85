"""`inferno verify X.ninfer`: structure vs the identity registry, size and SHA-256 vs the published file.

Exit 0: the artifact is the published file (or, for a TEST identity, structurally valid: no
published hash exists). Exit 1: structurally valid but not the published bytes (size or hash
differs). Exit 2: not a valid artifact for its identity (the error names the first problem).
"""

import hashlib
import sys
from pathlib import Path

import typer

CHUNK = 16 << 20


def sha256_file(path: Path, progress: bool) -> str:
    """SHA-256 of a file, with a progress line on stderr."""
    from inferno.artifact.convert import Progress

    digest = hashlib.sha256()
    bar = Progress(f"sha256 {path.name}", path.stat().st_size, progress)
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
            bar.advance(len(block))
    bar.close()
    return digest.hexdigest()


def verify(
    target: Path = typer.Argument(..., help=".ninfer artifact"),
    no_hash: bool = typer.Option(False, "--no-hash", help="skip the SHA-256 (structure and size only)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
) -> None:
    """Check an artifact against its registered identity and, if published, its size and SHA-256."""
    from inferno.artifact import open_checked

    artifact, spec, config, expected = open_checked(target)
    size = artifact.file_size
    artifact.close()
    print(f"structure   OK: {len(expected)} tensors and {len(spec.resources)} required resources of {spec.name}")
    if spec.published_bytes is None:
        digest = "skipped" if no_hash else sha256_file(target, not quiet)
        print(f"published   no published hash ({spec.name} is a TEST identity); sha256 {digest}")
        print("verdict     OK (structure valid)")
        return
    if size != spec.published_bytes:
        print(f"size        {size:,} bytes, published {spec.published_bytes:,}")
        print(f"verdict     DIFFERS from the published {spec.name} (a valid artifact, not the published file)")
        raise typer.Exit(1)
    print(f"size        {size:,} bytes = published")
    if no_hash:
        print("verdict     OK (structure and size; hash skipped)")
        return
    digest = sha256_file(target, not quiet)
    if digest != spec.sha256:
        print(f"sha256      {digest}\npublished   {spec.sha256}")
        print(f"verdict     DIFFERS from the published {spec.name} (same size, different bytes)")
        raise typer.Exit(1)
    print(f"sha256      {digest} = published")
    print(f"verdict     OK: this is the published {spec.name}", file=sys.stdout)
