"""vLLM's own OpenAI serving layer, run outside FastAPI, over the appliance's engine client.

`init_app_state` is what `vllm serve` calls to build its serving objects (models, chat,
completions, responses, tokenize, ...) from its argument namespace; we call it with the
same namespace (`engine.vllm` included) and `QosEngineClient`, so every endpoint answers
with vLLM's request models, chat templates, tool parsers, structured output, logprobs and
sampling extras. This module only turns a JSON body into vLLM's request model, calls the
serving object, and turns its answer into a `JsonReply` or a `StreamReply`.
"""

from __future__ import annotations

import functools
import json
import typing
from collections.abc import AsyncIterator, Callable
from typing import Any

from appliance.adapters.vllm_qos_client import QosEngineClient
from appliance.domain.request_scope import JsonReply, StreamReply
from appliance.errors import ApplianceError, BadRequest, EngineDead, NotFound


@functools.cache
def _request_types() -> dict[str, Any]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.pooling.classify.protocol import ClassificationRequest
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest
    from vllm.entrypoints.pooling.pooling.protocol import PoolingRequest
    from vllm.entrypoints.pooling.scoring.protocol import RerankRequest, ScoreRequest
    from vllm.entrypoints.serve.tokenize.protocol import DetokenizeRequest, TokenizeRequest

    return {
        "chat": ChatCompletionRequest,
        "completion": CompletionRequest,
        "responses": ResponsesRequest,
        "tokenize": TokenizeRequest,
        "detokenize": DetokenizeRequest,
        "embeddings": EmbeddingRequest,
        "pooling": PoolingRequest,
        "classify": ClassificationRequest,
        "score": ScoreRequest,
        "rerank": RerankRequest,
    }


# Pooling endpoints: vLLM's serving object is called itself and answers with a Response.
POOLING = frozenset({"embeddings", "pooling", "classify", "score", "rerank"})

# Endpoint -> (init_app_state's attribute, its method; None: the object is called).
_SERVING: dict[str, tuple[str, str | None]] = {
    "chat": ("openai_serving_chat", "create_chat_completion"),
    "completion": ("openai_serving_completion", "create_completion"),
    "responses": ("openai_serving_responses", "create_responses"),
    "tokenize": ("serving_tokenization", "create_tokenize"),
    "detokenize": ("serving_tokenization", "create_detokenize"),
    "embeddings": ("serving_embedding", None),
    "pooling": ("serving_pooling", None),
    "classify": ("serving_classification", None),
    "score": ("serving_scores", None),
    "rerank": ("serving_scores", None),
}


def _models_of(kind: Any) -> tuple[Any, ...]:
    """The pydantic models a request type stands for (through Annotated and unions)."""
    if typing.get_origin(kind) is typing.Annotated:
        return _models_of(typing.get_args(kind)[0])
    args = typing.get_args(kind)
    if args:
        return tuple(m for a in args for m in _models_of(a))
    return (kind,) if hasattr(kind, "model_fields") else ()


@functools.cache
def _adapter(endpoint: str) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(_request_types()[endpoint])


@functools.cache
def request_fields(endpoint: str) -> frozenset[str]:
    """Every field vLLM's request model for endpoint knows (aliases included)."""
    names: set[str] = set()
    for model in _models_of(_request_types()[endpoint]):
        for name, info in model.model_fields.items():
            names.add(name)
            if info.alias:
                names.add(info.alias)
    return frozenset(names)


def parse_request(endpoint: str, body: dict[str, Any]) -> Any:
    """The body as vLLM's request model; unknown fields and bad values are a 400."""
    from pydantic import ValidationError

    unknown = sorted(set(body) - request_fields(endpoint))
    if unknown:
        # vLLM would log and ignore them; a field that may change the answer and is
        # not served must be refused instead.
        raise BadRequest(
            f"{unknown[0]}: unknown field for this endpoint (vLLM's request model has no "
            "such field)",
            param=unknown[0],
        )
    try:
        return _adapter(endpoint).validate_python(body)
    except ValidationError as exc:
        raise _bad_request(exc, body) from None
    except Exception as exc:  # vLLM's own validators raise VLLMValidationError and kin
        raise _from_vllm_exception(exc) from None


