"""The permission model: grants parsed from ``<permissions>``, and the checks made on every call.

Pure and deterministic (no I/O, no clocks), so the ``DirectiveRun`` workflow makes every
decision itself and records it in history. Symlinks cannot be resolved without I/O; the
filesystem activities re-check the real path against the same grants before touching it.
"""

from __future__ import annotations

import difflib
import posixpath
import re
import shlex
from typing import Any

from pydantic import BaseModel, Field

from kiwi.globs import first_match, glob_covered
from kiwi.protected import granted as protected_granted
from kiwi.protected import protected_root, reaches, rule_in_force
from kiwi.shellpolicy import (
    check_argv,
    later_refused,
    modeled_program,
    refused_program,
    worker_refusal,
)
from kiwi.shellpolicy.results import xml_attr

FILESYSTEM_TOOLS = (
    "filesystem.read",
    "filesystem.write",
    "filesystem.list",
    "filesystem.create",
    "filesystem.delete",
    "filesystem.move",
)
GIT_TOOLS = ("git.status", "git.diff", "git.commit", "git.checkpoint", "git.rollback")
BUILTIN_TOOLS = (*FILESYSTEM_TOOLS, "shell.run", *GIT_TOOLS, "directive.run")
KIWI_ACTIONS = ("search", "load", "execute", "help")
# Kiwi's own meta-tools, callable inside a run (the seeds' <tool_call><mcp>kiwi-mcp</mcp><tool>search</tool>),
# each gated by the <execute resource="kiwi-mcp" action="..."/> grant of its action. kiwi-mcp.run is
# Kiwi MCP's name for execute(run): the same tool, the same grant.
KIWI_MCP_ACTIONS = {
    "kiwi-mcp.search": "search",
    "kiwi-mcp.load": "load",
    "kiwi-mcp.help": "help",
    "kiwi-mcp.execute": "execute",
    "kiwi-mcp.run": "execute",
}
KIWI_MCP_TOOLS = tuple(KIWI_MCP_ACTIONS)


def spellings(tool: str) -> tuple[str, ...]:
    """Every id of the same tool: ``kiwi-mcp.execute`` and ``kiwi-mcp.run`` are one tool, so a denial, an
    approval rule or a rate limit naming either holds for both; any other tool has its one id."""
    if KIWI_MCP_ACTIONS.get(tool) == "execute":
        return ("kiwi-mcp.execute", "kiwi-mcp.run")
    return (tool,)


# Since session 34 (a hostile review): a grant that names a protected place (`.git/config`, `.ai/tools/**`) is
# kept when grants meet (an unsigned directive's and the base policy's, a child's and its parent's) only where
# the other side names the place too; `**` covers it as globs and reaches none of it. Asked only where it
# changes the answer: child runs started before replay as they ran.
PROTECTED_NARROWED = "kiwi-protected-narrowed-s34"
# Since session 35: shell.run's `"cwd": null` is the project's root, as the worker takes it (a built-in's optional
# argument sent as null is left out, calls._given); it was refused ("'cwd' must be a path"). Asked only for a
# null cwd.
NULL_CWD = "kiwi-null-cwd-s35"
# What execute does in a run: start a child run or call a tool through the run. Authoring is for
# the front end and humans (an item written in a run would be unsigned anyway).
KIWI_MCP_RUN_ACTIONS = ("run", "call")
KIWI_MCP_AUTHORING = ("create", "update", "delete", "publish", "sign", "link", "validate")
KNOWN_RESOURCES = ("filesystem", "tool", "kiwi-mcp", "shell", "mcp", "network")

# Characters that only mean something to a shell. Kiwi never runs a shell, so a
# command containing them is a command the caller expects a shell to interpret.
_SHELL_META = re.compile(r"[;&|<>`$\n\r\\]|\$\(")


class PermissionEntry(BaseModel):
    """One element of ``<permissions>`` as written: ``<read resource="filesystem" path="src/**"/>``."""

    tag: str
    attrs: dict[str, str] = Field(default_factory=dict)
    line: int = 0

    def written(self) -> str:
        """The element as a human reads it in the file: ``<read resource="filesystem" path="src/**"/>``."""
        return "<" + " ".join([self.tag, *(f'{k}="{v}"' for k, v in self.attrs.items())]) + "/>"


