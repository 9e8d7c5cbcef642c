"""An activity's answer stays within what Temporal takes: past it, the call fails once, never again.

Temporal refuses a payload over 2 MB (its default error limit). An activity whose result is larger had
its completion refused and taken for a retryable failure, so the tool ran again, up to its retry
policy's attempts (a mutating tool's effect five times, an api POST three), and a local activity's
result that large failed the run's workflow task on every attempt. The size is what the worker's data
converter makes of the result, so text whose JSON spelling outgrows the tool's output cap (control
characters are six bytes each) is measured as sent.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.common import RawValue
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from kiwi.contracts import MAX_ANSWER_BYTES
from kiwi.errors import ToolFailed


class AnswerLimit(Interceptor):
    """Fails an activity (``ToolFailed``, not retried) whose result would pass ``MAX_ANSWER_BYTES``."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        # The answer is converted once: measured here, then handed on as the payload itself (a RawValue
        # passes through the worker's converter as it is).
        result = await super().execute_activity(input)
        payloads = activity.payload_converter().to_payloads([result])
        size = sum(p.ByteSize() for p in payloads)
        if size > MAX_ANSWER_BYTES:
            raise ToolFailed.error(
                f"{activity.info().activity_type}: the answer is {size:,} bytes as sent, more than a run can "
                f"carry ({MAX_ANSWER_BYTES:,}); the call ran once and is not retried"
            )
        return RawValue(payloads[0]) if len(payloads) == 1 else result
