"""``mcp_registry.yaml``: the external MCP servers Kiwi may call, by name.

Project ``.ai/config/`` over user ``~/.ai/config/`` (a project entry replaces the user's entry of
the same name). ``${NAME}`` in ``env``, ``url`` and ``headers`` is a
secret or setting resolved from the environment (then the OS keyring, when the ``keyring``
package is installed) only where the connection is made, in the worker's activities. Resolved
values never enter a run's snapshot, workflow history, logs or the audit trail: the snapshot
carries only :class:`McpServerInfo`, which has no connection details. ``command`` and ``args`` take only
``${PROJECT_PATH}`` and ``${HOME}``: a process's command line is readable by every user of the machine.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, PrivateAttr, ValidationError

from kiwi import yamltext
from kiwi.contracts import McpServerInfo
from kiwi.errors import ItemInvalid, KiwiError, Problem

# The project's registry file (the user's is ~/.ai/config/mcp_registry.yaml).
PROJECT_FILE = ".ai/config/mcp_registry.yaml"
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
BUILTIN_VARIABLES = ("PROJECT_PATH", "HOME")  # not secrets: filled in from where the run works
KNOWN_KEYS = (
    "type",
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "description",
    "tools",
    "allowed_paths",
    "require_approval",
    "approval_timeout",
    "timeout",
    "connect_timeout",
    "idle_timeout",
    "schema_ttl",
    "enabled",
)


class McpServerConfig(BaseModel):
    """One server entry, placeholders unresolved."""

    name: str
    type: Literal["stdio", "streamable-http", "sse"] = "stdio"
    command: str = ""
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str = ""
    headers: dict[str, str] = Field(default_factory=dict)
    description: str = ""
    tools: list[str] = Field(default_factory=list)
    require_approval: list[str] = Field(default_factory=list)
    approval_timeout_seconds: float | None = None
    timeout_seconds: float = Field(default=60.0, gt=0)
    connect_timeout_seconds: float = Field(default=30.0, gt=0)
    idle_timeout_seconds: float = Field(default=300.0, gt=0)
    schema_ttl_seconds: float = Field(default=3600.0, ge=0)
    source: str = ""
    _fingerprint: str | None = PrivateAttr(default=None)

    def info(self) -> McpServerInfo:
        return McpServerInfo(
            name=self.name,
            description=self.description,
            tools=self.tools,
            require_approval=self.require_approval,
            approval_timeout_seconds=self.approval_timeout_seconds,
            timeout_seconds=self.timeout_seconds,
        )

    def variables(self) -> list[str]:
        """Every ``${NAME}`` the entry uses, in order of first use."""
        texts = [
            self.command,
            *self.args,
            *self.env.values(),
            self.url,
            *self.headers.values(),
            self.cwd or "",
        ]
        seen: dict[str, None] = {}
        for text in texts:
            for name in PLACEHOLDER.findall(text):
                seen.setdefault(name, None)
        return list(seen)

    def missing_variables(self) -> list[str]:
        return [n for n in self.variables() if n not in BUILTIN_VARIABLES and lookup_secret(n) is None]

    def fingerprint(self) -> str:
        """Changes when the connection details change (placeholders, not their values).

        Worked out once per entry: the pool keys every call by it, and entries are re-read, not
        changed in place, when the registry file changes.
        """
        if self._fingerprint is None:
            data = self.model_dump(
                exclude={"description", "source", "require_approval", "approval_timeout_seconds"}
            )
            self._fingerprint = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
        return self._fingerprint

    def resolved(self, project_root: str) -> tuple[McpServerConfig, dict[str, str]]:
        """A copy with placeholders filled in, and the secret values used (to redact from results).

        Raises :class:`SecretMissing` naming the variable when one has no value.
        """
        secrets: dict[str, str] = {}
        builtins = {"PROJECT_PATH": project_root, "HOME": str(Path.home())}

        def fill(text: str) -> str:
            def one(match: re.Match[str]) -> str:
                name = match.group(1)
                if name in builtins:
                    return builtins[name]
                value = lookup_secret(name)
                if value is None:
                    raise SecretMissing(
                        f"MCP server '{self.name}' needs ${{{name}}}, which is "
                        + ("refused" if kiwi_own(name) else "not set"),
                        hint=kiwi_own(name)
                        or f"export {name}=... in the worker's environment (or store it in the "
                        f"OS keyring under service 'kiwi'), then retry",
                    )
                if value:
                    secrets[name] = value
                return value

            return PLACEHOLDER.sub(one, text)

        copy = self.model_copy(
            update={
                "command": fill(self.command),
                "args": [fill(a) for a in self.args],
                "env": {k: fill(v) for k, v in self.env.items()},
                "url": fill(self.url),
                "headers": {k: fill(v) for k, v in self.headers.items()},
                "cwd": fill(self.cwd) if self.cwd else None,
            }
        )
        copy._fingerprint = None  # a resolved copy holds values, not placeholders
        return copy, secrets


class SecretMissing(KiwiError):
    type = "SecretMissing"


class McpRegistry(BaseModel):
    servers: dict[str, McpServerConfig] = Field(default_factory=dict)
    skipped: dict[str, str] = Field(default_factory=dict)
    sources: list[str] = Field(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        return [f"MCP server '{name}' skipped: {why}" for name, why in self.skipped.items()]

    def get(self, name: str) -> McpServerConfig:
        if name in self.servers:
            return self.servers[name]
        if name in self.skipped:
            raise KiwiError(f"MCP server '{name}' is configured but skipped: {self.skipped[name]}")
        known = ", ".join(sorted(self.servers)) or "none"
        raise KiwiError(
            f"no MCP server '{name}' in mcp_registry.yaml (configured: {known})",
            hint="add it under mcps: in .ai/config/mcp_registry.yaml",
        )


# Kiwi's own secrets (the seal key, the front end's token and state key, the registry's password) and the
# Temporal connection's (an API key, a client key): never a value for a server's or a tool's ${NAME} (review
# s21 R6: `env: {TOKEN: ${KIWI_SEAL_KEY}}` handed an MCP server the key that makes workers act; reaching
# Temporal is what seals guard).
KIWI_OWN = frozenset(
    {
        "KIWI_SEAL_KEY",
        "KIWI_SEAL_KEYS_ACCEPTED",
        "KIWI_MCP_TOKEN",
        "KIWI_MCP_STATE_KEY",
        "KIWI_REGISTRY_URL",
        "TEMPORAL_API_KEY",
        "TEMPORAL_TLS_CLIENT_KEY_DATA",
        "TEMPORAL_TLS_CLIENT_KEY_PATH",
    }
)


def kiwi_own(name: str) -> str | None:
    """Why ``name`` is never looked up for a server or a tool (None: it may be)."""
    if name.upper() not in KIWI_OWN:
        return None
    return (
        f"${{{name}}} is one of Kiwi's or Temporal's own secrets (the seal key, a token, a connection "
        "secret), never given to an MCP server or a tool: give the server a secret of its own, under "
        "another name"
    )


def first_own(names: list[str]) -> str | None:
    """Why the first of ``names`` that is Kiwi's own is never looked up (:func:`kiwi_own`); None if none is."""
    return next((why for why in map(kiwi_own, names) if why), None)


