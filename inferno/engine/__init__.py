"""Token level: sampling params + sampler, generation loop, request queue / concurrency, cancellation."""

from inferno.engine.engine import Engine, TokenStream
from inferno.engine.errors import (
    ContextLengthError,
    EngineBusyError,
    EngineClosedError,
    EngineConfigError,
    EngineError,
    QueueTimeoutError,
    RequestError,
    SamplingError,
)
from inferno.engine.params import GenerationRequest, GenerationStats, SamplingParams, TokenEvent
from inferno.engine.presets import resolve_sampling
from inferno.engine.sampling import Sampler

__all__ = [
    "ContextLengthError",
    "Engine",
    "EngineBusyError",
    "EngineClosedError",
    "EngineConfigError",
    "EngineError",
    "GenerationRequest",
    "GenerationStats",
    "QueueTimeoutError",
    "RequestError",
    "Sampler",
    "SamplingError",
    "SamplingParams",
    "TokenEvent",
    "TokenStream",
    "resolve_sampling",
]
