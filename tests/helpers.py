"""Builders shared by tests: directive text and project folders."""

from __future__ import annotations

import textwrap
from pathlib import Path

# Real files from the original Kiwi MCP project (MIT licence; see compat/kiwi-mcp/SOURCES.md).
COMPAT = Path(__file__).resolve().parent / "compat" / "kiwi-mcp"


def directive_md(body: str, name: str = "demo", version: str = "1.0.0", permissions: str = "",
                 inputs: str = "", tools: str = "", extra_meta: str = "") -> str:
    """A directive file: Markdown around one ```xml block; ``body`` is the <process> content."""
    return textwrap.dedent("""\
        # {name}

        Some prose before the block.

        ```xml
        <directive name="{name}" version="{version}">
          <metadata>
            <description>Demo directive {name}</description>
            <category>tests</category>
            <author>tests</author>
            <model tier="fast" />
            <permissions>
        {permissions}
            </permissions>
        {tools}
        {extra_meta}
          </metadata>
          <inputs>
        {inputs}
          </inputs>
          <process>
        {body}
          </process>
        </directive>
        ```
        """).format(name=name, version=version, permissions=permissions, inputs=inputs, tools=tools,
                    extra_meta=extra_meta, body=body)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def signed(text: str) -> str:
    """``text`` signed by the test's own key (made and trusted on first use, as `kiwi init` does)."""
    from kiwi.cli_keys import ensure_key
    from kiwi.signing import sign

    return sign(text, signer=ensure_key()[0], kind="directive")


def write_directive(path: Path, text: str) -> Path:
    """Write a directive as a human would after `kiwi sign`: its grants take effect."""
    return write(path, signed(text))


def approver(name: str) -> str:
    """A person who may approve calls: a key of their own, trusted for approving in the user space."""
    from kiwi.keys import create_key, trust_key
    from kiwi.store import user_space

    _, public = create_key(name)
    trust_key(user_space(), name, public, ["approve"])
    return name