def lookup_secret(name: str) -> str | None:
    """The value of ``${name}``: the worker's environment, else the OS keyring (service 'kiwi'); None when
    neither has it, or when it is Kiwi's own (:func:`kiwi_own`)."""
    if kiwi_own(name):
        return None
    value = os.environ.get(name)
    if value is not None:
        return value
    try:
        import keyring  # optional: used only when installed
    except ImportError:
        return None
    try:
        return keyring.get_password("kiwi", name)
    except Exception:  # noqa: BLE001 - a keyring backend that fails is the same as no keyring
        return None


def registry_paths(project_root: Path, user_space: Path) -> list[Path]:
    return [
        user_space / "config" / "mcp_registry.yaml",
        project_root / PROJECT_FILE,
    ]


def load_registry(project_root: Path, user_space: Path) -> McpRegistry:
    """Read both registry files; invalid entries are an error naming the file and key."""
    registry = McpRegistry()
    user_file, project_file = registry_paths(project_root, user_space)
    files = [(user_file, yamltext.read(user_file) if user_file.is_file() else None)]
    # The project's is read with no link followed on the way (kiwi.projectfiles).
    files.append((project_file, yamltext.read_in_project(project_root, PROJECT_FILE)))
    for path, data in files:
        if data is None:
            continue
        registry.sources.append(str(path))
        for name, config in _read(data, path).items():
            if config is None:
                registry.servers.pop(name, None)
                registry.skipped[name] = f"enabled: false in {path}"
                continue
            registry.servers[name] = config
            registry.skipped.pop(name, None)
    for name, config in list(registry.servers.items()):
        missing = config.missing_variables()
        if refused := first_own(missing):
            registry.servers.pop(name)
            registry.skipped[name] = refused
        elif missing:
            registry.servers.pop(name)
            registry.skipped[name] = f"${{{missing[0]}}} is not set in the environment" + (
                f" (nor {', '.join('$' + m for m in missing[1:])})" if len(missing) > 1 else ""
            )
    return registry


