"""``agent_harness.yaml``: base policy for calls outside a directive, rate limits, loop thresholds.

Project ``.ai/config/`` over user ``~/.ai/config/``: keys in the project file win, key by key.
"""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kiwi import yamltext
from kiwi.contracts import RunLimits
from kiwi.errors import ItemInvalid, Problem
from kiwi.policy import PermissionSet, host_grant_problem, path_grant_problem


class InputRounds(BaseModel):
    """``input_rounds``: which human decisions the MCP front end may ask through the client's user.

    An MCP input round (SEP-2322) lets a client that can ask its user answer a run's escalation
    without `kiwi decide`, or a call's approval without `kiwi approve`. The answer is signed with the
    approver key ``sign_as`` (the front end signs; the client never holds a key), so it is trusted
    only as far as the operator trusts the client's user: off by default, each switch on its own.
    """

    model_config = ConfigDict(extra="forbid")

    escalations: bool = False
    # Approvals too: a call waiting for approval asks the client's user, shown exactly what will run and
    # its call hash. Off by default and a separate switch: the client's user may be the agent itself.
    approvals: bool = False
    sign_as: str = ""


class HarnessConfig(BaseModel):
    limits: RunLimits = Field(default_factory=RunLimits)
    base_policy: PermissionSet = Field(default_factory=PermissionSet)
    sources: list[str] = Field(default_factory=list)
    # require: a directive's declared grants take effect only when a trusted key signed it.
    signatures: Literal["require", "warn", "off"] = "require"
    input_rounds: InputRounds = Field(default_factory=InputRounds)
    # registry.agent_publish: agents may publish (execute(action=publish)) what a human signed.
    agent_publish: bool = False


def _load(data: Any, path: Path) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ItemInvalid([Problem("agent_harness.yaml must be a YAML mapping", str(path), 1, 1)])
    return data


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


# The project's harness file (the user's is ~/.ai/config/agent_harness.yaml).
PROJECT_FILE = ".ai/config/agent_harness.yaml"
RATE_UNITS = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}


def set_rate(limits: RunLimits, pattern: str, value: Any, key: str) -> None:
    """A rate limit for ``pattern``: a whole number counts calls per run, "N/minute" (second, hour,
    day) counts calls in that sliding window of workflow time."""
    count, _, unit = str(value).strip().partition("/")
    unit = unit.strip().rstrip("s")
    calls = int(count) if count.strip().isdigit() else -1
    if calls < 0 or (unit and unit not in RATE_UNITS):
        raise ValueError(
            f"{key} is '{value}'; expected a whole number of calls per run or N/second, N/minute, "
            "N/hour or N/day, e.g. 100/minute"
        )
    # One limit per pattern: a window replaces the pattern's per-run default, and the reverse.
    if unit:
        limits.rate_limits.pop(pattern, None)
        limits.rate_windows[pattern] = (calls, RATE_UNITS[unit])
    else:
        limits.rate_windows.pop(pattern, None)
        limits.rate_limits[pattern] = calls


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Loops(_Strict):
    repeat_threshold: int | None = None
    max_warnings: int | None = None


class _Runs(_Strict):
    continue_as_new_after_updates: int | None = None
    audit_batch_size: int | None = None


class _Children(_Strict):
    on_escalation: Literal["deny", "intersect"] | None = None


class _Registry(_Strict):
    # execute(action=publish) copies a project item to a registry every reader can read: an agent could
    # send out anything a human signed. Off unless the human turns it on; `kiwi publish` is theirs.
    agent_publish: bool = False


class _Approvals(_Strict):
    tools: list[str] | None = None
    timeout_seconds: float | None = Field(default=None, gt=0)
    # A call nobody approved never runs: deny is the only outcome of a timeout.
    on_timeout: Literal["deny"] = "deny"
    webhook: str | None = None


class _Filesystem(_Strict):
    read: list[str] = Field(default_factory=list)
    write: list[str] = Field(default_factory=list)
    # The seed's forms (mcp-orchestration-design.md): taken at their meaning inside the project.
    enabled: bool = True
    allowed_paths: list[str] = Field(default_factory=list)
    read_only_paths: list[str] = Field(default_factory=list)


class _Shell(_Strict):
    allowed_commands: list[str] = Field(default_factory=list)
    blocked_commands: list[str] | None = None
    enabled: bool = True


class _McpGrant(_Strict):
    enabled: bool = True
    tools: list[str] = Field(default_factory=lambda: ["*"])
    rate_limit: int | str | None = None
    require_approval: list[str] = Field(default_factory=list)


class _Network(_Strict):
    # Hosts api tools may reach outside a run (and in unsigned directives): HOST or HOST:PORT.
    hosts: list[str] = Field(default_factory=list)


