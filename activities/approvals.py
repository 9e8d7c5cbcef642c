"""Telling approvers that a call waits for them: a webhook POST, retried by Temporal."""

from __future__ import annotations

from typing import Any

import httpx
from opentelemetry import propagate
from temporalio import activity

from kiwi.contracts import WebhookRequest
from kiwi.errors import WebhookFailed, WebhookRefused, WebhookUnreachable


class ApprovalActivities:
    @activity.defn(name="notify_approvers")
    async def notify_approvers(self, req: WebhookRequest) -> dict[str, Any]:
        # With tracing on, the approver's service can join the trace of the call that waits.
        headers: dict[str, str] = {}
        propagate.inject(headers)
        async with httpx.AsyncClient(timeout=10) as client:
            try:
                response = await client.post(req.url, json=req.payload, headers=headers)
            except httpx.TransportError as exc:
                raise WebhookUnreachable.error(
                    f"approval webhook unreachable: {type(exc).__name__}"
                ) from None
        if response.status_code >= 500:
            raise WebhookFailed.error(f"approval webhook answered {response.status_code}")
        if response.status_code >= 400:
            raise WebhookRefused.error(f"approval webhook refused the notice ({response.status_code})")
        return {"status": response.status_code}
