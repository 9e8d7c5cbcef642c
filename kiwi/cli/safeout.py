"""What the CLI prints cannot steer the terminal it is printed on.

Much of what `kiwi` prints was written by an agent: the arguments of a call waiting for approval, an
escalation's question and options, a step's outputs, a path, an item's description. Printed raw, control
characters in them rewrite what the human sees: backspaces and an erase-line sequence made
``rm -f notes/important.md notes/<\\b x31>\\x1b[K ls notes`` show as ``ls notes`` in `kiwi approvals`, and the
human approved the ``rm``. Every line the CLI writes goes through :class:`SafeStream`, which shows such
characters as escapes (``\\x08``, ``\\x1b``, ``\\u202e``; inside ``--json`` output the same text as
before) and lets through only newlines, tabs and the colour codes Kiwi itself writes
(kiwi.cli.progress.paint).
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any, TextIO

# C0 controls but newline and tab, DEL, C1 controls, and the characters that reorder or hide text (bidi
# embeddings, overrides and isolates, zero-width marks, line and paragraph separators, the BOM).
_UNSAFE = re.compile(
    "(\x1b\\[(?:0|1|2|31|32|33)m)|([\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff])"
)


def _shown(match: re.Match[str]) -> str:
    if match.group(1):
        return match.group(1)  # (Kiwi's own colours: paint())
    char = match.group(2)
    code = ord(char)
    # (\u form from DEL up: valid inside a JSON string, which never holds a raw C0 control.)
    return f"\\x{code:02x}" if code < 0x7F else f"\\u{code:04x}"


def one_line(text: str) -> str:
    """Agent-written ``text`` (a call's summary, a question, a reason) kept to the line it is printed on: its line
    breaks shown as ``\\n`` (hostile review s38: a newline in a shell word printed lines of `kiwi approvals` that
    read as a second request, and the human approved an `rm` of a file that request hid)."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def safe_text(text: str) -> str:
    """``text`` with every character that could steer a terminal shown as an escape."""
    return _UNSAFE.sub(_shown, text)


class SafeStream:
    """A text stream that writes through to ``stream`` with :func:`safe_text` applied."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(safe_text(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        # flush, isatty, fileno, encoding, buffer (binary writers such as the MCP stdio transport are
        # protocol, not text for a human), ...
        return getattr(self._stream, name)


@contextlib.contextmanager
def safe_output() -> Iterator[None]:
    """While inside, sys.stdout and sys.stderr escape what could steer a terminal."""
    saved = sys.stdout, sys.stderr
    sys.stdout = SafeStream(saved[0])  # type: ignore[assignment]
    sys.stderr = SafeStream(saved[1])  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