class _InternalTools(_Strict):
    filesystem: _Filesystem = Field(default_factory=_Filesystem)
    shell: _Shell = Field(default_factory=_Shell)
    network: _Network = Field(default_factory=_Network)
    tools: list[str] = Field(default_factory=list)
    mcps: dict[str, _McpGrant | None] = Field(default_factory=dict)


class HarnessFile(_Strict):
    """``agent_harness.yaml`` as written: every key typed, unknown keys refused (a typo never means "all")."""

    # The seed's harness names its mode; Kiwi always enforces (proxy), so only that value is accepted.
    mode: Literal["proxy"] = "proxy"
    # The seed's list of the MCP servers the agent itself connects to: the agent's client configuration,
    # which Kiwi cannot see. Refused with that explanation (see load_harness).
    allowed_mcps: list[str] | None = None
    signatures: Literal["require", "warn", "off"] = "require"
    rate_limits: dict[str, int | str] | None = None
    loop_detection: _Loops = Field(default_factory=_Loops)
    runs: _Runs = Field(default_factory=_Runs)
    child_runs: _Children = Field(default_factory=_Children)
    approvals: _Approvals = Field(default_factory=_Approvals)
    internal_tools: _InternalTools = Field(default_factory=_InternalTools)
    input_rounds: InputRounds = Field(default_factory=InputRounds)
    registry: _Registry = Field(default_factory=_Registry)


# Keys of the seeds' harness written at another level than Kiwi reads them: the error says where.
MISPLACED = {
    "allowed_paths": "internal_tools.filesystem.allowed_paths",
    "read_only_paths": "internal_tools.filesystem.read_only_paths",
    "allowed_commands": "internal_tools.shell.allowed_commands",
    "blocked_commands": "internal_tools.shell.blocked_commands",
    "rate_limit": "internal_tools.mcps.NAME.rate_limit",
    "require_approval": "internal_tools.mcps.NAME.require_approval (or approvals.tools)",
}


def _problem(exc: ValidationError, source: str) -> Problem:
    first = exc.errors()[0]
    key = ".".join(str(p) for p in first["loc"] if not str(p).startswith(("function-", "tagged-union")))
    value = first.get("input")
    shown = f" (got {value!r})" if not isinstance(value, dict) and value is not None else ""
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        leaf = str(first["loc"][-1]) if first["loc"] else ""
        near = difflib.get_close_matches(leaf, _keys_beside(first["loc"]), n=1, cutoff=0.85)
        misplaced = leaf in MISPLACED and key != MISPLACED[leaf]
        if near:
            message = f"unknown key; did you mean {near[0]}?" + (
                f" (or, where Kiwi reads it, {MISPLACED[leaf]})" if misplaced else ""
            )
        elif misplaced:
            message = f"unknown key here; write it as {MISPLACED[leaf]}"
        else:
            message = "unknown key; see the README's harness settings for the keys Kiwi reads"
    elif first["type"] == "list_type":
        message = 'expected a list, e.g. ["notes/**"]'
    return _said(f"{key}: {message}{shown}", source)


def _said(text: str, source: str) -> Problem:
    """A problem of the harness: ``source`` names the file when there is one (its name again in the text
    said it twice), else the text does."""
    return Problem(text if source else f"agent_harness.yaml: {text}", source)


def _keys_beside(loc: tuple[Any, ...]) -> list[str]:
    """The keys Kiwi reads where an unknown key ``loc`` was written (for a did-you-mean)."""
    model: Any = HarnessFile
    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if isinstance(model, type) else None
        if field is None:
            return []
        inner = [a for a in (field.annotation, *typing.get_args(field.annotation)) if isinstance(a, type)]
        models = [a for a in inner if issubclass(a, BaseModel)]
        if not models:
            return []
        model = models[0]
    return [field.alias or name for name, field in model.model_fields.items()]


def _seed_path(path: str, key: str) -> str:
    """A seed-style path grant as a project glob: ``${PROJECT_PATH}`` (or ``.``) is the whole project, a
    folder inside it is that folder and everything under it; anything outside the project is refused
    (Kiwi's file tools never leave the project)."""
    text = str(path).strip().rstrip("/")
    if text in ("${PROJECT_PATH}", ".", ""):
        return "**"
    if text.startswith("${PROJECT_PATH}/"):
        text = text[len("${PROJECT_PATH}/") :]
    if text.startswith(("/", "~", "$")):
        raise ValueError(
            f"internal_tools.filesystem.{key}: '{path}' is outside the project; Kiwi's file tools work "
            "only inside it. Write project folders (e.g. src, docs) or ${PROJECT_PATH} for all of it"
        )
    return text if any(c in text for c in "*?[") else f"{text}/**"


