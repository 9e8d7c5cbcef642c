"""Telling approvers that a call waits for them: a webhook POST, retried by Temporal."""

from __future__ import annotations

import re
from typing import Any

import httpx
from opentelemetry import propagate
from temporalio import activity

from kiwi.contracts import WebhookRequest
from kiwi.errors import SecretMissing, WebhookFailed, WebhookRefused, WebhookUnreachable
from kiwi.upstream.pool import remember_secrets
from kiwi.upstream.registry import kiwi_own, lookup_secret

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def resolved_url(url: str) -> str:
    """The webhook's URL with each ``${NAME}`` filled in here, in the worker, from its environment (or the OS
    keyring): a Slack-style URL is itself a credential, and the run's history holds only the placeholder."""
    values: dict[str, str] = {}
    for name in _PLACEHOLDER.findall(url):
        value = lookup_secret(name)
        if value is None:
            why = (
                kiwi_own(name)
                or f"export {name}=... where the worker runs (or the OS keyring, service 'kiwi')"
            )
            raise SecretMissing.error(
                f"the approval webhook needs ${{{name}}}, which is not set where the worker runs",
                {"hint": why},
            )
        values[name] = value
    remember_secrets(values)
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], url)


class ApprovalActivities:
    @activity.defn(name="notify_approvers")
    async def notify_approvers(self, req: WebhookRequest) -> dict[str, Any]:
        # With tracing on, the approver's service can join the trace of the call that waits.
        headers: dict[str, str] = {}
        propagate.inject(headers)
        url = resolved_url(req.url)
        async with httpx.AsyncClient(timeout=10) as client:
            try:
                response = await client.post(url, json=req.payload, headers=headers)
            except httpx.TransportError as exc:
                raise WebhookUnreachable.error(
                    f"approval webhook unreachable: {type(exc).__name__}"
                ) from None
        if response.status_code >= 500:
            raise WebhookFailed.error(f"approval webhook answered {response.status_code}")
        if response.status_code >= 400:
            raise WebhookRefused.error(f"approval webhook refused the notice ({response.status_code})")
        return {"status": response.status_code}