class VllmFrontend:
    """vLLM's serving objects for one engine; rebuilt at every engine start."""

    def __init__(self, state: Any, version: str) -> None:
        self._state = state  # vLLM's serving objects, as init_app_state left them
        self.version = version

    @classmethod
    async def build(cls, engine_client: Any, namespace: Any) -> VllmFrontend:
        """vLLM's init_app_state over the wrapped engine client."""
        import vllm
        from starlette.datastructures import State
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state

        client = QosEngineClient(engine_client)
        tasks = await engine_client.get_supported_tasks()
        state = State()
        await init_app_state(client, state, namespace, tasks)
        return cls(state, vllm.__version__)

    async def serve(self, endpoint: str, request: Any) -> JsonReply | StreamReply:
        """Run a parsed request through vLLM's serving object for endpoint."""
        call = self._handler(endpoint)
        try:
            result = await call(request)
        except ApplianceError:
            raise
        except Exception as exc:
            raise _from_vllm_exception(exc) from exc
        return self._reply(endpoint, result)

    def _handler(self, endpoint: str) -> Callable[[Any], Any]:
        owner, method = _SERVING[endpoint]
        served = getattr(self._state, owner, None)
        if served is None:
            raise NotFound(f"the served model does not support the {endpoint} API")
        call = served if method is None else getattr(served, method)
        return lambda request: call(request, None)  # raw_request: none outside FastAPI

    def _reply(self, endpoint: str, result: Any) -> JsonReply | StreamReply:
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse

        if isinstance(result, ErrorResponse):
            raise _from_error_response(result)
        if endpoint in POOLING:  # vLLM's pooling classes answer with a starlette Response
            body = json.loads(bytes(result.body))
            if result.status_code >= 400 and isinstance(body, dict) and "error" in body:
                raise _from_error_response(ErrorResponse.model_validate(body))
            return JsonReply(result.status_code, body)
        if hasattr(result, "model_dump"):
            if endpoint == "responses":
                return JsonReply(200, result.model_dump(mode="json", by_alias=True))
            return JsonReply(200, result.model_dump(mode="json"))
        if endpoint == "responses":
            return StreamReply(_response_events(result))
        return StreamReply(result)

    async def models(self) -> dict[str, Any]:
        """/v1/models as vLLM lists them (base model and LoRA adapters)."""
        listed = await self._state.openai_serving_models.show_available_models()
        return listed.model_dump(mode="json")


async def _response_events(events: AsyncIterator[Any]) -> AsyncIterator[str]:
    """The Responses API stream as SSE frames (`event:` and `data:` lines, as vLLM sends)."""
    async for event in events:
        kind = getattr(event, "type", "unknown")
        yield f"event: {kind}\ndata: {event.model_dump_json(indent=None, by_alias=True)}\n\n"


def _loc(loc: tuple[Any, ...], body: Any) -> str:
    """The field path the client sent (`messages[0].content`), without the union-member
    tags pydantic adds to the location (`str`, `list[int]`, class names)."""
    out = ""
    node = body
    for part in loc:
        if isinstance(node, dict) and part in node:
            out += f".{part}" if out else str(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            out += f"[{part}]"
            node = node[part]
        elif not out and isinstance(part, str) and part.isidentifier() and part.islower():
            out = part  # a required field the body lacks
            node = None
    return out or "body"


def _bad_request(exc: Any, body: dict[str, Any]) -> BadRequest:
    errors = exc.errors(include_url=False)
    first = errors[0]
    field = _loc(tuple(first.get("loc", ())), body)
    message = f"{field}: {first.get('msg', 'invalid value')}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem(s))"
    return BadRequest(message, param=field)


def _from_error_response(resp: Any) -> ApplianceError:
    """vLLM's ErrorResponse in the appliance's error family (status and shape kept)."""
    info = resp.error
    status = int(info.code)
    if status == 404:
        code = "model_not_found" if "model" in info.message.lower() else "not_found"
        return NotFound(info.message, param=info.param, code=code)
    code = None
    if "context length" in info.message or "maximum context" in info.message:
        code = "context_length_exceeded"
    err = BadRequest(info.message, param=info.param, code=code)
    if status != 400:
        err.status = status
        err.type = "invalid_request_error" if 400 <= status < 500 else "internal_error"
    return err


def _from_vllm_exception(exc: Exception) -> ApplianceError:
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(exc, EngineDeadError):
        return EngineDead("the engine is dead; it is being restarted")
    return _from_error_response(create_error_response(exc))


def dumps(body: Any) -> str:
    """JSON as vLLM's server writes it."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))