class Decision(BaseModel):
    """The answer to one permission check."""

    allowed: bool
    reason: str = ""
    hint: str = ""
    checked_against: list[str] = Field(default_factory=list)


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


# Namespaces of Kiwi's own tools. An MCP grant never reaches a built-in tool id, even for a
# server called "git" (its git.git_status is the server's; git.status is Kiwi's).
BUILTIN_NAMESPACES = frozenset(t.partition(".")[0] for t in BUILTIN_TOOLS)
# Attributes every grant may carry to explain itself; they grant nothing.
_NOTES = {"resource", "description", "reason", "note"}
# What each grant element reads. An attribute outside these is an error, never "all".
GRANT_ATTRIBUTES: dict[tuple[str, str], set[str]] = {
    ("read", "filesystem"): {"path"},
    ("write", "filesystem"): {"path"},
    ("deny", "filesystem"): {"path"},
    ("execute", "tool"): {"id"},
    ("deny", "tool"): {"id"},
    ("execute", "shell"): {"commands", "action", "options"},
    ("deny", "shell"): {"commands", "action"},
    ("execute", "kiwi-mcp"): {"action", "actions"},
    ("deny", "kiwi-mcp"): {"action", "actions"},
    ("execute", "mcp"): {"name", "actions", "action", "tools"},
    ("deny", "mcp"): {"name", "actions", "action", "tools"},
    ("deny", "network"): {"action", "actions"},
    # The hosts an api tool may reach: host names with an optional port ("api.example.com",
    # "127.0.0.1:8080", "*.example.com"); no port means the scheme's own (443 or 80).
    ("execute", "network"): {"hosts"},
    # The seed's short form: the resource is the MCP server's name (resource="supabase").
    ("execute", "*server*"): {"actions", "action", "tools"},
    ("deny", "*server*"): {"actions", "action", "tools"},
}


def path_grant_problem(path: str) -> str:
    """Why a filesystem grant's path cannot be used, or '' (grants are globs relative to the project)."""
    text = path.strip()
    if not text:
        return (
            'the path is empty; give a glob relative to the project root, e.g. "src/**" ("**" is everything)'
        )
    if text.startswith(("/", "~")) or (len(text) > 2 and text[1] == ":"):
        return (
            f"'{path}' is absolute; grants are relative to the project root: \"**\" is the whole project, "
            '"." its root folder alone'
        )
    if ".." in text.replace("\\", "/").split("/"):
        return f"'{path}' leaves the project root ('..'); Kiwi grants nothing outside it"
    return ""


def _actions(attrs: dict[str, str]) -> str | None:
    """An MCP grant's tools, from actions= (Kiwi), tools= (the seeds) or action=; None when none is given."""
    named = [attrs[k] for k in ("actions", "tools", "action") if k in attrs]
    return ",".join(named) if named else None


def _near(word: str, known: set[str]) -> str:
    """The known spelling closest to a mistyped one ('' when none is close)."""
    match = difflib.get_close_matches(word, sorted(known), n=1, cutoff=0.75)
    return match[0] if match else ""


