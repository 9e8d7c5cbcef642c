"""api tools: one HTTP request (and its redirects) from a manifest, with ``httpx``.

Secrets (``${NAME}``) are looked up here, in the worker, and scrubbed from everything that leaves:
the result, error messages and log lines. Every request's host, the first and each redirect's, must
be granted to the run (``<execute resource="network" hosts="..."/>``); nothing is sent otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import socket
from collections.abc import Awaitable
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from temporalio import activity

from kiwi.apitools import ApiExecutor, fill, fill_body, map_response, read_executor
from kiwi.contracts import ApiToolRequest
from kiwi.errors import PermissionDenied, SecretMissing, ToolFailed, ToolTimeout
from kiwi.policy import PermissionSet
from kiwi.upstream.pool import remember_secrets, scrub, scrub_text
from kiwi.upstream.registry import kiwi_own, lookup_secret

MAX_REDIRECTS = 5
HEARTBEAT_SECONDS = 2.0
# Answers worth another attempt of an idempotent request.
RETRIED_STATUS = (429, 502, 503, 504)
T = TypeVar("T")


class _Secrets:
    """The ``${NAME}`` values one call used, so they can be scrubbed from what it returns."""

    def __init__(self, tool_id: str) -> None:
        self.tool_id = tool_id
        self.used: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        value = lookup_secret(name)
        if value is None:
            if refused := kiwi_own(name):
                raise SecretMissing.error(
                    f"api tool '{self.tool_id}' needs ${{{name}}}, which is refused", {"hint": refused}
                )
            raise SecretMissing.error(
                f"api tool '{self.tool_id}' needs ${{{name}}}, which is not set in the worker's environment",
                {
                    "hint": f"export {name}=... where the worker runs (or store it in the OS keyring, service 'kiwi')"
                },
            )
        self.used[name] = value
        if quote(value, safe="") != value:
            self.used[f"{name} (URL-encoded)"] = quote(value, safe="")
        return value


class ApiToolActivities:
    """Runs api tools. ``transport`` is httpx's (None: the network), so a bench can measure overhead."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.transport = transport

    @activity.defn(name="call_api_tool")
    async def call_api_tool(self, req: ApiToolRequest) -> Any:
        tool = req.tool
        try:
            executor = read_executor(tool.executor)
        except ValueError as exc:
            raise ToolFailed.error(f"api tool '{tool.tool_id}' has a broken manifest: {exc}") from None
        secrets = _Secrets(tool.tool_id)
        defaults = {
            name: prop["default"]
            for name, prop in (tool.input_schema.get("properties") or {}).items()
            if isinstance(prop, dict) and "default" in prop
        }
        try:
            request = _build(executor, {**defaults, **req.params}, secrets)
        except KeyError as exc:
            raise ToolFailed.error(f"api tool '{tool.tool_id}': parameter {exc} has no value") from None
        except ValueError as exc:
            raise ToolFailed.error(f"api tool '{tool.tool_id}': {exc}") from None
        remember_secrets(secrets.used)
        try:
            status, body = await _heartbeating(self._send(tool.tool_id, executor, request, req))
            return scrub(map_response(executor, status, body), secrets.used)
        except KeyError as exc:
            raise ToolFailed.error(
                f"api tool '{tool.tool_id}': the response has no {exc} (executor.response)"
            ) from None
        except ApiCallError as exc:
            # (The grant to add as the answer's hint, where the caller's fix is made from it: README trial s39,
            # outside a run it named <permissions>, as the hint was in the message.)
            raise exc.kind.error(
                scrub_text(str(exc)), *([{"hint": scrub_text(exc.hint)}] if exc.hint else [])
            ) from None

    async def _send(
        self, tool_id: str, executor: ApiExecutor, request: httpx.Request, req: ApiToolRequest
    ) -> tuple[int, Any]:
        grants = PermissionSet(network_hosts=req.network_hosts, deny_network=req.deny_network)
        cap = min(executor.max_response_bytes, req.max_output_bytes)
        async with httpx.AsyncClient(
            transport=self.transport, trust_env=False, follow_redirects=False, timeout=executor.timeout
        ) as client:
            for attempt in range(executor.retried + 1):
                last = attempt == executor.retried
                try:
                    return await _exchange(client, request, grants, cap, tool_id)
                except httpx.TimeoutException:
                    if last:
                        raise ApiCallError(
                            ToolTimeout,
                            f"api tool '{tool_id}': {request.method} {_where(request.url)} timed out after "
                            f"{executor.timeout:g}s" + (f" ({attempt + 1} attempts)" if attempt else ""),
                        ) from None
                except httpx.TransportError as exc:
                    if last:
                        raise ApiCallError(
                            ToolFailed,
                            f"api tool '{tool_id}': {request.method} {_where(request.url)} failed: "
                            f"{type(exc).__name__}: {exc}",
                        ) from None
                except _Retry as retry:
                    if last:
                        raise retry.failure from None
                await asyncio.sleep(min(0.2 * 2**attempt, 5.0))
        raise AssertionError("unreachable: the last attempt returns or raises")


