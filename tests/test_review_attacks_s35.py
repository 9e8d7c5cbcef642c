"""Review s35: a hostile agent's attacks through the git tools, against the real stack (a Temporal server, Kiwi's
worker, the front end with a real MCP client). Each test's docstring says the attack and the safe outcome."""

from __future__ import annotations

import json
import subprocess

import pytest
from mcp.client import Client as McpClient

from activities import confinement
from mcp_frontend.server import build_server
from tests.helpers import data, write
from tests.test_attack_shell import agent_run, shell

SECRET = "TOKEN=supersecret-7f3a9c"
ROTATED = "TOKEN=rotated-secret-b00b1e"
TOOL_SECRET = "API_TOKEN=tool-secret-91be0c"


def _repository(project) -> list[str]:
    """The project as a git repository with a commit of the human's: a denied secret, a tool's .env and the
    harness tracked, the agent's src/ too."""
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    write(project / "secrets" / "prod.env", SECRET + "\n")
    write(project / ".ai" / "tools" / "text" / "word_count" / ".env", TOOL_SECRET + "\n")
    write(project / "src" / "app.py", "print('v1')\n")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run([*git, "add", "-f", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "the human's"], check=True)
    # Then changed on disk, as a token rotation and a tool's new key would be.
    write(project / "secrets" / "prod.env", ROTATED + "\n")
    write(project / ".ai" / "tools" / "text" / "word_count" / ".env", TOOL_SECRET + "-ROTATED\n")
    harness = project / ".ai" / "config" / "agent_harness.yaml"
    write(harness, harness.read_text() + "# rotated: harness-secret-55\n")
    write(project / "src" / "app.py", "print('v2')\n")
    return git


DEV = (
    '<read resource="filesystem" path="**"/><write resource="filesystem" path="src/**"/>'
    '<deny resource="filesystem" path="secrets/**"/>'
    '<execute resource="tool" id="git.status,git.diff,git.commit"/>'
)