def entry_problems(entry: PermissionEntry) -> list[str]:
    """What is wrong with one grant element as written ([] when it means exactly what it says)."""
    a = entry.attrs
    resource = a.get("resource", "")
    if entry.tag == "shell":
        # The tools-evolution seed's form.
        commands = a.get("commands", "PROGRAM,...")
        return [f'<shell> is not a permission; write <execute resource="shell" commands="{commands}"/>']
    if entry.tag == "env":
        return [
            "<env> is not a permission: a tool's environment variables come from its tool.yaml "
            "(requires.environment: passed to that tool only, scrubbed from its output); remove <env>"
        ]
    if entry.tag not in ("read", "write", "execute", "deny"):
        return [f"unknown permission <{entry.tag}> (known: read, write, execute, deny)"]
    if resource == "tool" and "tool_type" in a:
        return [
            f'tool_type="{a["tool_type"]}" would grant every {a["tool_type"]} tool; Kiwi grants tools by id: '
            'write <execute resource="tool" id="TOOL,..."/>'
        ]
    if not resource:
        return [f"<{entry.tag}> needs a resource attribute (filesystem, tool, shell, kiwi-mcp, mcp)"]
    key = (entry.tag, resource)
    if key not in GRANT_ATTRIBUTES:
        if entry.tag in ("read", "write"):
            return [
                f'<{entry.tag} resource="{resource}"> is not a grant Kiwi knows; <{entry.tag}> takes '
                f'resource="filesystem" with a path glob'
            ]
        if resource in ("filesystem", "tool", "shell", "network"):
            return [f'<{entry.tag} resource="{resource}"> is not a grant Kiwi knows']
        if resource in BUILTIN_NAMESPACES:
            return [
                f'resource="{resource}" is ambiguous: Kiwi\'s built-in {resource}.* tools are granted with '
                f'<execute resource="tool" id="{resource}.NAME"/>, an MCP server\'s tools with '
                f'<execute resource="mcp" name="{resource}" actions="..."/>'
            ]
        near = _near(resource, {r for (t, r) in GRANT_ATTRIBUTES if t == entry.tag and r != "*server*"})
        if near:
            # resource="shel": a typo of a known resource, not an MCP server called "shel".
            return [
                f'<{entry.tag} resource="{resource}"> is not a resource Kiwi knows; did you mean "{near}"?'
            ]
        key = (entry.tag, "*server*")
    allowed = GRANT_ATTRIBUTES[key] | _NOTES
    problems = [
        f"<{entry.tag} resource=\"{resource}\"> has no attribute '{name}'"
        + (
            f'; did you mean {_near(name, allowed - _NOTES)}="{a[name]}"?'
            if _near(name, allowed - _NOTES)
            else ""
        )
        + f"; it takes {', '.join(sorted(allowed - _NOTES))}"
        for name in a
        if name not in allowed
    ]
    if resource == "filesystem":
        if "path" not in a:
            problems.append(f'<{entry.tag} resource="filesystem"> needs a path glob, e.g. path="src/**"')
        else:
            problem = path_grant_problem(a["path"])
            problems += [problem] if problem else []
    elif resource == "tool" and not _split(a.get("id", "")):
        problems.append(f'<{entry.tag} resource="tool"> needs id="TOOL" (one or more, comma-separated)')
    elif (
        resource == "shell" and entry.tag == "execute" and not _split(a.get("commands", a.get("action", "")))
    ):
        problems.append('<execute resource="shell"> needs commands="PROGRAM,..."')
    elif resource == "mcp" and not a.get("name"):
        problems.append(f'<{entry.tag} resource="mcp"> needs name="SERVER"')
    elif resource == "network" and entry.tag == "execute":
        hosts = _split(a.get("hosts", ""))
        if not hosts:
            problems.append(
                '<execute resource="network"> needs hosts="HOST[:PORT],..." (e.g. api.github.com)'
            )
        problems += [problem for host in hosts if (problem := host_grant_problem(host))]
    elif resource == "kiwi-mcp":
        problems += _kiwi_action_problems(entry.tag, _split(_actions(a) or ""))
    if entry.tag == "execute" and key[1] in ("mcp", "*server*") and not _split(_actions(a) or ""):
        problems.append(
            f'<execute resource="{resource}"> must name its tools: actions="TOOL,..." '
            '(or actions="*" for every tool of the server)'
        )
    return problems


def shell_grant_warnings(entry: PermissionEntry) -> list[str]:
    """What a valid shell grant does not do that its signer may think it does: programs Kiwi refuses even when
    granted, and programs it does not know (they run only behind the kernel's wall, writing less there)."""
    if entry.tag != "execute" or entry.attrs.get("resource") != "shell":
        return []
    warnings = []
    for program in _split(entry.attrs.get("commands", entry.attrs.get("action", ""))):
        if program == "*":
            continue
        why = refused_program(program) or later_refused(program) or worker_refusal(program)
        if why:
            warnings.append(f"shell command '{program}' is refused even when granted: it {why}")
        elif not modeled_program(program):
            warnings.append(
                f"Kiwi does not know shell command '{program}': it checks only the path-like arguments it is "
                "given, as reads; it runs only on a worker whose kernel confines commands (Landlock), where it "
                "may change the files a write grant matches (none with another name), or anything below a "
                "grant that covers a folder whole (src/**), and nothing else"
            )
    return warnings