class ApiCallError(Exception):
    """A failed call, with the Kiwi error kind it becomes once its text is scrubbed."""

    def __init__(
        self, kind: type[ToolFailed | ToolTimeout | PermissionDenied], message: str, hint: str = ""
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.hint = hint


class _Retry(Exception):
    def __init__(self, failure: ApiCallError) -> None:
        self.failure = failure


def _build(executor: ApiExecutor, params: dict[str, Any], secrets: _Secrets) -> httpx.Request:
    url = fill(executor.url, params, secrets, encode=True)
    query = {k: fill(str(v), params, secrets) for k, v in executor.query.items()}
    headers = {k: fill(v, params, secrets) for k, v in executor.headers.items()}
    content = None
    if executor.body is not None:
        content = json.dumps(fill_body(executor.body, params, secrets))
    elif executor.method in ("POST", "PUT", "PATCH"):
        content = json.dumps(params)
    if content is not None:
        headers.setdefault("Content-Type", "application/json")
    return httpx.Request(executor.method, url, params=query or None, headers=headers, content=content)


async def _exchange(
    client: httpx.AsyncClient, request: httpx.Request, grants: PermissionSet, cap: int, tool_id: str
) -> tuple[int, Any]:
    """Send ``request`` and follow its redirects, checking every host before anything is sent to it."""
    for _ in range(MAX_REDIRECTS + 1):
        decision = grants.check_host(
            request.url.host, request.url.port or _port(request.url), request.url.scheme
        )
        if not decision.allowed:
            raise ApiCallError(
                PermissionDenied,
                f"api tool '{tool_id}' may not reach {_where(request.url)}: {decision.reason}",
                decision.hint,
            )
        response = await _send_to_one(client, await _pinned(request, tool_id))
        try:
            if response.next_request is not None:
                request = _followed(request, response)
                continue
            raw = await _read_capped(response, cap, tool_id)
        finally:
            await response.aclose()
        body = _decode(response, raw)
        if response.is_success:
            return response.status_code, body
        failure = ApiCallError(
            ToolFailed,
            f"api tool '{tool_id}': {request.method} {_where(request.url)} answered "
            f"{response.status_code} {response.reason_phrase}: {_tail(body)}",
        )
        if response.status_code in RETRIED_STATUS:
            raise _Retry(failure)
        raise failure
    raise ApiCallError(ToolFailed, f"api tool '{tool_id}': more than {MAX_REDIRECTS} redirects")


async def _send_to_one(client: httpx.AsyncClient, candidates: list[httpx.Request]) -> httpx.Response:
    """The first of ``candidates`` (one request per checked address) that connects."""
    for candidate in candidates[:-1]:
        with contextlib.suppress(httpx.ConnectError):
            return await client.send(candidate, stream=True)
    return await client.send(candidates[-1], stream=True)


# IPv6 forms that carry an IPv4 address a router or translator reaches for them: public only if that
# IPv4 address is. (Python counts 64:ff9b::/96, 6to4 and the deprecated IPv4-compatible and site-local
# ranges as global: on a NAT64 network 64:ff9b::a9fe:a9fe is the cloud metadata service.)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NOT_PUBLIC_V6 = (
    ipaddress.ip_network("64:ff9b:1::/48"),  # NAT64 for local use (RFC 8215)
    ipaddress.ip_network("::/96"),  # IPv4-compatible (deprecated)
    ipaddress.ip_network("fec0::/10"),  # site-local (deprecated)
)


def public_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``ip`` is a public address, looking through the IPv6 forms that embed an IPv4 address."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = (
            ip.ipv4_mapped
            or ip.sixtofour
            or (ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in _NAT64 else None)
        )
        if embedded is not None:
            return public_address(embedded)
        if any(ip in network for network in _NOT_PUBLIC_V6):
            return False
    return ip.is_global


