"""Say which activities a stopping worker cancelled (trial F32: an expired drain cancelled them silently).

A worker told to stop (SIGTERM, Ctrl-C) polls no more and gives its running activities ``--drain-seconds``
to finish; then the SDK cancels them, and Temporal hands each to another worker after its heartbeat or
start-to-close timeout. Nothing said so: an operator reading the log of a deploy saw the worker stop
cleanly, and a command cut off halfway ran again elsewhere. Each one cancelled that way is now a warning
on the worker's stderr, naming the activity, its run and what happens next.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

log = logging.getLogger("kiwi.worker")


class DrainNotice(Interceptor):
    """Warns of each activity cancelled because its worker stopped before it finished."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except asyncio.CancelledError:
            if activity.is_worker_shutdown():
                info = activity.info()
                what = (
                    "a local activity: its run's workflow task runs it again"
                    if info.is_local
                    else ("Temporal gives it to another worker after its timeout")
                )
                log.warning(
                    "kiwi worker: %s (attempt %d) of run %s was cancelled: the worker stopped and its drain time "
                    "ran out before it finished; %s (a longer --drain-seconds lets such work finish)",
                    info.activity_type,
                    info.attempt,
                    info.workflow_id,
                    what,
                )
            raise
