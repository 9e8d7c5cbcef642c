"""The call path: lookup, policy, rate and loop checks (kiwi.admission), approval, activity, audit."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.api import ApiToolActivities
    from activities.commands import CommandActivities
    from activities.container import ContainerToolActivities
    from activities.filesystem import FilesystemActivities
    from activities.gittools import GitActivities
    from kiwi.admission import admit
    from kiwi.contracts import (
        ApiToolRequest,
        BatchItem,
        CallRecord,
        CommandRequest,
        CommitPlan,
        ContainerToolRequest,
        FilesystemBatch,
        FilesystemRequest,
        GitRequest,
        LocalToolRequest,
        LocalToolSpec,
        RunSnapshot,
        ToolCallResult,
    )
    from kiwi.errors import PermissionDenied, ToolFailed, ToolNotFound
    from kiwi.guards import digest, redact, summarise_call, summarise_result
    from kiwi.policy import FILESYSTEM_TOOLS, KIWI_MCP_ACTIONS, Decision, parse_command, spellings
    from kiwi.rules import rule_in_force
    from kiwi.toolargs import ARGS_CLOSED, BUILTIN_SCHEMAS, kiwi_execute_target

from workflows.directive_run.errors import (
    CallRefused,
    ToolReportedError,
    failure_of,
    hint_of,
)
from workflows.directive_run.options import (
    API_RETRY,
    CHECKPOINT_DENIALS,
    CHECKPOINT_NUMBERS,
    CHILD_BOUND,
    COMMIT_BOUND,
    CONTINUE_COMMIT_TIMER,
    FS_ACTIVITIES,
    GIT_ACTIVITIES,
    KIWI_EXECUTE_AS_CALL,
    LOOP_WINDOW,
    MUTATING_TOOLS,
    RECENT_CALLS,
    RETRY,
    ROLLBACK_GRANTS,
    ROLLBACK_NAMED,
    TOOL_EXECUTORS,
)
from workflows.directive_run.task_budget import json_bytes

if TYPE_CHECKING:
    from workflows.directive_run.workflow import DirectiveRun


class CallsMixin:
    """The call path: lookup, policy, rate and loop checks (kiwi.admission), approval, activity, audit."""

    # ------------------------------------------------------------------ the call path
    async def _call(
        self: DirectiveRun,
        tool: str,
        args: dict[str, Any],
        *,
        origin: str,
        step: str | None = None,
        client: str = "",
        granted_by: str = "",
        counted: frozenset[str] = frozenset(),
    ) -> ToolCallResult:
        state, snap = self.state, self.snap
        # The validator refused the call if the run was held; one that waited here for the server's tools
        # while another call held the run is refused now, as a later one is, before it takes a call number.
        held_check = self.newest and origin == "agent"
        if held_check:
            declared = await self._declared(tool)  # (may wait for the server's tools)
            self._refuse_if_held()
        state.call_seq += 1
        seq = state.call_seq
        step = step or self._current_step_name()
        started = workflow.now()
        if not held_check:
            declared = await self._declared(tool)
        if declared is not None:
            # An alias (<mcp name="supabase" alias="db">) is only a spelling: policy and audit see the server.
            tool = f"{declared.name}.{tool.partition('.')[2]}"
        # kiwi-mcp.run is kiwi-mcp.execute by another name: a denial, rate limit or approval rule naming
        # either holds for both (runs started before KIWI_EXECUTE_AS_CALL decided each name apart).
        one_execute = (
            self.kiwi_tools
            and KIWI_MCP_ACTIONS.get(tool) == "execute"
            and (self.current or workflow.patched(KIWI_EXECUTE_AS_CALL))
        )
        result, warning = self._admit(tool, args, seq, granted_by, one_execute, counted)
        # What an approval fixes beside the arguments: a git.commit's content, a directive.run's child (session 38).
        bound: CommitPlan | RunSnapshot | None = None
        held_now = ""
        if self.newest and result is None:
            # (Now, not once this call answers: calls in this task find it held.)
            held_now = self._hold_if_looping()
        if (
            result is None
            and self.human_loop
            and any(self._needs_approval(name) for name in (spellings(tool) if one_execute else (tool,)))
        ):
            if (
                tool == "git.rollback"
                and not args.get("checkpoint")
                and state.checkpoints
                and rule_in_force(ROLLBACK_NAMED)
            ):
                # The checkpoint the human approves is the one the rollback goes to (review s37).
                args = {**args, "checkpoint": state.checkpoints[-1]["checkpoint"]}
            if tool == "git.commit" and rule_in_force(COMMIT_BOUND):
                # The approver is shown the files' content, fixed now, and the commit takes that (session 38).
                bound, result = await self._commit_plan(args, seq)
            elif tool == "directive.run" and rule_in_force(CHILD_BOUND):
                # The approver is shown the child as its file is now, and that child starts (session 38).
                bound, result = await self._child_plan(args, seq)
            if result is None:
                result = await self._await_approval(
                    tool, args, seq, origin, step, client or snap.client, bound=bound
                )
        if result is None:
            warnings = [warning] if warning else []
            try:
                value = await self._execute(
                    tool, args, origin, warnings, step=step, client=client, bound=bound
                )
                result = ToolCallResult(status="ok", tool=tool, result=value, call_seq=seq, warnings=warnings)
            except ToolReportedError as exc:
                result = ToolCallResult(
                    status="error",
                    tool=tool,
                    result=exc.outcome.result,
                    call_seq=seq,
                    reason=exc.outcome.error_text or "the tool reported an error",
                    error_type=ToolFailed.type,
                    warnings=warnings,
                )
            except CallRefused as exc:
                result = ToolCallResult(
                    status=exc.status,
                    tool=tool,
                    reason=exc.reason,
                    hint=exc.hint,  # type: ignore[arg-type]
                    error_type=exc.error_type,
                    call_seq=seq,
                )
            except (ActivityError, ApplicationError) as exc:
                result = self._failed(tool, seq, exc)
            if result.status == "ok" and not _delegates(tool, args):
                result_hash = digest(result.result)
                state.result_hashes = (state.result_hashes + [result_hash])[-LOOP_WINDOW:]
                same = state.result_hashes[-snap.limits.loop_repeat_threshold :]
                if (
                    len(same) == snap.limits.loop_repeat_threshold
                    and len(set(same)) == 1
                    and len(set(state.loop_hashes[-snap.limits.loop_repeat_threshold :])) > 1
                ):
                    result.warnings.append(
                        "the same result came back several times in a row; you may be looping"
                    )
                    state.loop_warnings += 1
                    if self.newest:
                        # (Before this call's checkpoint: calls sent meanwhile find it held.)
                        note = self._hold_if_looping()  # (called as before: it publishes)
                        held_now = held_now or note
        if (
            result.status == "ok"
            and self.human_loop
            and snap.directive.metadata.git_checkpoint == "auto"
            and (
                tool in MUTATING_TOOLS or (tool in snap.local_tools and snap.local_tools[tool].mutates_state)
            )
        ):
            await self._checkpoint(f"after {tool}")
        state.recent_calls = (
            state.recent_calls
            + [
                CallRecord(
                    seq=seq,
                    tool=tool,
                    status=result.status,
                    origin=origin,
                    step=step,
                    reason=result.reason,
                    summary=summarise_call(tool, args),
                    at=started.isoformat(),
                )
            ]
        )[-RECENT_CALLS:]
        self.audit.record(
            {
                "event": "tool_call",
                "call_seq": seq,
                "origin": origin,
                "step": step,
                "client": client or snap.client,
                "tool": tool,
                "arguments": redact(args),
                "decision": "allowed"
                if result.status == "ok" or (result.status == "error" and result.error_type != "ToolNotFound")
                else result.status,
                "reason": result.reason,
                "hint": result.hint,
                "error_type": result.error_type,
                "result": summarise_result(result.result) if result.status == "ok" else "",
                "duration_ms": int((workflow.now() - started).total_seconds() * 1000),
                **({"warnings": list(result.warnings)} if result.warnings else {}),
            }
        )
        note = self._hold_if_looping()  # (called as before: it publishes)
        held_now = held_now or note
        if held_now:
            result.warnings.append(held_now)
        if self.audit.pending >= snap.limits.audit_batch_size:
            await self.audit.flush()
        return result

    def _failed(
        self: DirectiveRun, tool: str, seq: int, exc: ActivityError | ApplicationError
    ) -> ToolCallResult:
        """The answer to a call whose activity failed."""
        kind, message = failure_of(exc)
        return ToolCallResult(
            status="denied" if kind == PermissionDenied.type else "error",
            tool=tool,
            reason=message,
            # (FAILURE_HINTS: new runs only, as the answer's size counts in the task budget.)
            hint=hint_of(exc) if self.latest else "",  # type: ignore[arg-type]
            error_type=kind,
            call_seq=seq,
        )

    async def _commit_plan(
        self: DirectiveRun, args: dict[str, Any], seq: int
    ) -> tuple[CommitPlan | None, ToolCallResult | None]:
        """What a git.commit needing approval would commit, its content fixed (COMMIT_BOUND); or the call's answer
        when it commits nothing (nothing to commit, or git cannot), which needs no approval."""
        try:
            plan = await workflow.execute_activity_method(
                GitActivities.git_commit_plan,
                self._git_request(args),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RETRY,
                summary=f"what {summarise_call('git.commit', args)} would commit",
            )
        except (ActivityError, ApplicationError) as exc:
            return None, self._failed("git.commit", seq, exc)
        if not plan.files:
            left = {"left_out": plan.left_out} if plan.left_out else {}
            answer = {"committed": False, "reason": plan.reason, **left}
            return None, ToolCallResult(status="ok", tool="git.commit", result=answer, call_seq=seq)
        return plan, None

    def _git_request(
        self: DirectiveRun, args: dict[str, Any], approved: CommitPlan | None = None
    ) -> GitRequest:
        snap = self.snap
        return GitRequest(
            project_root=snap.project_root,
            message=str(_given(args, "message", "")),
            paths=[str(p) for p in _given(args, "paths", [])],
            read_grants=snap.grants.fs_read,
            deny_fs=snap.grants.deny_fs,
            write_grants=snap.grants.fs_write,
            approved=approved,
        )

    def _hold_if_looping(self: DirectiveRun) -> str:
        """Hold the run (``stuck``) once its loop warnings reach the harness's limit; what to tell the call that did
        it, "" otherwise (README trial s36: its answer still said "if you are stuck, use help(stuck)")."""
        if self.state.loop_warnings >= self.snap.limits.loop_max_warnings:
            before = self.state.status
            self._hold("stuck", f"{self.state.loop_warnings} loop warnings")
            self._publish()
            if self.state.status == "stuck" and before != "stuck":
                return (
                    f"the run is now held (stuck) after {self.state.loop_warnings} loop warnings: calls are refused "
                    f"until a human resumes it (`kiwi resume {self.snap.run_id}`)"
                )
        return ""

    async def _declared(self: DirectiveRun, tool: str) -> Any:
        """The directive's <mcp> declaration ``tool`` belongs to (None for other tools), with the server's
        tools fetched into the run's context the first time one of its tools is called."""
        declared = self._mcp_declaration(tool)
        if declared is not None and declared.name not in self.state.mcp_context:
            await self._fetch_tool_context([declared])
        return declared

    def _admit(
        self: DirectiveRun,
        tool: str,
        args: dict[str, Any],
        seq: int,
        granted_by: str = "",
        one_execute: bool = False,
        counted: frozenset[str] = frozenset(),
    ) -> tuple[ToolCallResult | None, str]:
        """Lookup, arguments, permission, rate limit and loop checks (``kiwi.admission``); a result means
        'not executed'."""
        outcome = admit(
            tool,
            args,
            seq,
            snap=self.snap,
            state=self.state,
            now=workflow.now().timestamp(),
            check_args=self.hardened,
            kiwi_tools=self.kiwi_tools,
            granted_by=granted_by,
            one_execute=one_execute,
            counted=counted,
        )
        return outcome.refusal, outcome.warning

    async def _execute(
        self: DirectiveRun,
        tool: str,
        args: dict[str, Any],
        origin: str = "step",
        warnings: list[str] | None = None,
        *,
        step: str | None = None,
        client: str = "",
        bound: CommitPlan | RunSnapshot | None = None,
    ) -> Any:
        snap = self.snap
        root = snap.project_root
        summary = summarise_call(tool, args)
        options: dict[str, Any] = {
            "start_to_close_timeout": timedelta(seconds=60),
            "retry_policy": RETRY,
            "summary": summary,
        }
        if tool in FILESYSTEM_TOOLS:
            read_only = tool in ("filesystem.read", "filesystem.list")
            grants = snap.grants.fs_read if read_only else snap.grants.fs_write
            content = args.get("content")
            request = FilesystemRequest(
                project_root=root,
                path=str(args.get("source" if tool == "filesystem.move" else "path") or ""),
                destination=str(args.get("destination", "")),
                content=content if isinstance(content, str) or content is None else str(content),
                encoding=_given(args, "encoding", "utf-8"),
                allowed=grants,
                denied=snap.grants.deny_fs,
                # (Dropped before ARGS_CLOSED: asked only where it changes the request.)
                **(
                    {"max_bytes": args["max_bytes"]}
                    if tool == "filesystem.read"
                    and args.get("max_bytes") is not None
                    and rule_in_force(ARGS_CLOSED)
                    else {}
                ),
            )
            if self.fs_local and read_only and self.batched:
                # Reads and listings made in the same workflow task go out together (one local activity).
                item = await self._batched(
                    "filesystem",
                    (tool, request),
                    one=lambda call: self._fs_one(call, options),
                    many=lambda calls: self._fs_many(calls, options),
                )
                value = (
                    item.value
                    if not item.retry  # else no room beside the others, or an unexpected failure
                    else await self._read_alone(tool, request, options)
                )
            elif self.fs_local:
                # A local activity: run by this worker inside the workflow task, no task-queue round
                # trip and no activity events; same timeout, retry policy and at-least-once contract.
                value = await workflow.execute_local_activity_method(FS_ACTIVITIES[tool], request, **options)
            else:
                value = await workflow.execute_activity_method(FS_ACTIVITIES[tool], request, **options)
        elif tool == "shell.run":
            argv = parse_command(args)
            if isinstance(argv, Decision):  # admission refused these already; never a failed workflow task
                raise CallRefused("denied", argv.reason, argv.hint)
            request = CommandRequest(
                project_root=root,
                argv=argv,
                cwd=str(_given(args, "cwd", ".")),
                timeout_seconds=float(_given(args, "timeout", 120)),
                read_grants=snap.grants.fs_read,
                write_grants=snap.grants.fs_write,
                deny_fs=snap.grants.deny_fs,
            )
            value = await workflow.execute_activity_method(
                CommandActivities.run_command,
                request,
                heartbeat_timeout=timedelta(seconds=10),
                **{**options, "start_to_close_timeout": timedelta(seconds=request.timeout_seconds + 30)},
            )
        elif tool == "git.checkpoint":
            if snap.directive.metadata.git_checkpoint == "disabled":
                raise CallRefused(
                    "denied",
                    "git checkpoints are disabled for this directive",
                    hint='<git_checkpoint mode="disabled"> is set in the directive',
                )
            value = await self._checkpoint(str(args.get("message") or args.get("reason") or "requested"))
        elif tool == "git.rollback":
            checkpoint = str(
                args.get("checkpoint")
                or (self.state.checkpoints[-1]["checkpoint"] if self.state.checkpoints else "")
            )
            scope = (
                {"write_grants": snap.grants.fs_write, "deny_fs": snap.grants.deny_fs}
                if rule_in_force(ROLLBACK_GRANTS)
                else {}
            )
            value = await workflow.execute_activity_method(
                GitActivities.git_rollback,
                GitRequest(project_root=root, run_id=snap.run_id, checkpoint=checkpoint, **scope),
                **{**options, "summary": f"git rollback to {checkpoint}"},
            )
            self.audit.record({"event": "rolled_back", "checkpoint": checkpoint})
        elif tool in GIT_ACTIVITIES:
            request = self._git_request(args, bound if isinstance(bound, CommitPlan) else None)
            value = await workflow.execute_activity_method(GIT_ACTIVITIES[tool], request, **options)
        elif tool == "directive.run":
            value = await self._run_child(args, origin, bound if isinstance(bound, RunSnapshot) else None)
        elif tool in KIWI_MCP_ACTIONS and self.kiwi_tools:
            value = await self._kiwi_tool(tool, args, origin, step=step, client=client)
        elif tool.partition(".")[0] in self.state.mcp_context:
            value = await self._call_mcp(tool, args, warnings if warnings is not None else [])
        elif (
            tool in snap.local_tools
            and snap.local_tools[tool].tool_type in ("api", "docker")
            and (self.current or workflow.patched(TOOL_EXECUTORS))
        ):
            value = await self._run_executor(snap.local_tools[tool], args, options)
        elif tool in snap.local_tools:
            spec = snap.local_tools[tool]
            value = await workflow.execute_activity_method(
                CommandActivities.run_local_tool,
                LocalToolRequest(project_root=root, tool=spec, params=args),
                heartbeat_timeout=timedelta(seconds=10),
                **{
                    **options,
                    "summary": f"tool {tool}",
                    "start_to_close_timeout": timedelta(seconds=spec.timeout_seconds + 30),
                },
            )
        else:
            raise ToolNotFound.error(f"no executor for '{tool}' in this run")
        return value

    async def _read_alone(
        self: DirectiveRun, tool: str, request: FilesystemRequest, options: dict[str, Any]
    ) -> Any:
        """A read its batch handed back, made again on its own with the usual retry policy: one at a time,
        each in a workflow task of its own. A task's completion carries each answer made in it twice (the
        local activity's marker and the call's update completion) and Temporal takes 4 MB of it: re-read
        together, or beside the batch's answers, a few large files made it larger and the run was ended."""
        async with self.rereads:
            await workflow.sleep(CONTINUE_COMMIT_TIMER)  # (a timer ends the task: what came before is sent)
            item = await self._within_budget(
                lambda: self._fs_one((tool, request), options),
                answered=lambda item: json_bytes(item.model_dump()),
            )
            return item.value

    async def _fs_one(
        self: DirectiveRun, call: tuple[str, FilesystemRequest], options: dict[str, Any]
    ) -> BatchItem:
        """A batch of one read: the call's own local activity, as before batching (same history)."""
        tool, request = call
        return BatchItem(
            value=await workflow.execute_local_activity_method(FS_ACTIVITIES[tool], request, **options)
        )

    async def _fs_many(
        self: DirectiveRun,
        calls: list[tuple[str, FilesystemRequest]],
        options: dict[str, Any],
    ) -> list[BatchItem]:
        result = await workflow.execute_local_activity_method(
            FilesystemActivities.read_many,
            FilesystemBatch(
                operations=[tool.partition(".")[2] for tool, _ in calls], requests=[r for _, r in calls]
            ),
            **{**options, "summary": f"filesystem: {len(calls)} reads and listings"},
        )
        return result.items

    async def _run_executor(
        self: DirectiveRun, spec: LocalToolSpec, args: dict[str, Any], options: dict[str, Any]
    ) -> Any:
        """An api tool (with the run's network grants) or a docker tool (with its filesystem grants)."""
        grants = self.snap.grants
        options = {**options, "summary": f"{spec.tool_type} tool {spec.tool_id}", "retry_policy": API_RETRY}
        if spec.tool_type == "api":
            attempts = 1 + int(spec.executor.get("retries", 0) or 0)
            return await workflow.execute_activity_method(
                ApiToolActivities.call_api_tool,
                ApiToolRequest(
                    tool=spec,
                    params=args,
                    network_hosts=grants.network_hosts,
                    deny_network=grants.deny_network,
                ),
                heartbeat_timeout=timedelta(seconds=10),
                **{
                    **options,
                    "start_to_close_timeout": timedelta(
                        seconds=float(spec.executor.get("timeout", 30)) * attempts + 30
                    ),
                },
            )
        return await workflow.execute_activity_method(
            ContainerToolActivities.run_container_tool,
            ContainerToolRequest(
                project_root=self.snap.project_root,
                tool=spec,
                params=args,
                read_grants=grants.fs_read,
                write_grants=grants.fs_write,
                deny_fs=grants.deny_fs,
            ),
            heartbeat_timeout=timedelta(seconds=10),
            **{**options, "start_to_close_timeout": timedelta(seconds=spec.timeout_seconds + 60)},
        )

    def _checkpoint_number(self: DirectiveRun) -> int:
        """The next checkpoint's number: one past the last one's (the run keeps its last 100: their count stopped
        at 100, and every checkpoint from the 102nd was number 101, review s37)."""
        kept = self.state.checkpoints
        counted = len(kept) + 1
        if len(kept) < 100:
            return counted  # (numbered 1..n: the last one's is n)
        try:
            following = int(str(kept[-1]["checkpoint"]).rsplit("/", 1)[1]) + 1
        except (KeyError, IndexError, ValueError):
            return counted
        return following if following != counted and rule_in_force(CHECKPOINT_NUMBERS) else counted

    async def _checkpoint(self: DirectiveRun, why: str) -> dict[str, Any]:
        """A git checkpoint of the project's files; recorded in the run when git is available."""
        label = f"{self.snap.run_id}/{self._checkpoint_number()}"
        denied = self.snap.grants.deny_fs
        value = await workflow.execute_activity_method(
            GitActivities.git_checkpoint,
            GitRequest(
                project_root=self.snap.project_root,
                run_id=self.snap.run_id,
                checkpoint=label,
                message=f"kiwi checkpoint {label}: {why}",
                **({"deny_fs": denied} if denied and rule_in_force(CHECKPOINT_DENIALS) else {}),
            ),
            start_to_close_timeout=timedelta(seconds=120),
            retry_policy=RETRY,
            summary=f"git checkpoint: {why}"[:100],
        )
        if value.available:
            self.state.checkpoints = [
                *self.state.checkpoints,
                {"checkpoint": label, "commit": value.commit, "why": why, "at": workflow.now().isoformat()},
            ][-100:]
        self.audit.record({"event": "checkpoint", "why": why, **value.shown()})
        return value.shown()

    def _input_schema(self: DirectiveRun, tool: str) -> dict[str, Any] | None:
        """The JSON Schema of ``tool``'s input: a built-in's, a local tool's manifest, an MCP tool's as listed
        when the run started (None when unknown)."""
        if tool in BUILTIN_SCHEMAS:
            return BUILTIN_SCHEMAS[tool]
        if tool in self.snap.local_tools:
            return self.snap.local_tools[tool].input_schema or None
        declared = self._mcp_declaration(tool)
        context = self.state.mcp_context.get(declared.name) if declared is not None else None
        if declared is None or context is None:
            return None
        name = f"{declared.name}.{tool.partition('.')[2]}"
        listed = next((t for t in context.tools if t.get("name") == name), None)
        schema = listed.get("inputSchema") if listed else None
        return schema if isinstance(schema, dict) else None


def _delegates(tool: str, args: dict[str, Any]) -> bool:
    """A kiwi-mcp.execute call of a tool: the tool's own call (made inside it) is the one loop checks count."""
    return KIWI_MCP_ACTIONS.get(tool) == "execute" and kiwi_execute_target(args)[0] == "tool"


def _given(args: dict[str, Any], name: str, default: Any) -> Any:
    """A built-in's optional argument, ``default`` when left out or sent as null (README trial s34: `"encoding":
    null` failed the run's workflow task over and over, jamming the run; `"timeout": null`, `"paths": null` too)."""
    value = args.get(name)
    return default if value is None else value