def _kiwi_action_problems(tag: str, actions: list[str]) -> list[str]:
    """What is wrong with the actions of a kiwi-mcp grant (search, load, execute, help, or * for all)."""
    known = ", ".join(KIWI_ACTIONS)
    if not actions and tag == "execute":
        return [f'<execute resource="kiwi-mcp"> needs action="ACTION,..." ({known}; "*" for all four)']
    problems = []
    for action in actions:
        if action == "*" or action in KIWI_ACTIONS:
            continue
        if action == "run":
            near = "execute (kiwi-mcp.run is execute's other name)"
        else:
            near = _near(action, set(KIWI_ACTIONS))
        problems.append(
            f"kiwi-mcp action '{action}' is not one Kiwi knows ({known})"
            + (f"; did you mean {near}?" if near else "")
        )
    return problems


_HOST_GRANT = re.compile(r"^(\*\.)?([a-z0-9-]+(\.[a-z0-9-]+)*|\[[0-9a-f:.]+\])(:[0-9]{1,5})?$")


def host_grant_problem(host: str) -> str:
    """What is wrong with one host of a network grant ('' when it names a host, and a port or none)."""
    if host == "*" or not _HOST_GRANT.match(host.lower()):
        return (
            f"network host '{host}' is not HOST or HOST:PORT (e.g. api.github.com, 127.0.0.1:8080, "
            "*.example.com); Kiwi grants named hosts only, without scheme or path"
        )
    return ""


def host_granted(grants: list[str], host: str, port: int, scheme: str) -> str | None:
    """The grant of ``grants`` that lets a request reach ``host:port`` (None: not granted).

    A grant without a port covers the scheme's own port only (443 for https, 80 for http);
    ``*.example.com`` covers its subdomains, not example.com itself.
    """
    host = host.lower().rstrip(".")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address, as grants write it
    default = {"https": 443, "http": 80}.get(scheme)
    for grant in grants:
        name, _, granted_port = grant.lower().rpartition(":") if _has_port(grant) else (grant.lower(), "", "")
        if (int(granted_port) if granted_port else default) != port:
            continue
        if name == host or (name.startswith("*.") and host.endswith(name[1:]) and len(host) > len(name) - 1):
            return grant
    return None


def _has_port(grant: str) -> bool:
    return bool(re.search(r":[0-9]{1,5}$", grant)) and not grant.endswith("]")


# The most of a path a refusal spells out: an agent's path may be a megabyte, and the refusal goes back to
# it, into the run's history and its audit trail (twice: reason and hint).
SHOWN_PATH_CHARS = 300


def shown_path(path: str) -> str:
    """``path`` as a refusal shows it: whole up to SHOWN_PATH_CHARS, else its start and end around a count."""
    if len(path) <= SHOWN_PATH_CHARS:
        return path
    return f"{path[:200]}…({len(path):,} characters)…{path[-80:]}"


