"""One error hierarchy for the appliance; api/errors.py maps it to HTTP in one place."""

from __future__ import annotations


class ApplianceError(Exception):
    """Base of every failure the appliance reports to a caller."""

    status = 500
    type = "internal_error"
    code: str | None = None
    # False: tell clients not to retry on their own (the OpenAI client retries 408 and 5xx);
    # a retry of a request whose deadline has passed would only reach the engine late.
    retryable = True

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class BadRequest(ApplianceError):
    """The request is malformed or outside a limit; the message names the field and limit."""

    status = 400
    type = "invalid_request_error"


class BodyTooLarge(BadRequest):
    status = 413
    code = "body_too_large"


class Unauthorized(ApplianceError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class NotFound(ApplianceError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class Overloaded(ApplianceError):
    """A lane is full or the queue wait ran out: come back later."""

    status = 429
    type = "rate_limit_error"
    code = "queue_full"

    def __init__(self, message: str, *, retry_after_s: int, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


class NotReady(ApplianceError):
    """The engine is not admitting (starting, draining, dead, protect)."""

    status = 503
    type = "service_unavailable"
    code = "not_ready"

    def __init__(self, message: str, *, reason: str, retry_after_s: int):
        super().__init__(message, code=reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class EngineDead(ApplianceError):
    """The engine failed while serving a request."""

    status = 503
    type = "service_unavailable"
    code = "engine_dead"


class EngineStartError(Exception):
    """The engine could not be started (bad model folder, plan does not fit, vLLM error)."""


class ConfigError(Exception):
    """A config file has one or more bad keys; each is named."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {key}: {msg}" for key, msg in problems)
        super().__init__(f"{source}: {len(problems)} bad key(s)\n{lines}")
