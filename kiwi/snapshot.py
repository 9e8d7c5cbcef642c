"""A run's fixed input: the directive resolved, validated and bound, its trust, grants and limits.

Built where the run starts (the CLI, the MCP front end) and where a child run starts (an
activity), from the project's items and config: file I/O, but no Temporal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiwi.contracts import (
    ApprovalDecision,
    ApprovalRequest,
    LocalToolSpec,
    RunSnapshot,
    RunTrust,
    session_workflow_id,
)
from kiwi.errors import InputInvalid, KiwiError
from kiwi.harness import HarnessConfig, load_harness
from kiwi.items.directive import Directive, McpDeclaration, Metadata, Step, ToolsDeclaration
from kiwi.items.store import ItemStore, project_root_problem
from kiwi.keys import approval_message, load_trusted, sign_bytes
from kiwi.policy import PermissionSet
from kiwi.signing import check_trust, content_hash, verify
from kiwi.templating import bind_inputs
from kiwi.upstream.registry import McpRegistry, load_registry


def local_tool_specs(store: ItemStore) -> dict[str, LocalToolSpec]:
    """What a run needs to call each local tool it can run (python, bash, api), fixed when the run starts."""
    specs = {}
    for tool_id, manifest in store.local_tools().items():
        if manifest.tool_type in ("python", "bash") and manifest.entrypoint:
            entry = (
                Path(manifest.path) if manifest.legacy else Path(manifest.path).parent / manifest.entrypoint
            )
        elif manifest.tool_type in ("api", "docker"):
            entry = Path(manifest.path)
        else:
            continue
        specs[tool_id] = LocalToolSpec(
            tool_id=tool_id,
            tool_type=manifest.tool_type,
            entrypoint=str(entry),
            mutates_state=manifest.mutates_state,
            timeout_seconds=float(
                manifest.executor.get("timeout", 60 if manifest.tool_type == "docker" else 300)
            ),
            input_schema=manifest.json_schema(),
            executor=manifest.executor if manifest.tool_type in ("api", "docker") else {},
            required_commands=manifest.required_commands(),
            required_environment=manifest.required_environment(),
            required_packages=manifest.required_packages(),
            required_python=manifest.required_python(),
        )
    return specs


def shown_path(path: Path) -> str:
    """``path`` relative to the current folder when it is below it (as `kiwi validate` names files)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _not_runnable(store: ItemStore, tool: str) -> str:
    """Why a step's tool id names nothing this run can call."""
    for record in store.list_items("tool"):
        if record.item_id == tool and not record.valid:
            return f"tool '{tool}', which cannot run: " + "; ".join(record.problems[:2])
    return f"tool '{tool}', which is not a local tool"


def _harness_names_its_tools(store: ItemStore, harness: Any, local_tools: Any, registry: McpRegistry) -> None:
    """Refuse to start a run, or take a call outside one, while the harness names a tool that is none (README
    trial s36: `approvals.tools: [shell.rn]` failed `kiwi validate`, yet runs went on with no approval asked of
    shell.run: a rule that names no tool protects nothing, so the harness is mended first)."""
    from kiwi.harness import PROJECT_FILE
    from kiwi.items.validation import harness_tool_problems

    errors = [
        p
        for p in harness_tool_problems(
            store.project_root, harness, PROJECT_FILE, local_tools, {*registry.servers, *registry.skipped}
        )
        if p.severity == "error"
    ]
    if errors:
        raise InputInvalid(
            "agent_harness.yaml names a tool that is none, so its rule would hold nothing: "
            + "; ".join(p.message for p in errors),
            hint=f"fix the name in {PROJECT_FILE} (or the user's), then try again; `kiwi validate .ai` checks it",
        )


def build_snapshot(
    store: ItemStore,
    name: str,
    inputs: dict[str, Any],
    run_id: str,
    *,
    client_name: str = "cli",
    deadline_seconds: float | None = None,
    search_attributes: bool = False,
) -> RunSnapshot:
    """Resolve, validate and bind a directive into a run's fixed input (raises typed Kiwi errors)."""
    if problem := project_root_problem(store.project_root):
        raise KiwiError(
            f"no run works in this folder: {problem}",
            hint="run Kiwi from a project folder (`kiwi init` makes one), or pass --project PATH",
        )
    directive, text, path = store.load_directive(name)
    bound = bind_inputs(directive, inputs)
    specs = local_tool_specs(store)
    for call in (c for s in directive.steps for c in s.tool_calls):
        if "." not in call.tool and call.tool not in specs:
            raise InputInvalid(
                f"directive '{name}' step calls {_not_runnable(store, call.tool)}",
                hint="add it under .ai/tools/ or fix the tool id (run `kiwi search` to list tools)",
            )
    from kiwi.items.validation import shell_syntax, unknown_builtins

    if nothing := unknown_builtins(directive, shown_path(path), frozenset(specs)):
        # (A misspelt tool of Kiwi's own, `filesystem.reed`, made its step wait for the agent, who cannot call it
        # either; `kiwi validate` said the run would stop there. Review s36.)
        raise InputInvalid(
            f"directive '{name}' calls a tool that is none: " + "; ".join(str(p) for _, p in nothing),
            hint=f"fix the tool id in {shown_path(path)}; `kiwi validate {shown_path(path)}` lists every problem",
        )
    if syntax := shell_syntax(directive, shown_path(path)):
        raise InputInvalid(
            f"directive '{name}' runs a shell command: " + "; ".join(p.message for p in syntax),
            hint=f"`kiwi validate {shown_path(path)}` lists every problem",
        )
    harness = load_harness(store.project_root, store.user)
    registry = load_registry(store.project_root, store.user)
    _harness_names_its_tools(store, harness, specs, registry)
    trusted = load_trusted(store.project_root, store.user)
    limits = harness.limits.model_copy(
        update={"deadline_seconds": deadline_seconds, "approvers": trusted.with_role("approve")}
    )
    declared = {m.name for m in directive.metadata.tools.mcps}
    trust = directive_trust(text, harness.signatures, trusted.with_role("sign"))
    trust.provenance = pulled_from(store.project_root, "directive", directive.name, text)
    grants = run_grants(directive, trust, harness)
    return RunSnapshot(
        run_id=run_id,
        directive=directive,
        content_hash=trust.content_hash,
        source_path=str(path),
        inputs=bound,
        grants=grants,
        project_root=str(store.project_root),
        client=client_name,
        local_tools=specs,
        limits=limits,
        search_attributes=search_attributes,
        mcp_servers={n: c.info() for n, c in registry.servers.items() if n in declared},
        mcp_skipped={n: why for n, why in registry.skipped.items() if n in declared},
        trust=trust,
    )


