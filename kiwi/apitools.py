"""api tools: what a manifest's ``executor`` section may say, and how a call is built from it (pure).

A manifest writes the request with two kinds of placeholders: ``{name}`` is a call parameter and
``${NAME}`` a secret or setting from the worker's environment. Both are filled in one pass, so a
parameter's value is never read as a placeholder (an agent cannot ask for ``${AWS_SECRET_KEY}``),
and a parameter in the URL is percent-encoded, so it cannot change the host or the path's shape.
The activity (``activities/api.py``) checks the host of every request, redirects included.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote, urlsplit

from pydantic import BaseModel, Field

METHODS = ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE")
# Methods a retry cannot turn into a second effect (RFC 9110 idempotent methods).
IDEMPOTENT = ("GET", "HEAD", "OPTIONS", "PUT", "DELETE")
MAX_RETRIES = 5
DEFAULT_MAX_RESPONSE_BYTES = 1_000_000
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Keys of an api executor section; anything else is a typo that would otherwise do nothing.
EXECUTOR_KEYS = {
    "type",
    "method",
    "url",
    "endpoint",
    "headers",
    "query",
    "body",
    "timeout",
    "retries",
    "max_response_bytes",
    "response",
    "auth",
}


class ApiExecutor(BaseModel):
    """An api tool's ``executor`` section, read."""

    method: str = "GET"
    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    query: dict[str, Any] = Field(default_factory=dict)
    body: Any = None
    timeout: float = 30.0
    retries: int = 0
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    # "data.items" (one value) or {"fields": {"name": "data.name", ...}}; absent: status and body.
    response: Any = None

    @property
    def retried(self) -> int:
        """How many times a failed attempt is repeated: never for POST or PATCH."""
        return self.retries if self.method in IDEMPOTENT else 0


def read_executor(executor: dict[str, Any], parameters: list[str] | None = None) -> ApiExecutor:
    """The executor section as an :class:`ApiExecutor`; ``ValueError`` says what is wrong and what to write.

    ``parameters``, when given, are the manifest's parameter names: a ``{name}`` placeholder must
    be one of them.
    """
    unknown = sorted(set(executor) - EXECUTOR_KEYS)
    if unknown:
        raise ValueError(
            f"api executor has no key '{unknown[0]}'; it takes {', '.join(sorted(EXECUTOR_KEYS - {'type'}))}"
        )
    url = executor.get("url") or executor.get("endpoint")
    if not isinstance(url, str) or not url:
        raise ValueError("api tool needs executor.url (e.g. url: https://api.example.com/items/{id})")
    split = urlsplit(PLACEHOLDER.sub("x", url))
    if split.scheme not in ("http", "https") or not split.hostname:
        raise ValueError(f"executor.url '{url}' is not an http(s) URL with a host")
    if PLACEHOLDER.search(urlsplit(url).netloc):
        raise ValueError(f"executor.url '{url}' has a placeholder in its host; the host must be written out")
    method = str(executor.get("method", "GET")).upper()
    if method not in METHODS:
        raise ValueError(f"executor.method '{method}' is not one of {', '.join(METHODS)}")
    headers = dict(executor.get("headers") or {})
    auth = executor.get("auth")
    if auth is not None:
        # The seed's form: auth: {type: bearer, env_var: API_TOKEN}.
        if not isinstance(auth, dict) or auth.get("type") != "bearer" or not auth.get("env_var"):
            raise ValueError("executor.auth takes {type: bearer, env_var: NAME}")
        headers.setdefault("Authorization", f"Bearer ${{{auth['env_var']}}}")
    try:
        read = ApiExecutor(
            method=method,
            url=url,
            headers={str(k): str(v) for k, v in headers.items()},
            query=dict(executor.get("query") or {}),
            body=executor.get("body"),
            timeout=float(executor.get("timeout", 30)),
            retries=int(executor.get("retries", 0)),
            max_response_bytes=int(executor.get("max_response_bytes", DEFAULT_MAX_RESPONSE_BYTES)),
            response=executor.get("response"),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"api executor: {exc}") from None
    if not 0 < read.timeout <= 600:
        raise ValueError("executor.timeout is seconds, more than 0 and at most 600")
    if not 0 <= read.retries <= MAX_RETRIES:
        raise ValueError(f"executor.retries is 0 to {MAX_RETRIES}")
    if read.max_response_bytes <= 0:
        raise ValueError("executor.max_response_bytes must be positive")
    if read.response is not None and not (
        isinstance(read.response, str)
        or (isinstance(read.response, dict) and isinstance(read.response.get("fields"), dict))
    ):
        raise ValueError('executor.response is a path ("data.items") or {fields: {name: "data.name"}}')
    if parameters is not None:
        for name in placeholders(read):
            if name not in parameters:
                raise ValueError(f"executor uses {{{name}}}, which is not one of the tool's parameters")
    return read


def placeholders(executor: ApiExecutor) -> list[str]:
    """The parameter names (``{name}``) the request uses."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.extend(m.group(2) for m in PLACEHOLDER.finditer(value) if m.group(2))
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk([executor.url, executor.headers, executor.query, executor.body])
    return list(dict.fromkeys(found))


def fill(
    text: str,
    params: dict[str, Any],
    secret: Any,
    *,
    encode: bool = False,
) -> str:
    """``text`` with its placeholders filled: ``secret(NAME)`` for ``${NAME}``, the parameter for ``{name}``.

    A missing parameter is a ``KeyError`` naming it. ``encode`` percent-encodes every value (URLs).
    """

    def one(match: re.Match[str]) -> str:
        if match.group(1):
            value = str(secret(match.group(1)))
        else:
            value = params[match.group(2)]
            value = value if isinstance(value, str) else _text(value)
        if encode and value in (".", ".."):
            # A dot segment survives percent-encoding and URL parsers remove it: the request would leave
            # the path the manifest names.
            raise ValueError(f"parameter {match.group(2)!r} is {value!r}, which would change the URL's path")
        return quote(value, safe="") if encode else value

    return PLACEHOLDER.sub(one, text)


def fill_body(value: Any, params: dict[str, Any], secret: Any) -> Any:
    """A JSON body template filled: a string that is exactly ``{name}`` becomes the parameter's value
    with its type (a number stays a number); other strings are filled as text."""
    if isinstance(value, str):
        whole = PLACEHOLDER.fullmatch(value)
        if whole and whole.group(2):
            return params[whole.group(2)]
        return fill(value, params, secret)
    if isinstance(value, dict):
        return {str(k): fill_body(v, params, secret) for k, v in value.items()}
    if isinstance(value, list):
        return [fill_body(v, params, secret) for v in value]
    return value


def pick(value: Any, path: str) -> Any:
    """``value`` at a dotted path (``data.items.0.name``); ``KeyError`` naming the part that is missing."""
    for part in (p for p in path.split(".") if p):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(part)
    return value


def map_response(executor: ApiExecutor, status: int, body: Any) -> Any:
    """The tool's result: the mapped parts of the body, or ``{status, body}`` without a mapping."""
    if executor.response is None:
        return {"status": status, "body": body}
    if isinstance(executor.response, str):
        return pick(body, executor.response)
    return {name: pick(body, str(path)) for name, path in executor.response["fields"].items()}


def _text(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, bool | int | float) else str(value).lower()
