"""An agent writes tools only as proposals: nothing runs them until a human accepts one.

Through a real MCP client over stdio (`kiwi mcp`, no Temporal needed) and the real `kiwi` CLI.
"""

from __future__ import annotations

import json
import os
import sys

from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

from kiwi.cli import main as kiwi
from kiwi.items.store import ItemStore
from tests.helpers import data

MANIFEST = """\
tool_id: {id}
tool_type: python
version: "1.0.0"
category: text
description: {description}
executor:
  type: python
  entrypoint: main.py
parameters:
  - name: text
    type: string
    required: true
"""


def agent(project) -> Client:
    return Client(
        StdioServerParameters(
            command=sys.executable, args=["-m", "kiwi", "mcp"], cwd=str(project), env=dict(os.environ)
        )
    )


async def test_a_tool_the_agent_creates_is_a_proposal_until_a_human_accepts_it(project, capsys):
    async with agent(project) as client:
        made = data(
            await client.call_tool(
                "execute",
                {
                    "item_type": "tool",
                    "action": "create",
                    "item_id": "shout",
                    "parameters": {
                        "manifest": MANIFEST.format(id="shout", description="Shout"),
                        "files": {"main.py": "def main(text):\n    return text.upper()\n"},
                    },
                },
            )
        )
        assert made["status"] == "proposed" and "kiwi tools accept shout" in made["hint"]
        # Not a tool yet: search does not find it, load says there is none.
        found = data(await client.call_tool("search", {"item_type": "tool", "query": "shout"}))
        assert [r for r in found["results"] if r["item_id"] == "shout"] == []
        missing = await client.call_tool("load", {"item_type": "tool", "item_id": "shout"})
        assert missing.is_error

        # An update of a real tool is a proposal too: the tool stays as it was.
        original = (project / ".ai" / "tools" / "text" / "word_count" / "main.py").read_text()
        updated = data(
            await client.call_tool(
                "execute",
                {
                    "item_type": "tool",
                    "action": "update",
                    "item_id": "word_count",
                    "parameters": {
                        "manifest": MANIFEST.format(id="word_count", description="Count, differently"),
                        "files": {"main.py": "import os\n\ndef main(text):\n    return os.listdir('/')\n"},
                    },
                },
            )
        )
        assert updated["status"] == "proposed" and updated["replaces"].endswith("word_count")
        assert (project / ".ai" / "tools" / "text" / "word_count" / "main.py").read_text() == original

        # Files that would land outside the proposal, and a manifest that does not validate, are refused.
        escape = await client.call_tool(
            "execute",
            {
                "item_type": "tool",
                "action": "create",
                "item_id": "sneaky",
                "parameters": {
                    "manifest": MANIFEST.format(id="sneaky", description="x"),
                    "files": {"main.py": "x", "../../tools/text/word_count/main.py": "pwned"},
                },
            },
        )
        assert escape.is_error and "would leave" in data(escape)["message"]
        assert (project / ".ai" / "tools" / "text" / "word_count" / "main.py").read_text() == original
        broken = await client.call_tool(
            "execute",
            {
                "item_type": "tool",
                "action": "create",
                "item_id": "x",
                "parameters": {"manifest": "tool_id: [x"},
            },
        )
        assert broken.is_error

    capsys.readouterr()
    assert kiwi(["tools", "proposals", "--json"]) == 0
    listed = {p["tool_id"] for p in json.loads(capsys.readouterr().out)["proposals"]}
    assert listed == {"shout", "word_count"}
    assert kiwi(["tools", "accept", "shout"]) == 0
    tool = ItemStore(project).find("tool", "shout")
    assert tool.path.endswith("text/shout/tool.yaml")
    assert kiwi(["tools", "accept", "word_count"]) == 0
    assert "listdir" in (project / ".ai" / "tools" / "text" / "word_count" / "main.py").read_text()
