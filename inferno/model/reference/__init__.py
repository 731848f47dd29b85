"""The numpy fp32 reference model, one module per part: norms, rope, attention, gdn, ffn (MLP / MoE),
layers, mtp, loader (weights -> fp32 arrays) and executor."""

from inferno.model.reference.executor import MtpOutput, ReferenceExecutor

__all__ = ["MtpOutput", "ReferenceExecutor"]