class PermissionSet(BaseModel):
    """Effective grants of a run. Absent means denied; explicit denials always win."""

    fs_read: list[str] = Field(default_factory=list)
    fs_write: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    shell: list[str] = Field(default_factory=list)
    # Options a shell grant allows that Kiwi otherwise refuses (find -delete), per program ("*": any).
    shell_options: dict[str, list[str]] = Field(default_factory=dict)
    kiwi_actions: list[str] = Field(default_factory=list)
    mcp: dict[str, list[str]] = Field(default_factory=dict)
    deny_fs: list[str] = Field(default_factory=list)
    deny_tools: list[str] = Field(default_factory=list)
    deny_shell: list[str] = Field(default_factory=list)
    deny_mcp: dict[str, list[str]] = Field(default_factory=dict)
    deny_network: bool = False
    # Hosts api tools may reach (<execute resource="network" hosts="..."/>); none when absent.
    network_hosts: list[str] = Field(default_factory=list)

    # ---- construction -------------------------------------------------
    @classmethod
    def from_entries(cls, entries: list[PermissionEntry]) -> PermissionSet:
        grants = cls()
        for entry in entries:
            grants._add(entry)
        return grants

    def _add(self, entry: PermissionEntry) -> None:
        a = entry.attrs
        resource = a.get("resource", "")
        if entry.tag == "deny":
            if resource == "filesystem":
                self.deny_fs.append(a.get("path", "**"))
            elif resource == "tool":
                self.deny_tools.extend(_split(a.get("id", "*")))
            elif resource == "shell":
                self.deny_shell.extend(_split(a.get("commands", a.get("action", "*"))))
            elif resource == "network":
                self.deny_network = True
            elif resource:
                name = a.get("name", resource) if resource == "mcp" else resource
                self.deny_mcp.setdefault(name, []).extend(_split(_actions(a) or "*"))
            return
        if resource == "filesystem":
            target = self.fs_read if entry.tag == "read" else self.fs_write
            if entry.tag in ("read", "write"):
                target.append(a.get("path", ""))
                if entry.tag == "write":
                    # Writing a path implies being able to read it back.
                    self.fs_read.append(a.get("path", ""))
            return
        if entry.tag != "execute":
            return
        if resource == "tool":
            self.tools.extend(_split(a.get("id", "")))
        elif resource == "shell":
            programs = _split(a.get("commands", a.get("action", "")))
            self.shell.extend(programs)
            for program in programs if a.get("options") else ():
                self.shell_options.setdefault(program, []).extend(_split(a["options"]))
        elif resource == "kiwi-mcp":
            self.kiwi_actions.extend(_split(_actions(a) or ""))
        elif resource == "network":
            self.network_hosts.extend(_split(a.get("hosts", "")))
        elif resource:
            name = a.get("name", "") if resource == "mcp" else resource
            # A grant that names no tools grants none (validation reports it); never "all".
            if name:
                self.mcp.setdefault(name, []).extend(_split(_actions(a) or ""))

    # ---- checks -------------------------------------------------------
    def check(
        self,
        tool: str,
        args: dict[str, Any],
        *,
        blocked_commands: list[str] | None = None,
        kiwi_tools: bool = True,
    ) -> Decision:
        """Decide one call. ``args`` are the call's arguments as the caller sent them.

        ``kiwi_tools``: ``kiwi-mcp.*`` are Kiwi's meta-tools (runs started before they were decide
        such ids as any SERVER.TOOL, and replay that way).
        """
        if tool in FILESYSTEM_TOOLS:
            return self._check_filesystem(tool, args)
        if tool == "shell.run":
            return self.check_shell(args, blocked_commands or [])
        if kiwi_tools and KIWI_MCP_ACTIONS.get(tool) == "execute":
            refused = self._check_kiwi_execute(args)
            if refused is not None:
                return refused
        return self.check_tool_id(tool, kiwi_tools=kiwi_tools)

    def check_host(self, host: str, port: int, scheme: str) -> Decision:
        """Whether an api tool may send a request to ``scheme://host:port`` (explicit denials win)."""
        where = f"{host}:{port}"
        if scheme not in ("http", "https"):
            return Decision(
                allowed=False, reason=f"'{scheme}' URLs are not HTTP; api tools speak http(s) only"
            )
        if self.deny_network:
            return Decision(allowed=False, reason=f"network access to {where} is explicitly denied")
        grant = host_granted(self.network_hosts, host, port, scheme)
        if grant is None:
            return Decision(
                allowed=False,
                reason=f"network host {where} is not granted",
                hint=f'add <execute resource="network" hosts="{xml_attr(where)}"/> to <permissions>',
                checked_against=list(self.network_hosts),
            )
        return Decision(allowed=True, checked_against=[grant])

    def check_tool_id(self, tool: str, *, kiwi_tools: bool = True) -> Decision:
        if not tool:
            return Decision(allowed=False, reason="no tool named")
        server, _, action = tool.partition(".")
        if server == "kiwi-mcp" and kiwi_tools:
            return self._check_kiwi_tool(tool)
        denial = self.explicit_denial(tool)
        if denial is not None:
            return denial
        if tool in self.tools or "*" in self.tools:
            return Decision(allowed=True, checked_against=[tool])
        if action and tool not in BUILTIN_TOOLS:
            granted = self.mcp.get(server, [])
            if action in granted or "*" in granted:
                return Decision(allowed=True, checked_against=[f"{server}:{','.join(granted)}"])
            return Decision(
                allowed=False,
                reason=f"'{tool}' is not granted",
                hint=f'add <execute resource="mcp" name="{xml_attr(server)}" actions="{xml_attr(action)}"/> to <permissions>',
                checked_against=[f"{server}:{','.join(granted)}"] if granted else [],
            )
        return Decision(
            allowed=False,
            reason=f"tool '{tool}' is not granted",
            hint=f'add <execute resource="tool" id="{xml_attr(tool)}"/> to <permissions>',
            checked_against=list(self.tools),
        )

    def explicit_denial(self, tool: str) -> Decision | None:
        """The refusal of a tool id this set denies by name (``<deny>``), whatever else grants it; else None."""
        server, _, action = tool.partition(".")
        denied = self.deny_mcp.get(server, []) if action else []
        if tool in self.deny_tools or "*" in self.deny_tools or action in denied or "*" in denied:
            return Decision(allowed=False, reason=f"'{tool}' is explicitly denied")
        return None

    def _check_kiwi_tool(self, tool: str) -> Decision:
        """A Kiwi meta-tool: only the kiwi-mcp grant of its action reaches it (never a tool id or MCP grant)."""
        if tool not in KIWI_MCP_ACTIONS:
            return Decision(
                allowed=False,
                reason=f"'{tool}' is not one of Kiwi's meta-tools; a run can call "
                + ", ".join(KIWI_MCP_TOOLS),
                hint="search with kiwi-mcp.search, read an item with kiwi-mcp.load, run a directive or call a "
                "tool with kiwi-mcp.execute",
            )
        action = KIWI_MCP_ACTIONS[tool]
        denied = self.deny_mcp.get("kiwi-mcp", [])
        if tool in self.deny_tools or "*" in self.deny_tools or action in denied or "*" in denied:
            return Decision(allowed=False, reason=f"'{tool}' is explicitly denied")
        if action in self.kiwi_actions or "*" in self.kiwi_actions:
            return Decision(allowed=True, checked_against=[f"kiwi-mcp:{action}"])
        return Decision(
            allowed=False,
            reason=f"'{tool}' needs the kiwi-mcp {action} grant, which this run does not have",
            hint=f'add <execute resource="kiwi-mcp" action="{xml_attr(action)}"/> to <permissions>',
            checked_against=[f"kiwi-mcp:{','.join(self.kiwi_actions)}"] if self.kiwi_actions else [],
        )

    def _check_kiwi_execute(self, args: dict[str, Any]) -> Decision | None:
        """kiwi-mcp.execute in a run runs a directive or calls a tool; authoring is refused whatever the grants."""
        action = args.get("action") or "run"
        if action in KIWI_MCP_AUTHORING:
            return Decision(
                allowed=False,
                reason=f"execute action '{action}' authors items, which is not available inside a run",
                hint="items are written outside runs, with the MCP front end's execute(item_type=..., "
                f"action='{action}') or by a human; a new or changed directive runs with its grants only once "
                "a human signs it (`kiwi sign`)",
            )
        if action not in KIWI_MCP_RUN_ACTIONS:
            return Decision(
                allowed=False,
                reason=f"execute action '{action}' is not available inside a run",
                hint="in a run, kiwi-mcp.execute runs a directive (item_type 'directive', action 'run') or "
                "calls a tool (item_type 'tool', action 'run' or 'call')",
            )
        return None

    def _check_filesystem(self, tool: str, args: dict[str, Any]) -> Decision:
        if tool == "filesystem.move":
            for key in ("source", "destination"):
                decision = self.check_path("write", args.get(key))
                if not decision.allowed:
                    return decision
            return Decision(allowed=True, checked_against=self.fs_write)
        mode = "read" if tool in ("filesystem.read", "filesystem.list") else "write"
        return self.check_path(mode, args.get("path"))

    def check_path(self, mode: str, raw: Any) -> Decision:
        """Check a path argument lexically; the activity re-checks it with symlinks resolved."""
        rel = normalise_path(raw)
        if isinstance(rel, Decision):
            return rel
        grants = self.fs_read if mode == "read" else self.fs_write
        denied = first_match(self.deny_fs, rel)
        if denied is not None:
            return Decision(allowed=False, reason=f"'{shown_path(rel)}' is explicitly denied by '{denied}'")
        granted = protected_granted(grants, rel)
        if granted is None and first_match(grants, rel) is not None:
            root = shown_path(protected_root(rel) or "")
            return Decision(
                allowed=False,
                reason=f"'{shown_path(rel)}' is in the protected place '{root}', which only a grant naming it "
                "reaches",
                hint=f'add <{mode} resource="filesystem" path="{xml_attr(root)}/**"/> to <permissions> if the directive '
                "really must touch it (a human signs that directive)",
                checked_against=list(grants),
            )
        if granted is not None:
            # model_construct: the hot path of every allowed call; the fields are known-good.
            return Decision.model_construct(allowed=True, reason="", hint="", checked_against=[granted])
        parent = posixpath.dirname(rel) or "."
        suggestion = shown_path(f"{parent}/**" if parent != "." else rel)
        return Decision(
            allowed=False,
            reason=f"{mode} not allowed on '{shown_path(rel)}'",
            hint=f'add <{mode} resource="filesystem" path="{xml_attr(suggestion)}"/> to <permissions>',
            checked_against=list(grants),
        )

    def check_shell(self, args: dict[str, Any], blocked_commands: list[str]) -> Decision:
        """A ``shell.run`` call: the program, its options and every path it names (``kiwi.shellpolicy``)."""
        argv = parse_command(args)
        if isinstance(argv, Decision):
            return argv
        cwd = args.get("cwd", ".")
        if cwd is None and rule_in_force(NULL_CWD):
            cwd = "."  # (as the worker takes it: a built-in's optional argument sent as null is left out)
        if not isinstance(cwd, str) or not cwd.strip():
            return Decision(allowed=False, reason="'cwd' must be a path relative to the project root")
        verdict = check_argv(
            argv,
            allowed=self.shell,
            denied=self.deny_shell,
            blocked=blocked_commands,
            read_grants=self.fs_read,
            write_grants=self.fs_write,
            deny_fs=self.deny_fs,
            cwd=cwd,
            options_granted=self.shell_options,
        )
        return Decision(
            allowed=verdict.allowed,
            reason=verdict.reason,
            hint=verdict.hint,
            checked_against=list(verdict.checked_against),
        )

    # ---- composition --------------------------------------------------
    def intersect(self, child: PermissionSet) -> PermissionSet:
        """What a child run may do: never more than this set or ``child`` allows."""

        def paths(mine: list[str], theirs: list[str]) -> list[str]:
            kept = [p for p in theirs if any(glob_covered(p, q) for q in mine)]
            kept += [p for p in mine if any(glob_covered(p, q) for q in theirs) and p not in kept]
            # A grant that names a protected place is kept only where the other side names it too.
            fenced = [
                p
                for p in kept
                if any(reaches(p, q, glob_covered(p, q)) for q in (mine if p in theirs else theirs))
            ]
            return fenced if fenced != kept and rule_in_force(PROTECTED_NARROWED) else kept

        def names(mine: list[str], theirs: list[str]) -> list[str]:
            if "*" in mine:
                return list(theirs)
            if "*" in theirs:
                return list(mine)
            return [n for n in theirs if n in mine]

        mcp = {}
        for server, actions in child.mcp.items():
            shared = names(self.mcp.get(server, []), actions)
            if shared:
                mcp[server] = shared
        deny_mcp = {k: list(v) for k, v in self.deny_mcp.items()}
        for k, v in child.deny_mcp.items():
            deny_mcp.setdefault(k, []).extend(v)
        return PermissionSet(
            fs_read=paths(self.fs_read, child.fs_read),
            fs_write=paths(self.fs_write, child.fs_write),
            tools=names(self.tools, child.tools),
            shell=names(self.shell, child.shell),
            shell_options={
                program: kept
                for program, options in child.shell_options.items()
                if (kept := [o for o in options if o in self._options_of(program)])
            },
            kiwi_actions=names(self.kiwi_actions, child.kiwi_actions),
            mcp=mcp,
            deny_fs=self.deny_fs + child.deny_fs,
            deny_tools=self.deny_tools + child.deny_tools,
            deny_shell=self.deny_shell + child.deny_shell,
            deny_mcp=deny_mcp,
            deny_network=self.deny_network or child.deny_network,
            network_hosts=names(self.network_hosts, child.network_hosts),
        )

    def exceeds(self, parent: PermissionSet) -> list[str]:
        """The grants of this set that ``parent`` does not cover (empty: none)."""

        def over(mine: list[str], theirs: list[str]) -> list[str]:
            return [n for n in mine if "*" not in theirs and n not in theirs]

        def uncovered(mine: list[str], theirs: list[str]) -> list[str]:
            wider = [p for p in mine if not any(glob_covered(p, q) for q in theirs)]
            fenced = [p for p in mine if not any(reaches(p, q, glob_covered(p, q)) for q in theirs)]
            return fenced if fenced != wider and rule_in_force(PROTECTED_NARROWED) else wider

        excess = [f"read {p}" for p in uncovered(self.fs_read, parent.fs_read)]
        excess += [f"write {p}" for p in uncovered(self.fs_write, parent.fs_write)]
        excess += [f"tool {t}" for t in over(self.tools, parent.tools)]
        excess += [
            f"shell option {program} {o}"
            for program, options in self.shell_options.items()
            for o in options
            if o not in parent._options_of(program)
        ]
        excess += [f"shell {c}" for c in over(self.shell, parent.shell)]
        excess += [f"kiwi-mcp {a}" for a in over(self.kiwi_actions, parent.kiwi_actions)]
        excess += [f"network {h}" for h in over(self.network_hosts, parent.network_hosts)]
        for server, actions in self.mcp.items():
            excess += [f"mcp {server}.{a}" for a in over(actions, parent.mcp.get(server, []))]
        return excess

    def _options_of(self, program: str) -> list[str]:
        return [*self.shell_options.get(program, []), *self.shell_options.get("*", [])]

    def summary(self) -> dict[str, Any]:
        """The grants a run answer and audit records show: each kind that has any, each entry once (README trial
        s38: a path granted to read and to write was listed twice under fs_read)."""
        return {
            k: list(dict.fromkeys(v)) if isinstance(v, list) else v for k, v in self.model_dump().items() if v
        }

    def may_call(self, pattern: str) -> bool:
        """Whether some call of a tool ``pattern`` matches could be granted: a file tool with any grant of its
        mode, shell.run with any program, another tool by its id. For the run answer's list of the calls that wait
        for approval (README trial s38: it named git.rollback, which the run could not call)."""
        if not any(c in pattern for c in "*?["):
            if pattern in FILESYSTEM_TOOLS:
                return bool(
                    self.fs_read if pattern in ("filesystem.read", "filesystem.list") else self.fs_write
                )
            if pattern == "shell.run":
                return bool(self.shell)
            return self.check_tool_id(pattern).allowed
        return True  # (a pattern: some tool it matches may be granted)


