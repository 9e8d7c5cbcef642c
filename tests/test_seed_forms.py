"""Configuration written from the seeds takes the seed's meaning or fails loudly, never silently.

Harness keys from mcp-orchestration-design.md (`allowed_mcps`, `internal_tools.filesystem.allowed_paths`
/ `read_only_paths` / `enabled`, `internal_tools.shell.enabled`) and ADR-006's MCP server keys
(`config.servers` with `alias`, `transport`, `tool_filter`, `cache_tools`, `require_approval.always`).
"""

from __future__ import annotations

import pytest

from kiwi.errors import ItemInvalid
from kiwi.harness import load_harness
from kiwi.upstream.registry import load_registry
from tests.helpers import write


def harness(project, text: str):
    write(project / ".ai" / "config" / "agent_harness.yaml", text)
    return load_harness(project, project / "no-user-space")


def test_seed_path_grants_mean_project_folders(project):
    loaded = harness(
        project,
        "internal_tools:\n  filesystem:\n    allowed_paths: ['${PROJECT_PATH}/src', 'notes/*.md']\n"
        "    read_only_paths: [docs]\n",
    )
    policy = loaded.base_policy
    assert policy.fs_write == ["src/**", "notes/*.md"]
    assert sorted(policy.fs_read) == ["docs/**", "notes/*.md", "src/**"]


def test_paths_outside_the_project_and_the_agents_own_servers_are_refused_with_what_to_write(project):
    with pytest.raises(
        ItemInvalid, match=r"'/etc' is outside the project; Kiwi's file tools work only inside"
    ):
        harness(project, "internal_tools:\n  filesystem:\n    read_only_paths: [/etc]\n")
    with pytest.raises(ItemInvalid, match="allowed_mcps: the MCP servers an agent connects to are set in"):
        harness(project, "allowed_mcps: [kiwi-mcp]\n")
    with pytest.raises(ItemInvalid, match="write it as internal_tools.filesystem.allowed_paths"):
        harness(project, "allowed_paths: [src]\n")
    with pytest.raises(ItemInvalid, match="mode"):
        harness(project, "mode: direct\n")


def test_disabled_tool_families_grant_nothing(project):
    loaded = harness(
        project,
        "internal_tools:\n  filesystem:\n    enabled: false\n    read: ['**']\n"
        "  shell:\n    enabled: false\n    allowed_commands: [git]\n",
    )
    assert loaded.base_policy.fs_read == [] and loaded.base_policy.shell == []


@pytest.mark.temporal
async def test_read_only_paths_hold_against_a_write_outside_a_run(runs, project):
    """The attack: the agent writes into a folder the seed's harness made read-only."""
    harness(
        project, "internal_tools:\n  filesystem:\n    read_only_paths: [docs]\n    allowed_paths: [notes]\n"
    )
    write(project / "docs" / "guide.md", "the guide")
    read = await runs.session_call("agent", "filesystem.read", {"path": "docs/guide.md"})
    assert read.status == "ok"
    denied = await runs.session_call(
        "agent", "filesystem.write", {"path": "docs/guide.md", "content": "pwned"}
    )
    assert denied.status == "denied"
    assert (project / "docs" / "guide.md").read_text() == "the guide"
    allowed = await runs.session_call("agent", "filesystem.write", {"path": "notes/a.md", "content": "ok"})
    assert allowed.status == "ok"


def test_adr006_server_keys_take_their_meaning(project):
    write(
        project / ".ai" / "config" / "mcp_registry.yaml",
        """\
config:
  servers:
    - alias: files
      transport: stdio
      command: npx
      args: ["-y", "@modelcontextprotocol/server-filesystem", "."]
      cache_tools: false
      tool_filter: ["read_file", "list_directory"]
    - alias: github
      transport: streamable-http
      url: http://127.0.0.1:3000/mcp
      require_approval:
        always: ["delete_repository"]
enabled: true
""",
    )
    registry = load_registry(project, project / "no-user-space")
    files, github = registry.servers["files"], registry.servers["github"]
    assert files.type == "stdio" and files.tools == ["read_file", "list_directory"]
    assert files.schema_ttl_seconds == 0
    assert github.type == "streamable-http" and github.require_approval == ["delete_repository"]


def test_adr006_forms_that_cannot_be_taken_fail_loudly(project):
    path = project / ".ai" / "config" / "mcp_registry.yaml"
    write(path, "config:\n  servers:\n    - transport: stdio\n      command: npx\n")
    with pytest.raises(ItemInvalid, match="each with an alias"):
        load_registry(project, project / "no-user-space")
    write(path, "mcps:\n  a:\n    transport: stdio\n    type: sse\n    command: x\n")
    with pytest.raises(ItemInvalid, match="transport and type say different things"):
        load_registry(project, project / "no-user-space")
    write(path, "servers:\n  a:\n    command: x\n")
    with pytest.raises(ItemInvalid, match="unknown top-level key 'servers'; servers go under mcps:"):
        load_registry(project, project / "no-user-space")
    write(path, "mcps:\n  a:\n    command: x\n    require_approval:\n      sometimes: [x]\n")
    with pytest.raises(ItemInvalid, match="require_approval.sometimes"):
        load_registry(project, project / "no-user-space")


def _problems(permissions: str, tools: str) -> list[str]:
    from kiwi.items.directive import parse_directive_lenient
    from tests.helpers import directive_md

    text = directive_md(
        '<step name="s"><action>Work.</action></step>', name="seedy", permissions=permissions, tools=tools
    )
    _, problems = parse_directive_lenient(text, "seedy.md")
    return [str(p) for p in problems if p.severity == "error"]


def test_the_seeds_tools_forms_are_declarations_checked_against_permissions():
    tools = (
        '<tools><filesystem><read paths="src/**"/><write paths=".ai/outputs/**"/></filesystem>'
        "<shell><command>sort</command><command>wc</command></shell></tools>"
    )
    granted = (
        '<read resource="filesystem" path="**/*"/><write resource="filesystem" path=".ai/outputs/**"/>'
        '<execute resource="shell" commands="sort,wc"/>'
    )
    assert _problems(granted, tools) == []
    missing = _problems('<read resource="filesystem" path="src/**"/>', tools)
    assert any(
        'declares filesystem write of .ai/outputs/** but <permissions> does not grant it; add <write resource="filesystem" path=".ai/outputs/**"/>'
        in p
        for p in missing
    ), missing
    assert any('requests shell command "sort"' in p for p in missing), missing


def test_the_seeds_permission_forms_say_what_to_write():
    problems = _problems('<shell commands="curl,jq"/><env vars="API_KEY"/>', "")
    assert any('write <execute resource="shell" commands="curl,jq"/>' in p for p in problems), problems
    assert any("<env> is not a permission" in p and "requires.environment" in p for p in problems), problems
    typed = _problems('<execute resource="tool" tool_type="bash"/>', "")
    assert any('Kiwi grants tools by id: write <execute resource="tool" id="TOOL,..."/>' in p for p in typed)
