"""Review s34: a hostile agent's attacks through the MCP front end and child runs, against the real stack (a
Temporal server, Kiwi's worker, the front end with a real MCP client). Each test's docstring says the attack and
the safe outcome."""

from __future__ import annotations

import json
import os

import pytest
from mcp.client import Client as McpClient

from kiwi.policy import PermissionSet
from mcp_frontend.server import build_server
from tests.helpers import awaiting_step, data, directive_md, write, write_directive

TOKEN = "ghp_SECRETTOKEN1234567890"
GIT_CONFIG = f'[remote "origin"]\n\turl = https://alice:{TOKEN}@github.com/alice/app.git\n'
ENV_FILE = "API_KEY=sk-live-SECRETVALUE\n"

# What the agent declares: the protected places first (what it is after), then what the base grants anyway.
GREEDY = (
    '<read resource="filesystem" path=".git/config"/><read resource="filesystem" path=".ai/tools/**"/>'
    '<read resource="filesystem" path=".ai/config/**"/><read resource="filesystem" path="notes/**"/>'
    '<write resource="filesystem" path=".ai/tools/**"/><write resource="filesystem" path=".git/config"/>'
    '<write resource="filesystem" path="notes/**"/>'
)


@pytest.mark.parametrize("write_all", [False, True], ids=["base-read-all", "base-read-and-write-all"])
async def test_an_unsigned_directive_the_agent_writes_reaches_no_protected_place(
    runs, project, temporal_env, write_all
):
    """The attack: the agent writes an unsigned directive declaring reads and writes of `.git/config` and
    `.ai/tools/**`, and runs it. An unsigned directive runs with what its grants share with the base policy, and
    the base's `read **` / `write **` covered those globs, so the run was granted them by name, and named grants
    reach protected places: it read the remote's token and a tool's .env, and (base `write **`) rewrote a tool's
    main.py, code the worker runs. Now a grant naming a protected place is kept only where the base names it."""
    (project / ".git").mkdir()
    write(project / ".git" / "config", GIT_CONFIG)
    write(project / ".ai" / "tools" / "text" / "word_count" / ".env", ENV_FILE)
    tool_code = project / ".ai" / "tools" / "text" / "word_count" / "main.py"
    before = tool_code.read_text()
    write(project / "notes" / "a.md", "a note")
    if write_all:
        write(
            project / ".ai" / "config" / "agent_harness.yaml",
            "internal_tools:\n  filesystem:\n    read: ['**']\n    write: ['**']\n",
        )
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    content = directive_md(
        '<step name="work"><action>Look around.</action></step>', name="peek", permissions=GREEDY
    )
    async with McpClient(server) as client:

        async def execute(**arguments) -> dict:
            return data(await client.call_tool("execute", arguments))

        created = await execute(
            item_type="directive", action="create", item_id="peek", parameters={"content": content}
        )
        assert created["status"] == "created", created
        started = await execute(item_type="directive", action="run", item_id="peek")
        run_id = started["run_id"]
        assert started["trust"]["grants"] == "base", started["trust"]
        # (A write grant is a read grant too: notes/** may come twice.)
        assert set(started["permissions"]["fs_read"]) == {"notes/**"}, started["permissions"]
        assert set(started["permissions"].get("fs_write", [])) == ({"notes/**"} if write_all else set()), (
            started
        )
        for tool, arguments in (
            ("filesystem.read", {"path": ".git/config"}),
            ("filesystem.read", {"path": ".ai/tools/text/word_count/.env"}),
            ("filesystem.list", {"path": ".ai/config"}),
            ("filesystem.write", {"path": ".ai/tools/text/word_count/main.py", "content": "import os\n"}),
            ("filesystem.write", {"path": ".git/config", "content": "[core]\n\tfsmonitor = touch PWNED\n"}),
        ):
            refused = await execute(
                item_type="tool", action="call", item_id=tool, run_id=run_id, parameters=arguments
            )
            assert refused["status"] == "denied", (tool, arguments, refused)
            assert TOKEN not in str(refused) and "sk-live" not in str(refused)
        fine = await execute(
            item_type="tool",
            action="call",
            item_id="filesystem.read",
            run_id=run_id,
            parameters={"path": "notes/a.md"},
        )
        assert fine["status"] == "ok" and fine["result"]["content"] == "a note", fine
    assert tool_code.read_text() == before
    assert (project / ".git" / "config").read_text() == GIT_CONFIG
    assert not (project / "PWNED").exists()


