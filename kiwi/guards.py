"""Rate counting, loop detection, redaction and call summaries: pure helpers for the workflow."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from typing import Any

from kiwi.policy import BUILTIN_TOOLS, KIWI_MCP_TOOLS, parse_command

# Argument keys whose values are credentials. Anywhere in the key: these words are never an
# ordinary name ("max_tokens" is redacted too: better a hidden number than a leaked token).
_SECRET_KEY = re.compile(
    r"(token|secret|password|passwd|passphrase|api[_-]?key|authori[sz]ation|credential|"
    r"private[_-]?key|access[_-]?key|bearer|cookie)",
    re.I,
)
# Only as a whole word of the key (split at _ - . and camelCase): "pwd", "auth" ("auth_header", not
# "author"), and a bare "session" (a session cookie's value; "session_id" names a session, it is kept).
_SECRET_WORDS = {"pwd", "auth", "pin", "otp"}
_SECRET_KEYS = {"session", "sessionkey", "session_key", "jwt"}
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
# Values that carry their own scheme: "Bearer abc", "Basic dXNlcjpwYXNz".
_SECRET_VALUE = re.compile(r"^\s*(bearer|basic|token)\s+\S{8,}", re.I)
REDACTED = "[redacted]"
# json.dumps(value, default=str) and the same with sorted keys, as encoders built once: json.dumps with
# any option builds an encoder per call, and the workflow spells values out several times a call.
JSON_TEXT = json.JSONEncoder(default=str)
SORTED_JSON_TEXT = json.JSONEncoder(sort_keys=True, default=str)


def is_secret_key(key: Any) -> bool:
    """Whether an argument named ``key`` holds a credential (its value is redacted in audit and history)."""
    text = str(key)
    if _SECRET_KEY.search(text) or text.lower() in _SECRET_KEYS:
        return True
    return any(word.lower() in _SECRET_WORDS for word in _WORDS.findall(text))


def digest(value: Any) -> str:
    return hashlib.sha256(SORTED_JSON_TEXT.encode(value).encode()).hexdigest()[:16]


def is_external_mcp(tool: str, local_tools: Any, *, kiwi_tools: bool = True) -> bool:
    """Whether ``tool`` is an external MCP server's (``kiwi_tools``: Kiwi's own meta-tools are not)."""
    return (
        "." in tool
        and tool not in BUILTIN_TOOLS
        and not (kiwi_tools and tool in KIWI_MCP_TOOLS)
        and tool not in local_tools
    )


def rate_patterns(
    tool: str, limits: dict[str, int], local_tools: Any, *, kiwi_tools: bool = True
) -> list[str]:
    """The rate-limit patterns that count ``tool``."""
    matched = []
    for pattern in limits:
        if pattern == tool:
            matched.append(pattern)
        elif pattern == "mcp.*":
            if is_external_mcp(tool, local_tools, kiwi_tools=kiwi_tools):
                matched.append(pattern)
        elif pattern.endswith(".*") and tool.startswith(pattern[:-1]) or pattern == "*":
            matched.append(pattern)
    return matched


# The calls whose hashes a run keeps for detect_loop (kiwi.admission).
LOOP_KEPT = 10


def detect_loop(hashes: list[str], threshold: int) -> str:
    """A warning when the latest calls repeat (same call N times, or A-B-A-B); else ''."""
    if threshold > 1 and len(hashes) >= threshold and len(set(hashes[-threshold:])) == 1:
        # (The count as it is, not the threshold: the sixth same call said "3 times" too. Only the last calls'
        # hashes are kept: when all of them are the same, it was at least that many.)
        repeats = 1
        while repeats < len(hashes) and hashes[-repeats - 1] == hashes[-1]:
            repeats += 1
        counted = f"{repeats} or more" if repeats == len(hashes) and repeats >= LOOP_KEPT else str(repeats)
        return (
            f"the same call was made {counted} times in a row; if you are stuck, "
            "use help(action='stuck', reason=...)"
        )
    if (
        len(hashes) >= 4
        and hashes[-1] == hashes[-3]
        and hashes[-2] == hashes[-4]
        and hashes[-1] != hashes[-2]
    ):
        return "calls alternate between two states (A-B-A-B); if you are stuck, use help(action='stuck', reason=...)"
    return ""


# The argument values (keys and items, at any depth) a record keeps; past them a list or object ends with
# what was left out. Workflow code makes the records, on the worker's event loop: 750,000 empty lists in
# 1.5 MB of arguments took it 0.3 s to copy, every other run of the worker waiting.
REDACT_VALUES = 10_000
LEFT_OUT = "…"


def redact(value: Any, limit: int = REDACT_VALUES) -> Any:
    """A copy of call arguments safe for history-visible logs and the audit trail: secret-looking keys and
    scheme-carrying values redacted, strings past 2,000 characters cut, at most ``limit`` values kept (what
    is left out is never in the copy)."""
    return _redacted(value, [limit])


def _redacted(value: Any, room: list[int]) -> Any:
    if isinstance(value, dict):
        kept: dict[Any, Any] = {}
        for key, item in value.items():
            if room[0] <= 0:
                kept[LEFT_OUT] = f"{len(value) - len(kept)} more keys left out"
                break
            room[0] -= 1
            kept[key] = REDACTED if is_secret_key(key) else _redacted(item, room)
        return kept
    if isinstance(value, list):
        items: list[Any] = []
        for item in value:
            if room[0] <= 0:
                items.append(f"{LEFT_OUT} {len(value) - len(items)} more items left out")
                break
            room[0] -= 1
            items.append(_redacted(item, room))
        return items
    if isinstance(value, str) and _SECRET_VALUE.match(value):
        return REDACTED
    if isinstance(value, str) and len(value) > 2000:
        return value[:2000] + f"… ({len(value)} chars)"
    return value


def summarise_call(tool: str, args: dict[str, Any]) -> str:
    """What the Temporal UI, `kiwi status` and the run's recent calls show of a call: 'filesystem.write src/app.py',
    naming what the call acts on as the tool reads it (hostile review s38: `{"command": "ls notes", "argv": ["rm",
    ...]}` showed `ls notes` and ran rm, and a move's decoy `path` showed in place of the `source` it moved)."""
    if tool.startswith("filesystem."):
        detail = plain_text(str(args.get(_subject_key(tool), "")))
        if args.get("destination"):
            detail += f" -> {plain_text(str(args['destination']))}"
    elif tool == "shell.run":
        # (argv's words quoted where they need to be: `sort 'a -o b'` is one word, README trial s36.)
        argv = parse_command(args)
        detail = (
            " ".join(map(shown_word, argv))
            if isinstance(argv, list)
            else plain_text(str(args.get("command") or ""))
        )
    elif tool.startswith("git.") and isinstance(args.get("paths", []), list):
        # (README trial s38: a git.commit's audit row and status line named no path.)
        detail = " ".join(plain_text(str(p)) for p in args.get("paths", [])) or str(
            args.get("checkpoint") or ""
        )
    else:
        detail = ""
    return f"{tool} {detail}".strip()[:200]


def plain_text(text: str) -> str:
    """``text`` as it is when it is printable text, else JSON-quoted (a line break shows as \\n)."""
    return text if text.isprintable() else json.dumps(text)


def shown_word(text: str) -> str:
    """A word of a call as a human reads it: shell-quoted where it needs to be, JSON-quoted when it holds what is
    no printable text (hostile review s38: a newline in a shell word, kept by shlex's quotes, printed lines of `kiwi
    approvals` that read as a second request)."""
    return shlex.quote(text) if text.isprintable() else json.dumps(text)


def _subject_key(tool: str) -> str:
    """The argument naming what a filesystem tool acts on, as its activity reads it."""
    return "source" if tool == "filesystem.move" else "path"


# How much of a call a human approving it reads (ApprovalRequest.summary); past it the cut is said.
APPROVAL_SUMMARY_CHARS = 2000


def approval_summary(tool: str, args: dict[str, Any]) -> str:
    """What a human deciding on a call reads: the tool and every argument it is called with (hostile review s36:
    the summary was the Temporal UI's, cut at 200 characters with no mark, so `rm notes/tmp.txt` + 240 spaces +
    `notes/important.md` showed as `rm notes/tmp.txt`, and a tool other than filesystem.* and shell.run showed
    no argument at all). A shell command is shown as the words it runs (each quoted where it needs to be, so
    spacing hides nothing), anything else as its JSON; a summary past APPROVAL_SUMMARY_CHARS says it was cut."""
    rest = dict(args)
    detail = ""
    key = _subject_key(tool)
    if tool.startswith("filesystem.") and isinstance(args.get(key), str):
        detail = shown_word(rest.pop(key))
        if isinstance(args.get("destination"), str):
            detail += f" -> {shown_word(rest.pop('destination'))}"
    elif tool == "shell.run":
        argv = parse_command(args)
        if isinstance(argv, list):
            detail = " ".join(map(shown_word, argv))
            rest.pop("command", None)
            rest.pop("argv", None)
    if rest:
        shown = json.dumps(rest, ensure_ascii=False, sort_keys=True, default=str)
        detail = f"{detail} {shown}" if detail else shown
    text = f"{tool} {detail}".strip()
    if len(text) > APPROVAL_SUMMARY_CHARS:
        cut = len(text) - APPROVAL_SUMMARY_CHARS
        text = (
            f"{text[:APPROVAL_SUMMARY_CHARS]} …[{cut:,} more characters not shown (the approval_requested record "
            "of `kiwi audit RUN --json` holds the arguments, secrets redacted and long values cut); deny what you "
            "cannot read]"
        )
    return text


def summarise_result(result: Any) -> str:
    text = JSON_TEXT.encode(result) if not isinstance(result, str) else result
    return text if len(text) <= 200 else text[:200] + "…"
