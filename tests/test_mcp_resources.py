"""Runs, directives and knowledge as MCP resources, run subscriptions, and directives as MCP prompts,
with a real MCP client against the real stack (Temporal, a worker, the front end)."""

from __future__ import annotations

import asyncio
import json

import pytest
from mcp.client import Client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.shared.subscriptions import ResourceUpdated

from kiwi.devserver import free_port
from mcp_frontend.server import build_server
from tests.helpers import data, execute, kiwi_mcp_http, wait_for


def text_of(result) -> str:
    return result.contents[0].text


async def start_hello(client, name: str = "Ada") -> str:
    started = await execute(
        client,
        {"item_type": "directive", "action": "run", "item_id": "hello_kiwi", "parameters": {"name": name}},
    )
    assert started["state"] == "awaiting_agent", started
    return started["run_id"]


async def test_items_and_runs_are_resources(runs, project, temporal_env):
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        listed = {str(r.uri): r for r in (await client.list_resources()).resources}
        assert "kiwi://directives/hello_kiwi" in listed and "kiwi://knowledge/kiwi-directives" in listed
        assert listed["kiwi://directives/hello_kiwi"].mime_type == "text/markdown"
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert {"kiwi://runs/{run_id}", "kiwi://runs/{run_id}/audit"} <= templates

        directive = text_of(await client.read_resource("kiwi://directives/hello_kiwi"))
        assert directive == (project / ".ai" / "directives" / "hello_kiwi.md").read_text()
        knowledge = text_of(await client.read_resource("kiwi://knowledge/kiwi-directives"))
        assert "zettel_id: kiwi-directives" in knowledge

        # A directive written after the server started is listed at once.
        (project / ".ai" / "directives" / "later.md").write_text(
            (project / ".ai" / "directives" / "hello_kiwi.md")
            .read_text()
            .replace('name="hello_kiwi"', 'name="later"')
        )
        listed = {str(r.uri) for r in (await client.list_resources(cache_mode="refresh")).resources}
        assert "kiwi://directives/later" in listed

        run_id = await start_hello(client)
        status = json.loads(text_of(await client.read_resource(f"kiwi://runs/{run_id}")))
        assert status["status"] == "awaiting_agent" and status["current_step"]["name"] == "confirm"
        assert status["inputs"] == {"name": "Ada"}

        await execute(
            client,
            {
                "item_type": "run",
                "action": "complete_step",
                "run_id": run_id,
                "parameters": {"step": "confirm"},
            },
        )

        async def audited():
            trail = json.loads(
                text_of(await client.read_resource(f"kiwi://runs/{run_id}/audit", cache_mode="refresh"))
            )
            return trail if any(r.get("event") == "run_finished" for r in trail["records"]) else None

        trail = await wait_for(audited, what="the run's audit trail")
        assert [r["seq"] for r in trail["records"]] == sorted(r["seq"] for r in trail["records"])
        assert any(r.get("tool") == "filesystem.write" for r in trail["records"])

        with pytest.raises(MCPError) as missing:
            await client.read_resource("kiwi://runs/run-none-123")
        assert "no run 'run-none-123'" in missing.value.error.message
        # The hint is the agent's call, not a human's command (it said "list runs with `kiwi runs`").
        assert "`search(item_type='run')`" in missing.value.error.message
        assert "`kiwi runs`" not in missing.value.error.message
        with pytest.raises(MCPError):
            await client.read_resource("kiwi://directives/nope")


async def test_directives_are_prompts_that_tell_the_agent_how_to_run_them(runs, project, temporal_env):
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        prompts = {p.name: p for p in (await client.list_prompts()).prompts}
        hello = prompts["hello_kiwi"]
        assert [(a.name, a.required) for a in hello.arguments] == [("name", True)]
        with pytest.raises(MCPError):
            await client.get_prompt("hello_kiwi", {})  # the required input is missing
        got = await client.get_prompt("hello_kiwi", {"name": "Grace"})
        text = got.messages[0].content.text
        call = json.loads(text.split("exactly these arguments:\n", 1)[1].split("\n", 1)[0])
        assert call == {
            "item_type": "directive",
            "action": "run",
            "item_id": "hello_kiwi",
            "parameters": {"name": "Grace"},
        }
        assert "complete_step" in text and "confirm" in text
        # The agent does what the prompt says, and the run starts with the prompt's arguments.
        started = await execute(client, call)
        assert started["state"] == "awaiting_agent"
        assert (await runs.status(started["run_id"])).inputs == {"name": "Grace"}

        # Prompts follow the files: a deleted directive is no prompt any more.
        (project / ".ai" / "directives" / "hello_kiwi.md").unlink()
        assert "hello_kiwi" not in {p.name for p in (await client.list_prompts(cache_mode="refresh")).prompts}