def load_harness(project_root: Path, user_space: Path) -> HarnessConfig:
    data: dict[str, Any] = {}
    sources = []
    user_file = user_space / "config" / "agent_harness.yaml"
    if user_file.is_file():
        data = _merge(data, _load(yamltext.read(user_file), user_file))
        sources.append(str(user_file))
    # The project's is read with no link followed on the way (kiwi.projectfiles).
    project = yamltext.read_in_project(project_root, PROJECT_FILE)
    if project is not None:
        data = _merge(data, _load(project, project_root / PROJECT_FILE))
        sources.append(str(project_root / PROJECT_FILE))
    source = sources[-1] if sources else ""
    try:
        parsed = HarnessFile.model_validate(data)
    except ValidationError as exc:
        raise ItemInvalid([_problem(exc, source)]) from None
    limits = RunLimits()
    try:
        for pattern, value in (parsed.rate_limits or {}).items():
            set_rate(limits, str(pattern), value, f"rate_limits.{pattern}")
        loops, runs = parsed.loop_detection, parsed.runs
        limits.loop_repeat_threshold = loops.repeat_threshold or limits.loop_repeat_threshold
        limits.loop_max_warnings = loops.max_warnings or limits.loop_max_warnings
        limits.max_updates_before_continue = (
            runs.continue_as_new_after_updates or limits.max_updates_before_continue
        )
        limits.audit_batch_size = runs.audit_batch_size or limits.audit_batch_size
        limits.on_escalation = parsed.child_runs.on_escalation or limits.on_escalation
        approvals = parsed.approvals
        if approvals.tools is not None:
            limits.approval_tools = list(approvals.tools)
        limits.approval_timeout_seconds = approvals.timeout_seconds or limits.approval_timeout_seconds
        limits.approval_webhook = approvals.webhook or ""
        tools = parsed.internal_tools
        if tools.shell.blocked_commands is not None:
            limits.blocked_commands = list(tools.shell.blocked_commands)
        mcps = {name: entry or _McpGrant() for name, entry in tools.mcps.items()}
        for name, entry in mcps.items():
            if entry.rate_limit is not None:
                set_rate(limits, f"{name}.*", entry.rate_limit, f"internal_tools.mcps.{name}.rate_limit")
            limits.approval_tools += [f"{name}.{t}" for t in entry.require_approval]
        if parsed.allowed_mcps is not None:
            raise ValueError(
                "allowed_mcps: the MCP servers an agent connects to are set in the agent's own client "
                "configuration (give it only Kiwi); Kiwi's upstream servers are declared in "
                "mcp_registry.yaml and granted with internal_tools.mcps.NAME or a directive's <permissions>; "
                "remove allowed_mcps"
            )
        fs = tools.filesystem
        seed_read = [_seed_path(p, "read_only_paths") for p in fs.read_only_paths]
        seed_write = [_seed_path(p, "allowed_paths") for p in fs.allowed_paths]
        fs_read = [*fs.read, *seed_read] if fs.enabled else []
        fs_write = [*fs.write, *seed_write] if fs.enabled else []
        for key, globs in (("read", fs_read), ("write", fs_write)):
            for glob in globs:
                problem = path_grant_problem(glob)
                if problem:
                    raise ValueError(f"internal_tools.filesystem.{key}: {problem}")
        for host in tools.network.hosts:
            if problem := host_grant_problem(host):
                raise ValueError(f"internal_tools.network.hosts: {problem}")
        base = PermissionSet(
            fs_read=[*fs_read, *fs_write],
            fs_write=fs_write,
            shell=list(tools.shell.allowed_commands) if tools.shell.enabled else [],
            tools=list(tools.tools),
            mcp={name: list(entry.tools) for name, entry in mcps.items() if entry.enabled},
            network_hosts=list(tools.network.hosts),
        )
    except (TypeError, ValueError) as exc:
        raise ItemInvalid([_said(str(exc), source)]) from None
    rounds = parsed.input_rounds
    if (rounds.escalations or rounds.approvals) and not rounds.sign_as:
        which = "escalations" if rounds.escalations else "approvals"
        raise ItemInvalid(
            [
                _said(
                    f"input_rounds.{which} needs input_rounds.sign_as: the approver "
                    "key (trusted_keys.yaml, role approve) the MCP front end signs the answers with",
                    source,
                )
            ]
        )
    return HarnessConfig(
        limits=limits,
        base_policy=base,
        sources=sources,
        signatures=parsed.signatures,
        input_rounds=parsed.input_rounds,
        agent_publish=parsed.registry.agent_publish,
    )