async def _pinned(request: httpx.Request, tool_id: str) -> list[httpx.Request]:
    """``request`` addressed to what its host resolves to now, which is checked first.

    A host granted by name reaches public addresses only (``localhost`` its loopback): a name whose
    DNS answer is a private, loopback or link-local address (the cloud metadata service, a service on
    the worker) is refused, and the connection goes to the address that was checked, so a second DNS
    answer cannot move it. A host granted as an address is used as it is.
    """
    host = request.url.host
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return [request]
    port = request.url.port or _port(request.url)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ApiCallError(
            ToolFailed, f"api tool '{tool_id}': cannot resolve {host}: {exc.strerror}"
        ) from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        if not public_address(ip) and not (host.lower() == "localhost" and ip.is_loopback):
            raise ApiCallError(
                PermissionDenied,
                f"api tool '{tool_id}' may not reach {host}: it resolves to {address}, a private or local "
                "address, and a host granted by name reaches public addresses only; grant the address "
                f'itself (hosts="{address}:{port}") if the directive means it',
            )
    headers = httpx.Headers(request.headers)
    headers["Host"] = request.url.netloc.decode("ascii")
    return [
        httpx.Request(
            request.method,
            request.url.copy_with(host=address),
            headers=headers,
            stream=request.stream,
            extensions={**request.extensions, "sni_hostname": host},
        )
        for address in addresses
    ]


def _followed(request: httpx.Request, response: httpx.Response) -> httpx.Request:
    """The redirect's request, addressed by name again (httpx built it against the pinned address).

    It carries the target's own ``Host``: a request built from a stream gets no automatic headers, and
    a target given as an address is sent as it is (``_pinned`` replaces the header for a name).
    """
    following = response.next_request
    assert following is not None
    target = request.url.join(response.headers["location"])
    headers = httpx.Headers(following.headers)
    headers.pop("Host", None)
    same_origin = (target.scheme, target.host, target.port) == (
        request.url.scheme,
        request.url.host,
        request.url.port,
    )
    if not same_origin:
        length = following.headers.get("content-length", "0")
        if length not in ("", "0") or "transfer-encoding" in following.headers:
            # A 307 or 308 sends the body again, and the manifest's body may carry a secret as its headers
            # may ({"token": "${TOKEN}"}): never to another origin.
            raise ApiCallError(
                PermissionDenied,
                f"{request.method} {_where(request.url)} answered {response.status_code} with a redirect to "
                f"{_where(target)}, another origin: the request's body is not sent there again (it may carry "
                "a secret); the call is not followed",
            )
        # Another origin (or http after https) gets none of the manifest's headers: any of them may carry
        # a secret (X-Api-Key: ${TOKEN}), not only Authorization.
        headers = httpx.Headers({k: v for k, v in headers.items() if k.lower() in SAFE_ON_REDIRECT})
    headers["Host"] = target.netloc.decode("ascii")
    return httpx.Request(following.method, target, headers=headers, stream=following.stream)


SAFE_ON_REDIRECT = {
    "accept",
    "accept-encoding",
    "accept-language",
    "user-agent",
    "content-type",
    "content-length",
}


async def _read_capped(response: httpx.Response, cap: int, tool_id: str) -> bytes:
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise ApiCallError(
                ToolFailed,
                f"api tool '{tool_id}': the response is larger than {cap:,} bytes "
                "(raise executor.max_response_bytes, or ask the API for less)",
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _decode(response: httpx.Response, raw: bytes) -> Any:
    text = raw.decode(response.encoding or "utf-8", "replace")
    if "json" in response.headers.get("content-type", ""):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text


def _port(url: httpx.URL) -> int:
    return 443 if url.scheme == "https" else 80


def _where(url: httpx.URL) -> str:
    """A URL for a message: scheme, host, port and path, never its query (credentials live there)."""
    return f"{url.scheme}://{url.host}:{url.port or _port(url)}{url.path}"


def _tail(body: Any) -> str:
    """The end of an error's body for a message, scrubbed before it is cut: a secret the cut split would be
    no longer whole where the message is scrubbed (review s30: 32 of a token's 37 characters reached the
    history through an echoed URL padded by a parameter)."""
    text = scrub_text(body if isinstance(body, str) else json.dumps(body))
    return text[-300:].strip() or "(empty body)"


async def _heartbeating(work: Awaitable[T]) -> T:
    """``work``, heartbeating while it runs, so a cancelled run stops waiting for a slow API."""
    task: asyncio.Future[T] = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=HEARTBEAT_SECONDS)
            if done:
                return task.result()
            if activity.in_activity():
                activity.heartbeat()
    except asyncio.CancelledError:
        task.cancel()
        raise
