"""`inferno inspect X.ninfer`: identity, config summary, tensors by format, resources."""

import sys
from collections import Counter
from pathlib import Path

import typer


def inspect(
    target: Path = typer.Argument(..., help=".ninfer artifact"),
    tensors: bool = typer.Option(False, "--tensors", help="also list every tensor"),
) -> None:
    """Show what an artifact holds, then check it against its registered identity (exit 2 if it fails)."""
    from inferno.artifact.container import open_artifact
    from inferno.artifact.identities import check_inventory, config_from_resources, lookup
    from inferno.errors import ArtifactError

    with open_artifact(target, allow_v1=True) as art:
        ident = str(art.identity) if art.identity else f"{art.model_id} (version 1: no weights_id; run inferno migrate)"
        print(f"file        {art.path}  ({art.file_size:,} bytes, container revision {art.revision})")
        print(f"identity    {ident}")
        by_format: Counter = Counter()
        count: Counter = Counter()
        for t in art.tensors.values():
            by_format[t.format] += t.bytes
            count[t.format] += 1
        print(f"tensors     {len(art.tensors)}  ({sum(by_format.values()):,} bytes)")
        for fmt, nbytes in sorted(by_format.items(), key=lambda kv: -kv[1]):
            print(f"  {fmt:<12} {count[fmt]:>5} tensors  {nbytes:>16,} bytes")
        print(f"resources   {len(art.resources)}")
        for r in art.resources.values():
            print(f"  {r.name:<44} {r.bytes:>12,} bytes")
        if tensors:
            for t in art.tensors.values():
                print(f"  {t.name:<60} {str(list(t.shape)):<18} {t.format:<12} {t.layout:<26} {t.bytes:,}")
        if art.identity is None:
            raise ArtifactError(f"{target} is version 1; run `inferno migrate {target}` to use it")
        spec = lookup(art.identity.model_id, art.identity.weights_id)
        config = config_from_resources(spec, {n: art.resource(n) for n in art.resources})
        check_inventory(spec, config, art.tensors, art.resources)
        kind = "TEST identity (synthetic artifacts only)" if spec.is_test else "registered identity"
        mixer = f"{len(config.gdn_layers)} GDN + {len(config.attention_layers)} attention"
        ffn = (f"MoE {config.n_experts} experts top-{config.top_k} x {config.moe_intermediate} + shared "
               f"{config.shared_intermediate}" if config.is_moe else f"dense MLP {config.intermediate}")
        print(f"config      {config.model_type}: hidden {config.hidden}, {config.n_layers} layers ({mixer}), "
              f"{config.n_heads}/{config.n_kv_heads} heads x {config.head_dim}, {ffn}, vocab {config.vocab}, "
              f"MTP {config.mtp_layers}, vision {'yes' if config.vision else 'no'}")
        print(f"check       inventory matches the {kind} {spec.name}", file=sys.stdout)