def run_grants(directive: Directive, trust: RunTrust, harness: HarnessConfig) -> PermissionSet:
    """The grants a run of ``directive`` gets: its own when ``trust`` lets them through, else what they share
    with the harness's base policy (an unsigned or changed directive)."""
    if trust.grants == "declared":
        return directive.grants()
    return harness.base_policy.intersect(directive.grants())


def signed_decision(
    run_id: str, execution: str, request: ApprovalRequest, approved: bool, by: str, reason: str = ""
) -> ApprovalDecision:
    """The ``decide_approval`` signal for ``request`` in that execution of the run, signed with the key ``by``."""
    signature = sign_bytes(
        by, approval_message(run_id, execution, request.request_id, request.args_hash, approved, by)
    )
    return ApprovalDecision(
        request_id=request.request_id,
        approved=approved,
        by=by,
        reason=reason,
        args_hash=request.args_hash,
        signature=signature,
    )


def pulled_from(project_root: Path, kind: str, item_id: str, text: str) -> dict[str, str]:
    """Where a pulled item came from (``.ai/config/registry-lock.json``), if the file is still what was
    pulled; {} otherwise."""
    from kiwi.registry.lock import provenance

    return provenance(project_root, kind, item_id, text)


def directive_trust(text: str, mode: str, signers: dict[str, str]) -> RunTrust:
    """Which grants a directive file runs with under the harness's ``signatures`` mode.

    An agent can write a directive (``execute(directive, create)``, a file write) that grants
    itself anything, so declared grants take effect only when a key the human trusts signed the
    exact content. Otherwise the run gets what its declaration shares with the base policy: never
    more than the agent could already do outside a run. ``warn`` lets an unsigned directive's
    grants through with a warning; a directive modified after signing never gets them unless
    signatures are ``off``.
    """
    status = check_trust(verify(text), signers, "directive")
    trust = RunTrust(
        signature=status.state,
        signer=status.signer,
        trusted=status.trusted,
        content_hash=content_hash(text),
        mode=mode,
    )  # type: ignore[arg-type]
    if mode == "off" or status.trusted:
        return trust
    if status.state == "modified":
        trust.grants = "base"
        trust.note = (
            "modified after signing: runs with the base policy only; re-sign it with `kiwi sign` if the "
            "change is yours"
        )
    elif mode == "require":
        trust.grants = "base"
        who = (
            f"signed by '{status.signer}', which is not a trusted key"
            if status.signer
            else ("not signed by a trusted key")
        )
        trust.note = (
            f"{who}: runs with the base policy only (signatures: require); a human signs it with `kiwi sign`"
        )
    else:
        trust.note = "not signed by a trusted key: its declared grants apply because signatures is 'warn'"
    return trust


def session_mcps(registry: McpRegistry) -> ToolsDeclaration:
    """A session may reach every configured server; the base policy decides which tools it may call."""
    return ToolsDeclaration(mcps=[McpDeclaration(name=name) for name in sorted(registry.servers)])


def build_session_snapshot(
    store: ItemStore, client_name: str, *, search_attributes: bool = False
) -> RunSnapshot:
    """A project's session: the harness's base policy, one step that waits forever."""
    harness = load_harness(store.project_root, store.user)
    registry = load_registry(store.project_root, store.user)
    specs = local_tool_specs(store)
    _harness_names_its_tools(store, harness, specs, registry)
    directive = Directive(
        name="session",
        version="1.0.0",
        metadata=Metadata(
            description=f"interactive calls of {client_name} outside a run", tools=session_mcps(registry)
        ),
        steps=[
            Step(
                name="interactive",
                mode="agent",
                action="Calls made outside a directive run, checked against the "
                "base policy of agent_harness.yaml.",
            )
        ],
    )
    approvers = load_trusted(store.project_root, store.user).with_role("approve")
    return RunSnapshot(
        run_id=session_workflow_id(store.project_root),
        directive=directive,
        content_hash="",
        grants=harness.base_policy,
        project_root=str(store.project_root),
        client=client_name,
        local_tools=specs,
        limits=harness.limits.model_copy(update={"approvers": approvers}),
        search_attributes=search_attributes,
        mcp_servers={n: c.info() for n, c in registry.servers.items()},
    )