def _read(data: Any, path: Path) -> dict[str, McpServerConfig | None]:
    if not isinstance(data, dict) or not isinstance(data.get("mcps", {}), dict):
        raise ItemInvalid(
            [
                Problem(
                    "mcp_registry.yaml must be a mapping with an 'mcps:' mapping of servers by name",
                    str(path),
                    1,
                    1,
                )
            ]
        )
    servers = dict(data.get("mcps") or {})
    for key in data:
        if key not in ("mcps", "config", "enabled"):
            raise ItemInvalid(
                [
                    Problem(
                        f"mcp_registry.yaml: unknown top-level key '{key}'; servers go under mcps:", str(path)
                    )
                ]
            )
    # ADR-006's form: config: {servers: [{alias: NAME, transport: ..., ...}]}, taken as mcps: {NAME: ...}.
    seed = data.get("config")
    if seed is not None:
        listed = seed.get("servers") if isinstance(seed, dict) else None
        if not isinstance(listed, list) or any(not isinstance(e, dict) or not e.get("alias") for e in listed):
            raise ItemInvalid(
                [
                    Problem(
                        "mcp_registry.yaml: config.servers must be a list of servers, each with an alias",
                        str(path),
                    )
                ]
            )
        for entry in listed:
            if str(entry["alias"]) in servers:
                raise ItemInvalid(
                    [Problem(f"mcp_registry.yaml: server '{entry['alias']}' is declared twice", str(path))]
                )
            servers[str(entry["alias"])] = entry
    if data.get("enabled") is False:
        return {name: None for name in servers}
    out = {}
    problems: list[Problem] = []
    for name, entry in servers.items():
        try:
            out[str(name)] = _entry(str(name), entry, path)
        except ItemInvalid as exc:
            problems += exc.problems  # (each server's first mistake, all in one go)
    if problems:
        raise ItemInvalid(problems)
    return out


def _adr006(entry: dict[str, Any], bad: Any) -> dict[str, Any]:
    """ADR-006's server keys, taken at their meaning: ``transport`` is ``type``, ``tool_filter`` the
    ``tools`` list, ``cache_tools: false`` re-lists tools every time (``schema_ttl: 0``; true is Kiwi's
    default), ``require_approval: {always: [...], never: [...]}`` the tools that always wait for a human."""
    entry = dict(entry)
    for seed, ours in (("transport", "type"), ("tool_filter", "tools")):
        if seed in entry:
            if ours in entry and entry[ours] != entry[seed]:
                raise bad(seed, f"{seed} and {ours} say different things; keep one ({ours})")
            entry[ours] = entry.pop(seed)
    entry.pop("alias", None)  # ADR-006's list form names the server here; the mapping key names it
    if "cache_tools" in entry:
        cache = entry.pop("cache_tools")
        if not isinstance(cache, bool):
            raise bad("cache_tools", "expected true or false")
        if not cache:
            entry.setdefault("schema_ttl", 0)
    approval = entry.get("require_approval")
    if isinstance(approval, dict):
        extra = [k for k in approval if k not in ("always", "never")]
        if extra:
            raise bad(f"require_approval.{extra[0]}", "expected always: [TOOLS] and/or never: [TOOLS]")
        for key in ("always", "never"):
            if not isinstance(approval.get(key, []), list):
                raise bad(f"require_approval.{key}", "expected a list of tool names")
        entry["require_approval"] = list(approval.get("always", []))
    return entry


# The file's keys for the entry's seconds (`timeout: 120`), by the field each sets.
_SECONDS = {
    "timeout": "timeout_seconds",
    "connect_timeout": "connect_timeout_seconds",
    "idle_timeout": "idle_timeout_seconds",
    "schema_ttl": "schema_ttl_seconds",
    "approval_timeout": "approval_timeout_seconds",
}