def normalise_path(raw: Any) -> str | Decision:
    """A project-relative POSIX path, or a denial for anything that leaves the project.

    Absolute paths are refused outright: the workflow does not know where the project
    lives on the worker's disk, and a grant is always relative to the project root.
    """
    if not isinstance(raw, str) or not raw.strip():
        return Decision(allowed=False, reason="a non-empty 'path' argument is required")
    if "\x00" in raw:
        return Decision(allowed=False, reason="path contains a NUL byte")
    path = raw.strip().replace("\\", "/")
    if path[0] in "/~" or (len(path) > 2 and path[1] == ":" and path[2] == "/"):
        return Decision(
            allowed=False,
            reason=f"'{raw}' is an absolute path; paths must be relative to the project root",
            hint="give the path relative to the project root, e.g. 'src/app.py'",
        )
    rel = posixpath.normpath(path)
    if rel == ".." or rel.startswith("../"):
        return Decision(allowed=False, reason=f"'{raw}' leaves the project root")
    return rel


def parse_command(args: dict[str, Any]) -> list[str] | Decision:
    """``shell.run`` arguments as argv; shell syntax is refused, never interpreted."""
    argv = args.get("argv")
    if argv is not None:
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            return Decision(allowed=False, reason="'argv' must be a non-empty list of strings")
        if "/" in argv[0]:
            return Decision(allowed=False, reason="give the command by name, not by path")
        return argv
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        return Decision(allowed=False, reason="shell.run needs 'command' (a string) or 'argv' (a list)")
    meta = _SHELL_META.search(command)
    if meta:
        return Decision(
            allowed=False,
            reason=f"shell syntax {meta.group(0)!r} is refused: commands run without a shell",
            hint="run one command per call, with arguments only (no ;, &&, |, >, $(), backticks)",
        )
    try:
        parts = shlex.split(command)
    except ValueError as exc:
        return Decision(allowed=False, reason=f"command cannot be parsed: {exc}")
    if not parts:
        return Decision(allowed=False, reason="empty command")
    if "/" in parts[0]:
        return Decision(allowed=False, reason="give the command by name, not by path")
    return parts
