"""Resolving a directive for a child run: file I/O, so it is an activity; the decision to run it
(and with which grants) stays in the workflow."""

from __future__ import annotations

from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from kiwi.contracts import ResolveDirectiveRequest, RunSnapshot
from kiwi.errors import ItemInvalid, KiwiError
from kiwi.items.store import ItemStore
from kiwi.seal import seal_resolved
from kiwi.snapshot import build_snapshot


class DirectiveActivities:
    @activity.defn(name="resolve_directive")
    async def resolve_directive(self, req: ResolveDirectiveRequest) -> RunSnapshot:
        store = ItemStore(Path(req.project_root))
        try:
            return seal_resolved(
                build_snapshot(
                    store,
                    req.directive,
                    req.inputs,
                    req.run_id,
                    client_name=req.client,
                    search_attributes=req.search_attributes,
                )
            )
        except ItemInvalid as exc:
            raise ItemInvalid.error(str(exc)) from None
        except KiwiError as exc:
            raise ApplicationError(
                exc.message + (f" ({exc.hint})" if exc.hint else ""), type=exc.type, non_retryable=True
            ) from None
        finally:
            store.close()