def test_grants_meet_on_protected_places_only_where_both_sides_name_them():
    """The rule itself (kiwi.protected.reaches): `**` covers `.git/config` as globs and reaches none of it; a
    grant naming the place (`.git/**`) reaches it. Both ways round, and for what a child declares beyond its
    parent (exceeds)."""
    base = PermissionSet(fs_read=["**"], fs_write=["**"])
    greedy = PermissionSet(
        fs_read=[".git/config", ".ai/tools/**", "sub/.git/HEAD", "temporal-dev.yml", "notes/**"],
        fs_write=[".ai/tools/**", ".ai/config/agent_harness.yaml", "out/**"],
    )
    met = base.intersect(greedy)
    assert (met.fs_read, met.fs_write) == (["notes/**"], ["out/**"])
    assert greedy.exceeds(base) == [
        "read .git/config",
        "read .ai/tools/**",
        "read sub/.git/HEAD",
        "read temporal-dev.yml",
        "write .ai/tools/**",
        "write .ai/config/agent_harness.yaml",
    ]
    naming = PermissionSet(fs_read=[".git/**", "notes/**"], fs_write=[".ai/tools/text/**"])
    met = naming.intersect(greedy)
    assert (met.fs_read, met.fs_write) == ([".git/config", "notes/**"], [".ai/tools/text/**"])
    # A base that names a place gives it to no directive that asks for `**` only.
    met = PermissionSet(fs_read=[".git/config", "src/**"]).intersect(PermissionSet(fs_read=["**"]))
    assert met.fs_read == ["src/**"]


async def test_a_child_run_gets_no_protected_place_its_parent_reaches_only_by_globs(runs, project):
    """The attack through a child run: a parent granted `read **` starts a child directive (signed, so it has its
    own grants) declaring `read .git/config`. On `on_escalation: intersect` the child kept `.git/config` (covered
    by `**` as globs) and read it; on `deny` it was no escalation. Now it is one: refused on `deny`, dropped on
    `intersect`."""
    (project / ".git").mkdir()
    write(project / ".git" / "config", GIT_CONFIG)
    write(project / "notes" / "a.md", "a note")
    write_directive(
        project / ".ai" / "directives" / "boss.md",
        directive_md(
            '<step name="lead"><action>Lead.</action></step>',
            name="boss",
            permissions='<read resource="filesystem" path="**"/><execute resource="tool" id="directive.run"/>',
        ),
    )
    write_directive(
        project / ".ai" / "directives" / "helper.md",
        directive_md(
            '<step name="help"><action>Help.</action></step>',
            name="helper",
            permissions='<read resource="filesystem" path=".git/config"/><read resource="filesystem" path="notes/**"/>',
        ),
    )
    parent = await runs.start("boss", {})
    await awaiting_step(runs, parent, "lead")
    denied = await runs.call_tool(parent, "directive.run", {"directive": "helper"})
    assert denied.status == "denied" and "read .git/config" in denied.reason, denied
    write(project / ".ai" / "config" / "agent_harness.yaml", "child_runs:\n  on_escalation: intersect\n")
    parent = await runs.start("boss", {})
    await awaiting_step(runs, parent, "lead")
    child = (await runs.call_tool(parent, "directive.run", {"directive": "helper"})).result["run_id"]
    await awaiting_step(runs, child, "help")
    read = await runs.call_tool(child, "filesystem.read", {"path": ".git/config"})
    assert read.status == "denied", read
    assert TOKEN not in str(read)
    assert (await runs.call_tool(child, "filesystem.read", {"path": "notes/a.md"})).status == "ok"


async def test_a_folder_read_does_not_print_a_tools_hidden_files(runs, project):
    """Review s34: with `read **` and shell grep/git (the default session's grants), `grep -r API_KEY .` and
    `git grep --untracked -e API_KEY` printed a tool's `.env`, which filesystem.read refuses (.ai/tools is a
    protected place). The kernel's wall withholds the hidden files of the tool folders, as it does .git/config:
    `Permission denied`, the rest of the project searched. A grant naming .ai/tools reads them."""
    import subprocess

    from tests.test_attack_shell import agent_run, shell

    secret = "sk-live-CANARY42"
    write(project / ".ai" / "tools" / "text" / "word_count" / ".env", f"API_KEY={secret}\n")
    write(project / ".ai" / "tools" / "text" / "word_count" / ".cache" / "k", f"API_KEY={secret}\n")
    write(project / "src" / "app.py", "API_KEY = os.environ['API_KEY']\n")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    grants = '<read resource="filesystem" path="**"/><execute resource="shell" commands="grep,git"/>'
    run_id = await agent_run(runs, project, "searcher", grants)
    for argv in (["grep", "-r", "API_KEY", "."], ["git", "grep", "--untracked", "-e", "API_KEY"]):
        result = await shell(runs, run_id, *argv)
        assert result.status in ("ok", "error"), result
        shown = json.dumps(result.model_dump())
        assert secret not in shown, (argv, result)
        assert "src/app.py" in result.result["stdout"], (argv, result)
    named = await agent_run(
        runs, project, "toolsearcher", grants + '<read resource="filesystem" path=".ai/tools/**"/>'
    )
    result = await shell(runs, named, "grep", "-r", "API_KEY", ".ai/tools")
    assert secret in result.result["stdout"], result


