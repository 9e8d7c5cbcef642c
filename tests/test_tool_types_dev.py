"""Every executor end to end as a user runs it: `kiwi dev` (dev server, worker, MCP front end over HTTP),
one directive whose automatic steps call an api, a python tool with packages, a bash tool with its
requirements and, where an engine exists, a docker tool; started over MCP, completed, audited."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys

import pytest

from activities.container import container_engine
from kiwi.auditlog import read_audit
from kiwi.devserver import free_port
from tests.helpers import directive_md, execute, mcp_answers, wait_for, write_directive
from tests.test_container_tools import docker_tool, image  # noqa: F401 - the image fixture
from tests.test_dev import read_until
from tests.test_tool_types import LOOKUP, LOOKUP_PARAMS, TOKEN, Api, api_tool, local_tool


async def test_each_executor_runs_end_to_end_through_kiwi_dev_and_mcp(
    project, tmp_path, monkeypatch, request
):
    from mcp.client import Client

    monkeypatch.setenv("KIWI_TEST_API_TOKEN", TOKEN)
    monkeypatch.setenv("KIWI_TEST_TOOL_KEY", "tool-key-value")
    with Api() as api:
        api_tool(project, "lookup", LOOKUP.format(port=api.port), LOOKUP_PARAMS)
        local_tool(
            project,
            "coloured",
            "python",
            "import termcolor\n\ndef main():\n    return {'red': termcolor.colored('x', 'red')}\n",
            "packages: [termcolor>=3]\n",
        )
        local_tool(
            project,
            "shout",
            "bash",
            'echo "{\\"ok\\": true}"\n',
            "commands: [bash]\nenvironment: [KIWI_TEST_TOOL_KEY]\n",
        )
        tools, steps = (
            ["lookup", "coloured", "shout"],
            [
                '<step name="fetch"><tool_call tool="lookup"><param name="id">7</param></tool_call></step>',
                '<step name="colour"><tool_call tool="coloured"/></step>',
                '<step name="shout"><tool_call tool="shout"/></step>',
            ],
        )
        try:
            name = request.getfixturevalue("image")
        except pytest.skip.Exception:  # no engine or busybox here: the other executors still run
            name = None
        assert name or container_engine() is None or shutil.which("busybox") is None
        if name:
            docker_tool(project, "boxed", name, "echo '{\"boxed\": true}'\n")
            tools.append("boxed")
            steps.append('<step name="box"><tool_call tool="boxed"/></step>')
        write_directive(
            project / ".ai" / "directives" / "every_executor.md",
            directive_md(
                "".join(steps),
                name="every_executor",
                permissions=f'<execute resource="tool" id="{",".join(tools)}"/>'
                f'<execute resource="network" hosts="{api.host}"/>',
            ),
        )
        port, ui, mcp = free_port(), free_port(), free_port()
        config = tmp_path / "dev.yml"
        config.write_text(
            f"temporal:\n  port: {port}\n  ui_port: {ui}\n  db_file: state/temporal.sqlite\nmcp:\n  port: {mcp}\n"
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kiwi",
            "dev",
            "--config",
            str(config),
            cwd=str(project),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            await read_until(proc.stdout, b"ready")
            url = f"http://127.0.0.1:{mcp}/mcp"
            await wait_for(lambda: mcp_answers(url), timeout=60, what="the MCP front end of kiwi dev")
            async with Client(url) as client:
                started = await execute(
                    client, {"item_type": "directive", "action": "run", "item_id": "every_executor"}
                )
                run_id = started["run_id"]

                async def finished():
                    status = await execute(client, {"item_type": "run", "action": "status", "run_id": run_id})
                    return status if status["status"] in ("completed", "failed") else None

                status = await wait_for(finished, timeout=120, what="the run to finish")
            assert status["status"] == "completed", status
            calls = [r for r in read_audit(str(project), run_id) if r.get("event") == "tool_call"]
            assert [(r["tool"], r["decision"]) for r in calls] == [(t, "allowed") for t in tools]
            assert api.requests[0]["headers"]["Authorization"] == f"Bearer {TOKEN}"
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            await asyncio.wait_for(proc.stdout.read(), 60)
            await proc.wait()