async def watch_until_completed(client, run_id: str, finish) -> list[str]:
    """Subscribe to a run, make it change with ``finish``, and collect the updates heard until it completed."""
    uri = f"kiwi://runs/{run_id}"
    heard: list[str] = []
    async with client.listen(resource_subscriptions=[uri]) as subscription:
        assert subscription.honored.resource_subscriptions == [uri]
        await finish()
        async with asyncio.timeout(30):
            async for event in subscription:
                assert isinstance(event, ResourceUpdated)
                heard.append(event.uri)
                status = json.loads(text_of(await client.read_resource(event.uri, cache_mode="refresh")))
                if status["status"] == "completed":
                    break
    return heard


async def test_a_subscribed_client_hears_the_run_change(runs, project, temporal_env):
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        run_id = await start_hello(client)

        async def finish():
            # Someone else (the CLI, another agent) completes the step: the subscriber hears it.
            await runs.complete_step(run_id, "confirm", {"confirmed": True})

        heard = await watch_until_completed(client, run_id, finish)
        assert heard and set(heard) == {f"kiwi://runs/{run_id}"}


async def test_subscriptions_over_streamable_http_with_the_kiwi_mcp_command(runs, project, temporal_env):
    async with kiwi_mcp_http(temporal_env, runs, project, free_port()) as (url, _), Client(url) as client:
        run_id = await start_hello(client, "Http")

        async def finish():
            await execute(
                client,
                {
                    "item_type": "run",
                    "action": "complete_step",
                    "run_id": run_id,
                    "parameters": {"step": "confirm"},
                },
            )

        heard = await watch_until_completed(client, run_id, finish)
        assert heard
        # A 2025-era client subscribes with resources/subscribe and hears it on its session.
        updates: list[str] = []

        async def on_message(message):
            uri = getattr(getattr(message, "params", None), "uri", None)
            if getattr(message, "method", "") == "notifications/resources/updated":
                updates.append(str(uri))

        async with Client(url, mode="legacy", message_handler=on_message) as legacy:
            second = await start_hello(legacy, "Legacy")
            with pytest.warns(MCPDeprecationWarning):
                await legacy.subscribe_resource(f"kiwi://runs/{second}")
            await runs.complete_step(second, "confirm", {"confirmed": True})

            async def heard_legacy():
                return f"kiwi://runs/{second}" in updates

            await wait_for(heard_legacy, what="a 2025-era subscriber to hear the run change")
        prompts = [p.name for p in (await client.list_prompts()).prompts]
        assert "hello_kiwi" in prompts
        assert data(await client.call_tool("search", {"item_type": "directive", "query": "greeting"}))


async def test_a_2025_subscriber_that_leaves_without_unsubscribing_is_forgotten(runs, project, temporal_env):
    """Review F9: `resources/subscribe` entries (and the run's watcher) stayed for the life of the front end
    when the client went away without unsubscribing. The connection's end releases them."""
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        run_id = await start_hello(client, "Gone")
    uris = [f"kiwi://runs/{run_id}", f"kiwi://runs/{run_id}/audit"]
    async with Client(server, mode="legacy") as legacy:
        with pytest.warns(MCPDeprecationWarning):
            for uri in uris:
                await legacy.subscribe_resource(uri)
        assert server.watches.subscribed() == 2 and run_id in server.watches._watchers
    assert server.watches.subscribed() == 0
    assert run_id not in server.watches._watchers and run_id not in server.watches._counts


async def test_a_subscription_to_another_projects_run_watches_nothing(runs, project, temporal_env, tmp_path):
    """Review s38: a subscription naming another project's run kept a watcher polling it (each status refused)
    until the client's stream closed. The watcher stops at the first refusal."""
    async with Client(build_server(temporal_env.client, project, task_queue=runs.task_queue)) as client:
        run_id = await start_hello(client, "Theirs")
    other = tmp_path / "other"
    (other / ".ai").mkdir(parents=True)
    server = build_server(temporal_env.client, other, task_queue=runs.task_queue)
    async with Client(server, mode="legacy") as legacy:
        with pytest.warns(MCPDeprecationWarning):
            await legacy.subscribe_resource(f"kiwi://runs/{run_id}")
        watcher = server.watches._watchers[run_id]
        await wait_for(lambda: _done(watcher), what="the watcher of another project's run to stop")
    await runs.cancel(run_id)


async def _done(task: asyncio.Task) -> bool:
    return task.done()
