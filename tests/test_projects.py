"""Projects: each run records its project; the CLI and the front end see and steer only their own project's
runs unless told otherwise; a run's activities work in its own project, whatever the worker's folder."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from kiwi.cli import main as kiwi_main
from kiwi.contracts import PROJECT_ATTR
from kiwi.devserver import DevServer, load_dev_config
from kiwi.errors import RunInOtherProject
from tests.helpers import awaiting_step, kiwi_cli, run_client, wait_for


@pytest.fixture
def other_project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("other-project")
    assert kiwi_main(["init", str(root)]) == 0
    return root


async def test_a_run_is_listed_and_steered_only_from_its_own_project(runs, project, other_project):
    run_id = await runs.start("hello_kiwi", {"name": "Ada"})
    await awaiting_step(runs, run_id, "confirm")
    described = await runs.handle(run_id).describe()
    assert described.typed_search_attributes.get(PROJECT_ATTR) == str(project)
    common = ["--address", runs.client.service_client.config.target_host, "--task-queue", runs.task_queue]

    async def listed_here():
        code, out, _ = await kiwi_cli("runs", *common, cwd=project)
        return out if code == 0 and run_id in out else None

    await wait_for(listed_here, what="the run listed in its own project")
    code, out, _ = await kiwi_cli("runs", *common, cwd=other_project)
    assert code == 0 and run_id not in out and f"no runs in {other_project}" in out
    # (s18 trial: runs are listed per task queue, and an empty list did not say which one it looked at.)
    assert "on task queue '" in out and "`kiwi runs --task-queue NAME`" in out
    code, out, _ = await kiwi_cli("runs", "--all-projects", *common, cwd=other_project)
    assert run_id in out and str(project) in out  # every project's runs, each with its project

    # Steering from the other project is refused, naming the run's project and the fix; nothing changes.
    code, _, err = await kiwi_cli(
        "complete-step", run_id, "confirm", "-o", "confirmed=true", *common, cwd=other_project
    )
    assert code == 1 and "Traceback" not in err
    assert f"run {run_id} belongs to the project {project}, not to {other_project}" in err
    assert f"--project {project}" in err and "--all-projects" in err
    for argv in (("status", run_id), ("cancel", run_id), ("audit", run_id)):
        code, _, err = await kiwi_cli(*argv, *common, cwd=other_project)
        assert code == 1 and f"belongs to the project {project}" in err, argv
    assert (await runs.status(run_id)).status == "awaiting_agent"

    # The front end of the other project (a RunClient scoped to it) is refused the same way.
    elsewhere = run_client(runs.client, other_project)
    elsewhere.task_queue = runs.task_queue
    with pytest.raises(RunInOtherProject):
        await elsewhere.call_tool(run_id, "filesystem.read", {"path": "notes/hello.md"})

    # Told which project: --project, or KIWI_PROJECT.
    code, out, err = await kiwi_cli("status", run_id, "--project", str(project), *common, cwd=other_project)
    assert code == 0 and "awaiting_agent" in out, err
    code, out, err = await kiwi_cli(
        "complete-step", run_id, "confirm", "-o", "confirmed=true", *common,
        cwd=other_project, env={"KIWI_PROJECT": str(project)},
    )  # fmt: skip
    assert code == 0 and "run is completed" in out, err


async def test_a_runs_activities_work_in_its_project_not_the_workers_folder(runs, project, other_project):
    """The worker runs in ``project`` (the current folder); a run of the other project writes there."""
    theirs = run_client(runs.client, other_project)
    theirs.task_queue = runs.task_queue
    run_id = await theirs.start("hello_kiwi", {"name": "Bo"})
    await awaiting_step(theirs, run_id, "confirm")
    assert (other_project / "notes" / "hello.md").read_text() == "Hello, Bo! Kiwi wrote this file."
    assert not (project / "notes" / "hello.md").exists()
    await wait_for(lambda: _listed(theirs, run_id), what="the run in its project's list")
    assert run_id not in [r["run_id"] for r in await runs.list_runs()]


async def _listed(runs, run_id):
    return [r["run_id"] for r in await runs.list_runs()] == [run_id]


async def test_a_project_that_is_not_a_folder_is_an_error(project):
    code, _, err = await kiwi_cli("runs", "--project", "/nonexistent/kiwi-project", cwd=project)
    assert code == 1 and "--project /nonexistent/kiwi-project: no such folder" in err
    code, _, err = await kiwi_cli("runs", cwd=project, env={"KIWI_PROJECT": "/nonexistent/p"})
    assert code == 1 and "KIWI_PROJECT /nonexistent/p: no such folder" in err and "Traceback" not in err


def test_the_dev_server_keeps_one_database_per_user_whatever_the_folder(tmp_path, monkeypatch):
    seen = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        config, base = load_dev_config(None)
        seen.append(DevServer.from_config(config, base).db_file)
    assert seen[0] == seen[1] == Path(os.environ["KIWI_HOME"]) / "temporal.sqlite"
    # Only a config file that names a database chooses another one (relative to that file).
    (tmp_path / "a" / "temporal-dev.yml").write_text("temporal:\n  db_file: state/t.sqlite\n")
    monkeypatch.chdir(tmp_path / "a")
    config, base = load_dev_config(None)
    assert DevServer.from_config(config, base).db_file == tmp_path / "a" / "state" / "t.sqlite"


async def test_listing_as_json_names_each_runs_project(runs, project):
    run_id = await runs.start("hello_kiwi", {"name": "Cy"})
    await awaiting_step(runs, run_id, "confirm")
    common = ["--address", runs.client.service_client.config.target_host, "--task-queue", runs.task_queue]

    async def listed():
        code, out, _ = await kiwi_cli("runs", "--json", *common, cwd=project)
        rows = json.loads(out) if code == 0 else []
        return rows if [r["run_id"] for r in rows] == [run_id] else None

    (row,) = await wait_for(listed, what="the run in `kiwi runs --json`")
    assert row["project"] == str(project) and row["status"] == "awaiting_agent"


async def test_a_child_run_belongs_to_its_parents_project(runs, project, other_project):
    from tests.test_child_runs import setup

    setup(
        project,
        '<step name="delegate"><tool_call tool="directive.run"><param name="directive">writer</param>'
        '<param name="inputs">{"who": "kid"}</param></tool_call></step>'
        '<step name="after"><action>Look at the child.</action></step>',
    )
    run_id = await runs.start("parent", {})
    await awaiting_step(runs, run_id, "after")
    child = (await runs.status(run_id)).children[0].run_id
    assert await runs.project_of(child) == str(project)
    elsewhere = run_client(runs.client, other_project)
    elsewhere.task_queue = runs.task_queue
    with pytest.raises(RunInOtherProject, match=f"belongs to the project {project}"):
        await elsewhere.status(child)
    assert (await runs.status(child)).status == "completed"

    async def listed():  # the child is listed with its parent's project, and not in the other one
        return {r["run_id"]: r["project"] for r in await runs.list_runs()}.get(child) == str(project)

    await wait_for(listed, what="the child run in its parent's project's list")
    assert child not in [r["run_id"] for r in await elsewhere.list_runs()]


async def test_kiwi_mcp_serves_the_project_it_is_given_and_refuses_other_projects_runs(
    runs, project, other_project, temporal_env
):
    """`kiwi mcp --project` started from another folder: its runs are that project's, and a run of
    another project is refused with an answer naming that project."""
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    theirs = run_client(runs.client, other_project)
    theirs.task_queue = runs.task_queue
    foreign = await theirs.start("hello_kiwi", {"name": "Xi"})
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "kiwi", "mcp", "--project", str(project), *_connection(runs)],
        cwd=str(other_project),
        env={**os.environ},
    )
    async with Client(params) as client:
        started = await client.call_tool(
            "execute",
            {
                "item_type": "directive",
                "action": "run",
                "item_id": "hello_kiwi",
                "parameters": {"name": "Mo"},
            },
        )
        run_id = json.loads(started.content[0].text)["run_id"]
        refused = await client.call_tool(
            "execute", {"item_type": "run", "action": "status", "run_id": foreign}
        )
        answer = refused.content[0].text
    assert await runs.project_of(run_id) == str(project)
    await awaiting_step(runs, run_id, "confirm")
    assert (project / "notes" / "hello.md").read_text() == "Hello, Mo! Kiwi wrote this file."
    assert f"belongs to the project {other_project}" in answer
    hint = json.loads(answer)["hint"]  # the fix an agent can act on: another project's MCP server
    assert f"the Kiwi MCP server of {other_project}" in hint and "--all-projects" not in hint


def _connection(runs) -> list[str]:
    return ["--address", runs.client.service_client.config.target_host, "--task-queue", runs.task_queue]