async def test_git_diff_shows_no_file_the_run_may_not_read(runs, project):
    """The attack: a run denied `secrets/**` (filesystem.read, cat, grep -r and git grep all refused) asked
    git.diff for `secrets/prod.env`, and got the old and the rotated token; `git.diff` of `.ai/config` or `.ai/tools`
    printed the harness's and a tool's .env's changes. The git tools were granted by id alone, and Kiwi's own git
    ran outside the kernel's wall. Now a denied path named is refused, and a diff, a status and a commit leave out
    each file the run may not read, saying how many."""
    git = _repository(project)
    run_id = await agent_run(runs, project, "dev_task", DEV)
    for denied in ("secrets/prod.env", "secrets"):
        named = await runs.call_tool(run_id, "git.diff", {"paths": [denied]})
        assert named.status == "denied" and "explicitly denied by 'secrets/**'" in named.reason, named
    for paths in ([], ["."], [".ai/config"], [".ai/tools"]):
        diffed = await runs.call_tool(run_id, "git.diff", {"paths": paths} if paths else {})
        assert diffed.status == "ok", (paths, diffed)
        shown = json.dumps(diffed.model_dump())
        for secret in ("supersecret", "rotated-secret", "tool-secret", "harness-secret"):
            assert secret not in shown, (paths, secret, diffed)
        if paths in ([], ["."]):
            assert "+print('v2')" in diffed.result["diff"], diffed
            assert diffed.result["withheld"] == 3, diffed
        else:
            assert diffed.result["diff"] == "" and diffed.result["withheld"] >= 1, (paths, diffed)
    status = await runs.call_tool(run_id, "git.status", {})
    assert status.status == "ok", status
    assert status.result["changes"] == [" M src/app.py"] and status.result["withheld"] >= 3, status
    # A commit takes the agent's work (what it may write), not the denied file the human staged meanwhile, nor
    # the human's work in progress elsewhere (second review s35: committed, under the run's `write src/**`);
    # what the human staged stays staged.
    subprocess.run([*git, "add", "secrets/prod.env"], check=True)
    write(project / "docs" / "readme.md", "the human's draft\n")
    committed = await runs.call_tool(run_id, "git.commit", {"message": "v2"})
    assert committed.status == "ok" and committed.result["files"] == 1, committed
    assert committed.result["left_out"] >= 3, committed
    changed = subprocess.run(
        [*git, "show", "--name-only", "--format=", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert changed == ["src/app.py"], changed
    staged = subprocess.run([*git, "diff", "--cached", "--name-only"], capture_output=True, text=True).stdout
    assert staged.split() == ["secrets/prod.env"], staged
    mine = await runs.call_tool(run_id, "git.commit", {"message": "docs", "paths": ["docs"]})
    assert mine.result == {
        "committed": False,
        "reason": "nothing to commit that this run may write",
        "left_out": 1,
    }
    refused = await runs.call_tool(run_id, "git.commit", {"message": "x", "paths": ["secrets"]})
    assert refused.status == "denied", refused


async def test_calls_outside_a_run_diff_no_protected_place(runs, project, temporal_env):
    """The same through the MCP front end outside a run, with the default harness (read **, git.diff granted):
    `git.diff` of `.ai/config` printed the harness's uncommitted changes, which filesystem.read refuses."""
    _repository(project)
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with McpClient(server) as client:

        async def call(tool: str, arguments: dict) -> dict:
            return data(
                await client.call_tool(
                    "execute",
                    {"item_type": "tool", "action": "call", "item_id": tool, "parameters": arguments},
                )
            )

        refused = await call("filesystem.read", {"path": ".ai/config/agent_harness.yaml"})
        assert refused["status"] == "denied", refused
        for paths in ([".ai/config"], [".ai/tools"], ["."]):
            diffed = await call("git.diff", {"paths": paths})
            assert diffed["status"] == "ok", diffed
            assert "harness-secret" not in json.dumps(diffed) and "tool-secret" not in json.dumps(diffed), (
                diffed
            )
            assert diffed["result"]["withheld"] >= 1, diffed
        everything = await call("git.diff", {})
        assert "+print('v2')" in everything["result"]["diff"] and "rotated-secret-b00b1e" in json.dumps(
            everything
        )


async def test_git_add_of_a_folder_holding_protected_places_is_refused(runs, project):
    """The attack: with `write **` and shell git, `git add -N .` put a tool's untracked .env in the human's index
    (an intent to add reads no file, so the kernel's wall withholding it did not stop it); git.diff then printed
    it, and a human's `git commit -a` would commit it. `git add PATH` stages PATH's whole tree, as `git add -A`
    does: refused where it holds protected places no grant names; a folder of the agent's own is staged."""
    git = _repository(project)
    write(project / ".ai" / "tools" / "text" / "word_count" / ".env.local", TOOL_SECRET + "\n")
    grants = (
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="**"/>'
        '<execute resource="shell" commands="git"/><execute resource="tool" id="git.diff"/>'
    )
    run_id = await agent_run(runs, project, "stager", grants)
    for argv in (["git", "add", "-N", "."], ["git", "add", "."], ["git", "add", "--", "*.local"]):
        refused = await shell(runs, run_id, *argv)
        assert refused.status == "denied", (argv, refused)
    staged = subprocess.run([*git, "diff", "--cached", "--name-only"], capture_output=True, text=True).stdout
    assert staged == "", staged
    assert (await shell(runs, run_id, "git", "add", "-N", "src")).status == "ok"
    diffed = await runs.call_tool(run_id, "git.diff", {})
    assert "tool-secret" not in json.dumps(diffed.model_dump()) and "+print('v2')" in diffed.result["diff"], (
        diffed
    )


async def test_a_nested_projects_secrets_are_withheld_as_the_roots_are(runs, project):
    """Second review s35 (high): a monorepo's service is a Kiwi project of its own, its tool's .env untracked as
    the README says. `git grep --untracked -e API_KEY` (the default session's shell git) printed
    `services/api/.ai/tools/t/.env`, which filesystem.read refuses (a `.ai` below the root is protected whole),
    and a checkpoint took it into its ref, where `git grep SECRET REF` printed it: the kernel's wall and the
    checkpoint left out only the root's. A nested `.ai` is withheld whole, and no checkpoint takes its secrets."""
    nested = project / "services" / "api" / ".ai"
    write(nested / "tools" / "t" / "tool.yaml", "tool_id: t\ntool_type: python\n")
    write(nested / "tools" / "t" / ".env", "API_KEY=nested-SECRET-444\n")
    write(nested / "config" / "mcp_registry.yaml", "# API_KEY=nested-SECRET-444\nmcps: {}\n")
    write(project / "src" / "app.py", "API_KEY = os.environ['API_KEY']\n")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    grants = (
        '<read resource="filesystem" path="**"/><execute resource="shell" commands="grep,git"/>'
        '<execute resource="tool" id="git.checkpoint,git.status,git.diff"/>'
    )
    run_id = await agent_run(runs, project, "monorepo", grants)
    for argv in (
        ["grep", "-r", "API_KEY", "."],
        ["git", "grep", "--untracked", "-e", "API_KEY"],
        ["git", "grep", "--no-index", "-e", "API_KEY"],
    ):
        result = await shell(runs, run_id, *argv)
        assert "nested-SECRET" not in json.dumps(result.model_dump()), (argv, result)
        assert "src/app.py" in (result.result or {}).get("stdout", ""), (argv, result)
    checkpoint = await runs.call_tool(run_id, "git.checkpoint", {"message": "before"})
    assert checkpoint.status == "ok", checkpoint
    ref = checkpoint.result["ref"]
    listed = await shell(runs, run_id, "git", "ls-tree", "-r", "--name-only", ref)
    assert (
        "src/app.py" in listed.result["stdout"]
        and "services/api/.ai/tools/t/tool.yaml" in listed.result["stdout"]
    )
    assert (
        ".env" not in listed.result["stdout"] and "services/api/.ai/config" not in listed.result["stdout"]
    ), listed
    found = await shell(runs, run_id, "git", "grep", "-e", "nested-SECRET", ref)
    assert "nested-SECRET-444" not in json.dumps(found.model_dump()), found
    # One made after the worker's last look (it remembers the project's folders while they do not change).
    write(project / "services" / "web" / ".ai" / "tools" / "w" / ".env", "API_KEY=later-SECRET-555\n")
    later = await shell(runs, run_id, "grep", "-r", "API_KEY", ".")
    assert "later-SECRET" not in json.dumps(later.model_dump()) and "src/app.py" in later.result["stdout"], (
        later
    )


async def test_a_copy_to_the_project_of_a_signed_directive_keeps_no_grant_a_human_removes_later(
    runs, project, temporal_env, monkeypatch, tmp_path_factory
):
    """Second review s35: `load(copy_to_project=true)` of a signed user-space directive wrote the project's copy
    with its signature; the human then narrowed the user-space one (shell taken out) and signed it again, and the
    project's copy, which wins and which the agent may not delete (signed), still ran `cat`. What an agent writes
    is never signed: the copy runs with the base policy until a human signs it."""
    from tests.helpers import directive_md, write_directive

    user = tmp_path_factory.mktemp("user-ai")
    monkeypatch.setenv("AI_USER_SPACE", str(user))
    write(project / "docs" / "readme.md", "hello\n")
    wide = '<read resource="filesystem" path="**"/><execute resource="shell" commands="cat"/>'
    body = '<step name="work"><action>Work.</action></step>'
    user_copy = user / "directives" / "udev.md"
    write_directive(user_copy, directive_md(body, name="udev", permissions=wide))
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with McpClient(server) as client:
        loaded = data(
            await client.call_tool(
                "load",
                {"item_type": "directive", "item_id": "udev", "source": "user", "copy_to_project": True},
            )
        )
        assert loaded["copied"]["signed"] is False and "kiwi sign" in loaded["copied"]["note"], loaded
        copy = project / ".ai" / "directives" / "udev.md"
        assert "kiwi:signed" not in copy.read_text()
        # The human narrows theirs; the project's copy (which wins) runs with the base policy, not `cat`.
        write_directive(
            user_copy, directive_md(body, name="udev", permissions='<read resource="filesystem" path="**"/>')
        )
        started = data(
            await client.call_tool("execute", {"item_type": "directive", "action": "run", "item_id": "udev"})
        )
        assert started["trust"]["grants"] == "base", started["trust"]
        ran = data(
            await client.call_tool(
                "execute",
                {
                    "item_type": "tool",
                    "action": "call",
                    "item_id": "shell.run",
                    "run_id": started["run_id"],
                    "parameters": {"command": "cat docs/readme.md"},
                },
            )
        )
        assert ran["status"] == "denied", ran


async def test_another_projects_run_is_no_task_of_this_client(runs, project, temporal_env, tmp_path_factory):
    """Second review s35 (low): tasks/cancel and tasks/update of another project's run (`run:RUN` as the task id)
    described it before checking whose it was, so the answer said it existed (and cancel went on to the run's
    own project check). Another project's run is answered as no task at all, and stays as it was."""
    from mcp.client import Client
    from mcp.shared.exceptions import MCPError
    from mcp_types import Result

    from kiwi.cli import main as kiwi_main
    from tests.test_mcp_tasks import CancelTask, TaskIdParams, Tasks, get_task

    theirs = tmp_path_factory.mktemp("other-project")
    assert kiwi_main(["init", str(theirs)]) == 0
    run_id = await runs.start("hello_kiwi", {"name": "Ada"})
    server = build_server(temporal_env.client, theirs, task_queue=runs.task_queue)
    async with Client(server, extensions=[Tasks()]) as client:
        for ask in (
            lambda: get_task(client.session, f"run:{run_id}"),
            lambda: client.session.send_request(
                CancelTask(params=TaskIdParams(taskId=f"run:{run_id}")), Result
            ),
        ):
            with pytest.raises(MCPError) as refused:
                await ask()
            assert refused.value.error.code == -32602 and run_id in refused.value.error.message, refused.value
            assert str(project) not in refused.value.error.message, refused.value
    assert (await runs.status(run_id)).status != "cancelled"


async def test_shell_git_commit_stages_only_what_the_run_may_write(runs, project):
    """Third review s35: shell `git commit -- docs/wip.md`, `git commit -a` and `git commit --pathspec-from-file`
    (a list the run wrote) stage and commit in one step, which `git add` checks: under `write src/**` they
    committed a human's draft, a directive (a protected place), a rotated secret and Kiwi's records. Each
    path `git commit` stages is checked as `git add`'s are; the run's own folder still commits."""
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    write(project / "src" / "app.py", "print('v1')\n")
    write(project / "docs" / "wip.md", "the human's draft\n")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run([*git, "add", "-f", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "the human's"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    grants = (
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="src/**"/>'
        '<execute resource="shell" commands="git"/>'
    )
    run_id = await agent_run(runs, project, "shellcommit", grants)
    write(project / "docs" / "wip.md", "the human's draft, more\n")
    write(project / "src" / "list.txt", "docs/wip.md\n")
    write(project / "src" / "app.py", "print('v2')\n")
    for argv in (
        ["git", "commit", "-m", "x", "--", "docs/wip.md"],
        ["git", "commit", "-am", "x"],
        ["git", "commit", "--all", "-m", "x"],
        ["git", "commit", "-m", "x", "--pathspec-from-file=src/list.txt"],
    ):
        refused = await shell(runs, run_id, *argv)
        assert refused.status == "denied", (argv, refused)
    assert subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout == head
    mine = await shell(runs, run_id, "git", "commit", "-qm", "v2", "--", "src/app.py")
    assert mine.status == "ok", mine
    changed = subprocess.run(
        [*git, "show", "--name-only", "--format=", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert changed == ["src/app.py"], changed


@pytest.mark.skipif(
    confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock: Kiwi's git is not confined"
)
async def test_git_tools_in_a_project_inside_a_larger_repository_say_they_cannot_work_there(
    runs, tmp_path_factory
):
    """Third review s35 (low): in a project that is a folder of a larger repository, git.status answered a clean
    tree (its confined git could not reach the repository above the project, and its failure was dropped) and
    git.diff 'not a git repository'. Each says why, and a checkpoint is unavailable for that reason."""
    from kiwi.cli import main as kiwi_main
    from tests.helpers import run_client

    mono = tmp_path_factory.mktemp("mono")
    sub = mono / "services" / "api"
    sub.mkdir(parents=True)
    assert kiwi_main(["init", str(sub)]) == 0
    subprocess.run(["git", "init", "-q", str(mono)], check=True)
    theirs = run_client(runs.client, sub)
    theirs.task_queue = runs.task_queue
    grants = '<read resource="filesystem" path="**"/><execute resource="tool" id="git.status,git.diff,git.checkpoint"/>'
    run_id = await agent_run(theirs, sub, "inner", grants)
    for tool in ("git.status", "git.diff"):
        answer = await theirs.call_tool(run_id, tool, {})
        assert (
            answer.error_type == "GitUnavailable" and f"inside the git repository {mono}" in answer.reason
        ), answer
    checkpoint = await theirs.call_tool(run_id, "git.checkpoint", {})
    assert checkpoint.result["available"] is False and "begins above it" in checkpoint.result["reason"], (
        checkpoint
    )
