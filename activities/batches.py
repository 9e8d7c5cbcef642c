"""Answering a batch: calls a run's workflow task made together, run at once in one local activity.

A batch never fails for one call's sake (a retried batch would run its other calls again): each call's
outcome is an item of the answer. A refusal is the call's own answer; any other failure asks the run to
retry that call alone; the answers share one payload, and a call whose answer would take it past what
Temporal carries fails once, as a single call's too-large answer does (a read is made again alone).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from kiwi.contracts import MAX_ANSWER_BYTES, BatchItem, BatchResult, json_size
from kiwi.errors import ToolFailed
from kiwi.upstream.pool import scrub_text


async def answer_batch(
    calls: Iterable[tuple[str, Awaitable[Any]]], not_retried: frozenset[str], *, idempotent: bool = False
) -> BatchResult:
    """Run ``calls`` (a label for messages, and the call) at once; their outcomes as items. ``idempotent``
    (reads): a call whose answer does not fit beside the others is handed back to be made again alone,
    instead of failing."""
    pairs = list(calls)
    labels = [label for label, _ in pairs]
    outcomes = await asyncio.gather(*(call for _, call in pairs), return_exceptions=True)
    converter = activity.payload_converter()
    room = MAX_ANSWER_BYTES - 1_000 * len(outcomes)  # (each item's own fields)
    items: list[BatchItem] = []
    for label, outcome in zip(labels, outcomes, strict=True):
        if isinstance(outcome, asyncio.CancelledError):
            raise outcome
        if isinstance(outcome, ApplicationError):
            retry = not outcome.non_retryable and (outcome.type or "") not in not_retried
            message = _cut(outcome.message)
            room -= json_size(message)
            items.append(BatchItem(error_type=outcome.type or "", message=message, retry=retry))
            continue
        if isinstance(outcome, BaseException):
            message = _cut(scrub_text(f"{type(outcome).__name__}: {outcome}"))
            room -= json_size(message)
            items.append(BatchItem(retry=True, message=message))
            continue
        size = converter.to_payloads([outcome])[0].ByteSize()
        if size > room and idempotent:
            items.append(
                BatchItem(retry=True, message=f"{label}: {size:,} bytes do not fit beside the others")
            )
            continue
        if size > room:
            items.append(
                BatchItem(
                    error_type=ToolFailed.type,
                    message=(
                        f"{label}: the answer is {size:,} bytes as sent, more than a run can carry with the "
                        f"calls made at the same moment ({max(room, 0):,} left of {MAX_ANSWER_BYTES:,}); the "
                        "call ran once and is not retried"
                    ),
                )
            )
            continue
        room -= size
        items.append(BatchItem(value=outcome))
    return BatchResult(items=items)


# A refusal's message is cut to this many characters and counted in the shared answer: a server that refused
# one call with megabytes of text took the batch's answer past the limit, and every call of it failed.
MESSAGE_CHARS = 2_000


def _cut(message: str) -> str:
    if len(message) <= MESSAGE_CHARS:
        return message
    return f"{message[:MESSAGE_CHARS]}... ({len(message) - MESSAGE_CHARS:,} more characters cut)"