def _field_problem(error: Any) -> tuple[str, str]:
    """A field pydantic refused, as the file writes its key, and what is wrong with its value."""
    # The key as the file writes it (review s34: `timeout: -1` was named timeout_seconds).
    written = {field: key for key, field in _SECONDS.items()}
    key = ".".join(written.get(str(p), str(p)) for p in error["loc"])
    message = error["msg"]
    given = error.get("input")
    if error["type"] == "literal_error" and isinstance(given, str):
        # `type: stido`: the one meant, as for a misspelt key.
        choices = list(get_args(McpServerConfig.model_fields[str(error["loc"][0])].annotation))
        near = difflib.get_close_matches(given, choices, n=1, cutoff=0.6)
        message += f"; did you mean {near[0]}?" if near else ""
    elif key in _SECONDS and error["type"] in ("float_parsing", "float_type", "int_parsing", "int_type"):
        # (`timeout: fast` read "Input should be a valid number, unable to parse string as a number".)
        message = f"{given!r} is no number of seconds: give one, e.g. {key}: 30"
    return key, message


def _entry(name: str, entry: Any, path: Path) -> McpServerConfig | None:
    """One server's entry read, every mistake in it named at once (README trial s35: a second mistake showed only
    once the first was mended)."""

    def problem(key: str, message: str) -> Problem:
        return Problem(f"mcps.{name}{'.' + key if key else ''}: {message}", str(path))

    def bad(key: str, message: str) -> ItemInvalid:
        return ItemInvalid([problem(key, message)])

    if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise bad(
            "", "server names may use letters, digits, '_' and '-' only (tools are called as NAME.TOOL)"
        )
    if not isinstance(entry, dict):
        raise bad("", "each server is a mapping (type, command, args, env or url, headers, ...)")
    entry = _adr006(entry, bad)
    problems: list[Problem] = []
    for key in [k for k in entry if k not in KNOWN_KEYS]:
        near = difflib.get_close_matches(str(key), KNOWN_KEYS, n=1, cutoff=0.8)
        guess = f"did you mean {near[0]}? " if near else ""
        problems.append(problem(str(key), f"unknown key; {guess}known keys: {', '.join(KNOWN_KEYS)}"))
    entry = {k: v for k, v in entry.items() if k in KNOWN_KEYS}
    if entry.get("enabled") is False and not problems:
        return None
    fields: dict[str, Any] = {
        k: v for k, v in entry.items() if k not in (*_SECONDS, "allowed_paths", "enabled")
    }
    for key, field in _SECONDS.items():
        if key in entry:
            fields[field] = entry[key]
    if "allowed_paths" in entry:
        # The seed's form for filesystem servers: the allowed folders are the server's last arguments.
        if isinstance(entry["allowed_paths"], list):
            fields["args"] = [*(entry.get("args") or []), *(str(p) for p in entry["allowed_paths"])]
        else:
            problems.append(problem("allowed_paths", "expected a list of folders"))
    for key in ("args", "tools", "require_approval"):
        if key in fields and not isinstance(fields[key], list):
            problems.append(problem(key, "expected a list"))
            del fields[key]
    if "args" in fields:
        fields["args"] = [str(a) for a in fields["args"]]
    for key in ("env", "headers"):
        if key in fields:
            if isinstance(fields[key], dict):
                fields[key] = {str(k): str(v) for k, v in fields[key].items()}
            else:
                problems.append(problem(key, "expected a mapping of names to values"))
                del fields[key]
    try:
        config = McpServerConfig(name=name, source=str(path), **fields)
    except ValidationError as exc:
        problems += [problem(*_field_problem(error)) for error in exc.errors()]
    if problems:
        raise ItemInvalid(problems)
    if config.type == "stdio" and not config.command:
        raise bad("command", "a stdio server needs a command (e.g. npx) and args")
    for key, texts in (("command", [config.command]), ("args", config.args)):
        secret = next((n for t in texts for n in PLACEHOLDER.findall(t) if n not in BUILTIN_VARIABLES), None)
        if secret:
            raise bad(
                key,
                f"${{{secret}}} would put its value on the server's command line, which every user of the "
                "machine can read (ps); pass it in env: instead (a server that takes it only as an argument "
                "can be started by a script that reads it from its environment)",
            )
    if config.type != "stdio" and not config.url.startswith(("http://", "https://", "${")):
        raise bad("url", f"a {config.type} server needs an http(s) url")
    return config
