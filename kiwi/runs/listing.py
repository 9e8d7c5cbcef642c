"""Listing runs and pending approvals (visibility queries), and a run's activities.

A part of :class:`kiwi.runs.RunClient`, which mixes it in."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from temporalio.service import RPCError

from kiwi.contracts import PENDING_APPROVAL_ATTR, PROJECT_ATTR, SEARCH_ATTRIBUTES, is_session
from kiwi.errors import KiwiError
from kiwi.runs.shared import _PENDING_STATES, _quote, _translate


class Pending(list):  # type: ignore[type-arg]
    """Pending approval requests, and whether runs past the limit asked for have some too (``more``: `kiwi
    approvals` says so; it cut at 200 runs without a word)."""

    more: bool = False


class RunListing:
    """Listing runs and pending approvals (visibility queries), and a run's activities."""

    async def list_runs(
        self,
        status: str | None = None,
        directive: str | None = None,
        limit: int = 50,
        *,
        sessions: bool = False,
    ) -> list[dict[str, Any]]:
        """This project's runs (every project's with ``all_projects``), newest first; the projects' sessions
        (the workflows taking calls made outside a run) only with ``sessions``."""
        clauses = ["WorkflowType = 'DirectiveRun'", f"TaskQueue = '{_quote(self.task_queue)}'"]
        if await self._check_search_attributes():
            if status:
                clauses.append(f"KiwiStatus = '{_quote(status)}'")
            if directive:
                clauses.append(f"KiwiDirective = '{_quote(directive)}'")
            if not self.all_projects:
                clauses.append(self._project_clause())

        async def listed(row: dict[str, Any]) -> bool:
            if not sessions and is_session(row["run_id"], row["directive"]):
                return False
            if self.all_projects:
                return True
            if not row["project"]:
                row["project"] = await self.project_of(row["run_id"])
            return row["project"] == self.project or not self._attributes_ready

        # (Filtered as they come, up to `limit` kept: `kiwi runs --limit 1` answered nothing when the first
        # execution listed was the project's session.)
        return await self._listed(" AND ".join(clauses), limit, status, keep=listed)

    async def pending_approvals(self, limit: int = 200) -> Pending:
        """Every pending approval request of this project's running runs (or every project's), from the first
        ``limit`` runs with one (``more``: there are others)."""
        clauses = [
            "WorkflowType = 'DirectiveRun'",
            f"TaskQueue = '{_quote(self.task_queue)}'",
            "ExecutionStatus = 'Running'",
            "KiwiPendingApproval IS NOT NULL",
            "KiwiPendingApproval != ''",
        ]
        if not await self._check_search_attributes():
            raise KiwiError(
                "the search attributes Kiwi needs are not registered on this Temporal server",
                hint="start the server with `kiwi dev` (it registers them)",
            )
        if not self.all_projects:
            clauses.append(self._project_clause())
        pending = Pending()
        polled = await self.worker_polls()
        listed = await self._listed(" AND ".join(clauses), limit + 1, None)
        pending.more = len(listed) > limit
        for row in listed[:limit]:
            row["project"] = row["project"] or await self.project_of(row["run_id"])
            if not self.all_projects and row["project"] != self.project:
                continue
            try:
                status = await self.answered_status(row["run_id"], polled=polled)
                if status is not None:
                    approvals = status.approvals
                else:
                    # (No worker to answer a query: from what Temporal and the audit trail keep.)
                    approvals = (await self.approvals_without_worker(row["run_id"]))[1]
            except KiwiError:
                continue  # finished since it was listed: nothing to decide now
            pending += [
                {
                    "run_id": row["run_id"],
                    "directive": row["directive"],
                    "project": row["project"],
                    **a.model_dump(mode="json"),
                }
                for a in approvals
                if a.status == "pending"
            ]
        return pending

    def _project_clause(self) -> str:
        """This project's runs, and child runs, which carry no KiwiProject: they are their parent's
        (the caller keeps those whose parent is this project's)."""
        return f"(KiwiProject = '{_quote(self.project)}' OR (KiwiProject IS NULL AND ParentWorkflowId IS NOT NULL))"

    async def _listed(
        self,
        query: str,
        limit: int,
        status: str | None,
        keep: Callable[[dict[str, Any]], Awaitable[bool]] | None = None,
    ) -> list[dict[str, Any]]:
        """The executions ``query`` lists, Temporal's order (running ones first, then the latest closed), up to
        ``limit`` of those ``keep`` keeps."""
        runs: list[dict[str, Any]] = []
        # (With ``keep``, pages of about what is kept: the first page is often all of it.)
        pages = {"limit": None, "page_size": min(limit + 10, 1000)} if keep else {"limit": limit}
        async for execution in self.client.list_workflows(query, **pages):
            if len(runs) >= limit:
                break
            attrs = execution.typed_search_attributes
            run_status = attrs.get(SEARCH_ATTRIBUTES[1]) if self._attributes_ready else None
            runs.append(
                {
                    "run_id": execution.id,
                    "directive": attrs.get(SEARCH_ATTRIBUTES[0])
                    if self._attributes_ready
                    else execution.id.split("-")[1],
                    "status": run_status or execution.status.name.lower() if execution.status else "",
                    "step": attrs.get(SEARCH_ATTRIBUTES[2]) if self._attributes_ready else "",
                    "started": execution.start_time.isoformat() if execution.start_time else "",
                    "closed": execution.close_time.isoformat() if execution.close_time else "",
                    "project": attrs.get(PROJECT_ATTR) or "",
                    "pending_approval": attrs.get(PENDING_APPROVAL_ATTR) or "",
                }
            )
            last = runs[-1]
            if (status and not self._attributes_ready and last["status"] != status) or (
                keep is not None and not await keep(last)
            ):
                runs.pop()
        return runs

    async def activities(self, run_id: str) -> list[dict[str, Any]]:
        """The run's activities in flight, with their attempt (2 and up: retried, e.g. after a crash)."""
        await self.check_project(run_id)
        try:
            description = await self.handle(run_id).describe()
        except RPCError as exc:
            raise _translate(exc, run_id) from None
        out = []
        for pending in description.raw_description.pending_activities:
            failure = pending.last_failure.message if pending.HasField("last_failure") else ""
            out.append(
                {
                    "activity": pending.activity_type.name,
                    "attempt": pending.attempt,
                    "state": _PENDING_STATES.get(int(pending.state), "unknown"),
                    "last_failure": failure,
                    "last_worker": pending.last_worker_identity,
                }
            )
        return out
