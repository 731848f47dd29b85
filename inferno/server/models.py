"""GET /v1/models and /v1/models/{id}: the served model with its deployment parameters.

Besides OpenAI's `id/object/created/owned_by`, each entry carries the fields other servers use
for the context size (`context_length`, `max_model_len`, `max_context_length`) and an
`inferno` object with the deployment's settings.
"""

from __future__ import annotations

import dataclasses

from starlette.requests import Request
from starlette.responses import JSONResponse

from inferno.server.errors import ApiError
from inferno.server.service import Deployment


def _sampling(dep: Deployment, thinking: bool) -> dict:
    params = dataclasses.asdict(dep.pipeline.sampling(thinking))
    params.pop("seed", None)
    return params


def model_entry(dep: Deployment) -> dict:
    engine = dep.pipeline.engine
    cfg = engine.executor.config
    return {
        "id": dep.model_id,
        "object": "model",
        "created": dep.created,
        "owned_by": "inferno",
        "context_length": dep.max_context,
        "max_model_len": dep.max_context,
        "max_context_length": dep.max_context,
        "inferno": {
            "identity": dep.pipeline.identity,
            "executor": dep.executor_name,
            "max_context": dep.max_context,
            "model_max_position": cfg.max_position,
            "max_concurrency": engine.max_concurrency,
            "max_pending": engine.max_pending,
            "kv_capacity_tokens": dep.max_context * engine.max_concurrency,
            "kv_dtype": dep.kv_dtype,
            "speculative": {"method": None, "draft_tokens": 0},
            "vision": False,
            "default_max_tokens": dep.default_max_tokens,
            "default_thinking": True,
            "default_sampling": {"thinking": _sampling(dep, True), "non_thinking": _sampling(dep, False)},
        },
    }


async def list_models(request: Request) -> JSONResponse:
    dep: Deployment = request.app.state.deployment
    return JSONResponse({"object": "list", "data": [model_entry(dep)]})


async def get_model(request: Request) -> JSONResponse:
    dep: Deployment = request.app.state.deployment
    try:
        dep.check_model(request.path_params["model_id"])
    except ApiError as e:
        return e.response("openai")
    return JSONResponse(model_entry(dep))
