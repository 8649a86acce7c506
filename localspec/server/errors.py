"""Errors a request ends with, in OpenAI's shape: {"error": {message, type, param, code}},
and a body that does not validate as the 400 that names its first bad field."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

T = TypeVar("T", bound=BaseModel)


class ApiError(Exception):
    """A request the server refuses or could not answer; `status` is the HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind or error_type(status)
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.param, self.code)


def error_type(status: int) -> str:
    """OpenAI's error `type` for an HTTP status."""
    return {
        401: "authentication_error",
        404: "not_found_error",
        413: "invalid_request_error",
        429: "rate_limit_error",
    }.get(status, "invalid_request_error" if status < 500 else "server_error")


def error_body(
    message: str, kind: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def parse(kind: type[T], body: bytes) -> T:
    """The request body as `kind`, or a 400 that names the first bad field."""
    try:
        return kind.model_validate_json(body)
    except ValidationError as e:
        raise refusal(e) from None


def validated(kind: type[T], fields: dict[str, Any]) -> T:
    """`fields` as `kind` (another API's request as a chat's), or the 400 of `parse`."""
    try:
        return kind.model_validate(fields)
    except ValidationError as e:
        raise refusal(e) from None


def refusal(e: ValidationError) -> ApiError:
    errors = e.errors(include_url=False)
    if errors[0]["type"] == "json_invalid":
        return ApiError(400, f"the body is not valid JSON: {errors[0]['msg']}")
    loc, msg = first_failure(errors)
    param = ".".join(str(part) for part in loc) or None
    where = f"{param}: " if param else ""
    return ApiError(400, f"{where}{msg}", param)


def first_failure(errors: list[Any]) -> tuple[list[str | int], str]:
    """Where the first bad field is and what it should be. Where a field takes one of
    several shapes (`stop`: a string or a list), pydantic fails each, naming the shape in
    the path ("stop.list[str].0"): the shape that failed deepest in, the one the client
    meant, says where (stop.0: a string); where none went deeper, all say what it takes."""
    loc = errors[0]["loc"]
    at = next((i for i, part in enumerate(loc) if is_shape(part)), None)
    if at is None:
        return list(loc), errors[0]["msg"]
    shapes = [x for x in errors if len(x["loc"]) > at and x["loc"][:at] == loc[:at]]
    deepest = max(shapes, key=lambda x: len(x["loc"]))
    if len(deepest["loc"]) > at + 1:
        return [part for part in deepest["loc"] if not is_shape(part)], deepest["msg"]
    wants = dict.fromkeys(x["msg"].removeprefix("Input should be ") for x in shapes)
    return list(loc[:at]), "Input should be " + ", or ".join(wants)


def is_shape(part: str | int) -> bool:
    """A union member in a pydantic error's path ('str', 'list[str]', 'NamedToolChoice'),
    not a field (our fields are snake_case) or an index."""
    return isinstance(part, str) and ("[" in part or part[:1].isupper() or part in BUILTINS)


BUILTINS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})