async def test_checkpoints_and_commits_take_no_secret_the_wall_withholds(runs, project):
    """Second review s34 (critical): a checkpoint's `git add -A` put a tool's `.env` and `.ai/config` into
    refs/kiwi/checkpoints/RUN/N, and `git grep SECRET REF` (shell git, base policy) printed them; git.commit with no
    paths committed them to the human's branch, for the next push. Neither takes Kiwi's settings, records and
    state, nor the hidden files below the tool folders; the agent's own work is still checkpointed, committed and
    rolled back."""
    import subprocess

    from tests.test_attack_shell import agent_run, shell

    secret = "sk-live-CANARY77"
    write(project / ".ai" / "tools" / "text" / "word_count" / ".env", f"API_KEY={secret}\n")
    write(project / ".ai" / "tools" / "text" / "word_count" / ".venv" / "key", f"{secret}\n")
    write(project / ".ai" / "config" / "mcp_registry.yaml", f"# token {secret}\nmcps: {{}}\n")
    write(
        project / ".ai" / "config" / "agent_harness.yaml", "approvals:\n  tools: []\n"
    )  # (rollback unasked)
    write(project / "src" / "app.py", "print('v1')\n")
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run([*git, "add", "src"], check=True)
    subprocess.run([*git, "commit", "-qm", "the human's"], check=True)
    grants = (
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="src/**"/>'
        '<execute resource="shell" commands="git"/>'
        '<execute resource="tool" id="git.checkpoint,git.commit,git.rollback"/>'
    )
    run_id = await agent_run(runs, project, "committer", grants)
    checkpoint = await runs.call_tool(run_id, "git.checkpoint", {"message": "before"})
    assert checkpoint.status == "ok", checkpoint
    ref = checkpoint.result["ref"]
    for argv in (["git", "grep", "-h", "CANARY", ref], ["git", "ls-tree", "-r", "--name-only", ref]):
        shown = await shell(runs, run_id, *argv)
        assert secret not in json.dumps(shown.model_dump()), (argv, shown)
        assert ".env" not in shown.result["stdout"] and ".ai/config" not in shown.result["stdout"], shown
    listed = await shell(runs, run_id, "git", "ls-tree", "-r", "--name-only", ref)
    assert "src/app.py" in listed.result["stdout"], listed
    assert (
        await runs.call_tool(run_id, "filesystem.write", {"path": "src/app.py", "content": "print('v2')\n"})
    ).status == "ok"
    committed = await runs.call_tool(run_id, "git.commit", {"message": "v2"})
    assert committed.status == "ok" and committed.result["committed"], committed
    tree = subprocess.run(
        [*git, "ls-tree", "-r", "--name-only", "HEAD"], capture_output=True, text=True
    ).stdout
    assert "src/app.py" in tree and ".env" not in tree and ".ai/config" not in tree and ".venv" not in tree, (
        tree
    )
    rolled = await runs.call_tool(run_id, "git.rollback", {"checkpoint": ref})
    assert rolled.status == "ok", rolled
    assert (project / "src" / "app.py").read_text() == "print('v1')\n"
    assert (project / ".ai" / "tools" / "text" / "word_count" / ".env").read_text() == f"API_KEY={secret}\n"


async def test_a_hard_link_in_a_tools_hidden_folder_does_not_stop_every_shell_command(
    runs, project, tmp_path_factory
):
    """Second review s34 (a regression of the wall's new places): a tool cloned with `git clone` (its `.git/objects`
    hard-linked from the clone's source) or with a `.venv` hard-linked from uv's cache made every shell command of
    the project refused ("has another name in the project"), though those names were outside it. A hidden folder
    below the tools is withheld whole; a hidden file there with another name still stops shell commands."""
    from tests.test_attack_shell import agent_run, shell

    outside = tmp_path_factory.mktemp("cache") / "blob"
    outside.write_text("cached")
    venv = project / ".ai" / "tools" / "text" / "word_count" / ".venv"
    venv.mkdir(parents=True)
    os.link(outside, venv / "blob")
    run_id = await agent_run(
        runs,
        project,
        "lister",
        '<read resource="filesystem" path="**"/><execute resource="shell" commands="ls"/>',
    )
    listed = await shell(runs, run_id, "ls")
    assert listed.status == "ok", listed
    secret = project / ".ai" / "tools" / "text" / "word_count" / ".env"
    secret.write_text("API_KEY=x\n")
    os.link(secret, project / "notes-env")
    refused = await shell(runs, run_id, "ls")
    assert refused.status == "denied" and "another name" in refused.reason, refused
