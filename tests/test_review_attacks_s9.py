"""Hostile review, session 9: attacks on what landed with Kiwi's meta-tools in runs, continue-as-new
dedupe, pending session calls, the agent_publish switch, api redirects and docker timeouts. Each test is
the attack against the real stack (a Temporal dev server, a real worker); it fails while the hole is open."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from temporalio.worker import Replayer

from kiwi.auditlog import read_audit
from kiwi.converter import data_converter
from kiwi.errors import KiwiError
from tests.helpers import wait_for, write
from tests.test_kiwi_mcp_tools import agent_run, kiwi_directive
from tests.test_tool_types import agent_directive, api_tool, started
from workers.main import SANDBOX, WORKFLOWS

TOKEN = "kiwi-test-token-s9-51d0e7"
CHILD_BODY = (
    '<step name="write"><tool_call tool="filesystem.write"><param name="path">notes/child.txt</param>'
    '<param name="content">from the child</param></tool_call></step>'
)
PARENT = '<execute resource="kiwi-mcp" action="execute"/><write resource="filesystem" path="notes/**"/>'


def harness(project, text: str) -> None:
    write(project / ".ai" / "config" / "agent_harness.yaml", text)


# ============================================================ kiwi-mcp.execute of a directive


async def test_attack_execute_starts_a_child_run_without_the_approval_directive_run_needs(runs, project):
    """The human's harness says every child run waits for their approval (approvals.tools: [directive.run]);
    kiwi-mcp.execute of a directive started the child at once, as if the rule did not exist."""
    harness(project, "approvals:\n  tools: [directive.run]\n")
    kiwi_directive(project, "parent", PARENT)
    kiwi_directive(project, "note_taker", '<write resource="filesystem" path="notes/**"/>', CHILD_BODY)
    run_id = await agent_run(runs, "parent")
    asked = await runs.call_tool_waiting(
        run_id,
        "kiwi-mcp.execute",
        {"item_type": "directive", "action": "run", "item_id": "note_taker"},
        client_name="agent",
        wait_seconds=1,
    )
    assert asked.status == "pending", f"the child started without the approval: {asked}"

    async def asked_for_approval():
        pending = [a for a in (await runs.status(run_id)).approvals if a.status == "pending"]
        return pending or None

    approvals = await wait_for(asked_for_approval, what="the approval request of the child run")
    assert [a.tool for a in approvals] == ["directive.run"]
    assert await runs.list_runs(directive="note_taker") == []
    assert not (project / "notes" / "child.txt").exists()
    await runs.cancel(run_id)


async def test_attack_execute_starts_more_child_runs_than_the_rate_limit_of_directive_run(runs, project):
    """rate_limits: {directive.run: 1} bounds the child runs a run may start; kiwi-mcp.run did not count."""
    harness(project, "rate_limits:\n  directive.run: 1\n")
    kiwi_directive(project, "parent", PARENT)
    kiwi_directive(project, "note_taker", '<write resource="filesystem" path="notes/**"/>', CHILD_BODY)
    run_id = await agent_run(runs, "parent")
    first = await runs.call_tool(run_id, "kiwi-mcp.run", {"directive": "note_taker"})
    assert first.status == "ok", first
    second = await runs.call_tool(run_id, "kiwi-mcp.run", {"directive": "note_taker"})
    assert second.status == "rate_limited", f"a second child run started past the limit: {second}"
    assert "directive.run" in second.reason
    children = (await runs.status(run_id)).children
    assert [c.run_id for c in children] == [first.result["run_id"]]

    async def both_audited():
        records = [r for r in read_audit(str(project), run_id) if r["event"] == "tool_call"]
        return records if len(records) >= 4 else None

    records = await wait_for(both_audited, what="the calls' audit records")
    assert [(r["tool"], r["decision"]) for r in records] == [
        ("directive.run", "allowed"),
        ("kiwi-mcp.run", "allowed"),
        ("directive.run", "rate_limited"),
        ("kiwi-mcp.run", "rate_limited"),
    ]
    await runs.cancel(run_id)
    # The history (behind its patch) replays on this code.
    await Replayer(
        workflows=WORKFLOWS, data_converter=data_converter, workflow_runner=SANDBOX
    ).replay_workflow(await runs.handle(run_id).fetch_history())


async def test_attack_execute_starts_a_child_run_the_directive_explicitly_denies(runs, project):
    """a <deny resource="tool" id="directive.run"/> in the directive: execute was a way around it."""
    kiwi_directive(project, "parent", PARENT + '<deny resource="tool" id="directive.run"/>')
    kiwi_directive(project, "note_taker", '<write resource="filesystem" path="notes/**"/>', CHILD_BODY)
    run_id = await agent_run(runs, "parent")
    refused = await runs.call_tool(run_id, "kiwi-mcp.run", {"directive": "note_taker"})
    assert refused.status == "denied", f"the denied child run started: {refused}"
    assert "explicitly denied" in refused.reason
    assert await runs.list_runs(directive="note_taker") == []
    await runs.cancel(run_id)


# ============================================================ api tools: a redirect re-sends the body


class Echo:
    """An HTTP server on 127.0.0.1 that records requests; /hop answers 307 to ``hop_to``."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.hop_to = ""
        echo = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else ""
                echo.requests.append({"path": self.path, "body": body, "headers": dict(self.headers)})
                if self.path == "/hop":
                    self.send_response(307)
                    self.send_header("Location", echo.hop_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                raw = json.dumps({"ok": True}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_PUT = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Echo:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def echo_pair() -> Iterator[tuple[Echo, Echo]]:
    with Echo() as first, Echo() as second:
        yield first, second


async def test_attack_a_307_redirect_carries_a_secret_in_the_body_to_another_host(
    runs, project, echo_pair, monkeypatch
):
    """The manifest's headers stay behind on a redirect to another origin, but a 307 re-sent the body,
    secret and all, to whatever granted host the first one named."""
    api, elsewhere = echo_pair
    monkeypatch.setenv("KIWI_TEST_API_TOKEN", TOKEN)
    elsewhere_host = f"127.0.0.1:{elsewhere.port}"
    api.hop_to = f"http://{elsewhere_host}/collect"
    api_tool(
        project,
        "signin",
        f"method: POST\nurl: http://127.0.0.1:{api.port}/hop\nbody:\n  token: ${{KIWI_TEST_API_TOKEN}}\n",
    )
    agent_directive(project, ["signin"], hosts=f"127.0.0.1:{api.port},{elsewhere_host}")
    run_id = await started(runs)
    called = await runs.call_tool(run_id, "signin", {})
    await runs.cancel(run_id, "done")
    leaked = [r for r in elsewhere.requests if TOKEN in r["body"]]
    assert not leaked, f"the second host got the secret in the body: {leaked}"
    assert called.status in ("error", "denied") and "redirect" in called.reason, called
    assert TOKEN in api.requests[0]["body"]  # the first, intended host got it


# ============================================================ kiwi-mcp.run: another name, no rules


WORD_COUNT = '<execute resource="tool" id="word_count"/>'
COUNT = {"tool_name": "word_count", "parameters": {"text": "a b c"}}


async def test_attack_kiwi_mcp_run_skips_the_approval_rule_of_kiwi_mcp_execute(runs, project):
    """approvals.tools: [kiwi-mcp.execute]; the same tool called by its other name asked nobody."""
    harness(project, "approvals:\n  tools: [kiwi-mcp.execute]\n")
    kiwi_directive(project, "parent", PARENT + WORD_COUNT)
    run_id = await agent_run(runs, "parent")
    asked = await runs.call_tool_waiting(run_id, "kiwi-mcp.run", COUNT, client_name="agent", wait_seconds=1)
    assert asked.status == "pending", f"kiwi-mcp.run ran without the approval: {asked}"

    async def asked_for_approval():
        pending = [a for a in (await runs.status(run_id)).approvals if a.status == "pending"]
        return pending or None

    assert [a.tool for a in await wait_for(asked_for_approval, what="the approval request")] == [
        "kiwi-mcp.run"
    ]
    await runs.cancel(run_id)


async def test_attack_kiwi_mcp_run_escapes_a_denial_and_a_rate_limit_of_kiwi_mcp_execute(runs, project):
    harness(project, "rate_limits:\n  kiwi-mcp.execute: 1\n")
    kiwi_directive(project, "limited", PARENT + WORD_COUNT)
    kiwi_directive(project, "denied", PARENT + WORD_COUNT + '<deny resource="tool" id="kiwi-mcp.execute"/>')
    run_id = await agent_run(runs, "limited")
    first = await runs.call_tool(run_id, "kiwi-mcp.execute", COUNT)
    assert first.status == "ok", first
    second = await runs.call_tool(run_id, "kiwi-mcp.run", COUNT)
    assert second.status == "rate_limited", f"kiwi-mcp.run went past kiwi-mcp.execute's limit: {second}"
    await runs.cancel(run_id)

    run_id = await agent_run(runs, "denied")
    assert (await runs.call_tool(run_id, "kiwi-mcp.execute", COUNT)).status == "denied"
    other = await runs.call_tool(run_id, "kiwi-mcp.run", COUNT)
    assert other.status == "denied" and "explicitly denied" in other.reason, other
    await runs.cancel(run_id)


# ============================================================ oversized results across continue-as-new


async def test_attack_big_results_carried_across_continue_as_new_end_the_run(runs, project):
    """The last 50 agent calls' results travel in the continue-as-new input (RunState.recent_updates), so
    re-sent calls can be answered from it; a few large answers (kiwi-mcp.load of a big item, a big
    filesystem.read) made that input larger than Temporal takes, and the run died at the hand-over."""
    harness(project, "runs:\n  continue_as_new_after_updates: 4\n")
    filler = "\n".join(f"line {i} " + "x" * 90 for i in range(9000))  # about 900 kB
    write(
        project / ".ai" / "knowledge" / "big.md",
        f"---\nzettel_id: big\ntitle: A big entry\nentry_type: concept\ncategory: kiwi\n---\n\n{filler}\n",
    )
    kiwi_directive(project, "reader", '<execute resource="kiwi-mcp" action="load"/>')
    run_id = await agent_run(runs, "reader")
    for _ in range(4):
        loaded = await runs.call_tool(run_id, "kiwi-mcp.load", {"item_type": "knowledge", "item_id": "big"})
        assert loaded.status == "ok" and len(loaded.result["content"]) > 800_000

    async def continued():
        status = await runs.status(run_id)
        assert status.status not in ("failed", "terminated", "cancelled"), status.status
        return status if status.continued >= 1 else None

    await wait_for(continued, what="the run to continue-as-new and go on")
    again = await runs.call_tool(run_id, "kiwi-mcp.load", {"item_type": "knowledge", "item_id": "big"})
    assert again.status == "ok", again
    await runs.cancel(run_id)


async def test_attack_big_step_outputs_carried_across_continue_as_new_end_the_run(runs, project):
    """A step's outputs are the agent's to choose and travel in the continue-as-new input too: two
    completions of 1.2 MB each made the hand-over larger than Temporal takes, and the run stood still."""
    harness(project, "runs:\n  continue_as_new_after_updates: 2\n")
    steps = "".join(f'<step name="s{i}"><action>Step {i}.</action></step>' for i in range(3))
    kiwi_directive(project, "steps", '<read resource="filesystem" path="notes/**"/>', steps)
    run_id = await agent_run(runs, "steps")
    refused = None
    for name in ("s0", "s1"):
        try:
            await runs.complete_step(run_id, name, {"text": "y" * 1_200_000})
        except KiwiError as exc:
            refused = exc
            break
    assert refused is not None, "1.2 MB outputs were taken"
    assert refused.type == "InputInvalid" and "outputs are" in str(refused), refused
    # The run goes on with outputs of a sensible size.
    await runs.complete_step(run_id, "s0", {"text": "small"})

    async def on_s1():
        view = (await runs.status(run_id)).current_step
        return view if view is not None and view.name == "s1" else None

    await wait_for(on_s1, what="the run to take the small outputs")
    await runs.cancel(run_id)


# ============================================================ api tools: IPv6 spellings of local addresses


@pytest.mark.parametrize(
    "address",
    [
        "::127.0.0.1",  # IPv4-compatible: Python calls it global
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254: global to Python, the metadata service to a gateway
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "::ffff:169.254.169.254",
    ],
)
def test_attack_a_granted_name_resolving_to_an_ipv6_form_of_a_local_address_passes_as_public(address):
    """A host granted by name reaches public addresses only; the DNS answer is checked with the same
    rule (activities.api.public_address) before anything is sent. These answers carry a local IPv4 address."""
    import ipaddress

    from activities.api import public_address as public

    assert not public(ipaddress.ip_address(address))


def test_public_addresses_stay_public():
    import ipaddress

    from activities.api import public_address as public

    for address in ("8.8.8.8", "2001:4860:4860::8888", "64:ff9b::808:808", "2002:808:808::1"):
        assert public(ipaddress.ip_address(address)), address


async def test_attack_a_load_whose_answer_escapes_past_the_payload_limit_stops_the_run(runs, project):
    """An item under the 1 MB item limit whose JSON spelling is several times larger (control characters
    become \\u0001): kiwi-mcp.load's local activity result went over Temporal's 2 MB payload limit, the
    workflow task failed on every attempt and the run stood still (no status, no cancel)."""
    write(
        project / ".ai" / "knowledge" / "noisy.md",
        "---\nzettel_id: noisy\ntitle: Noisy\nentry_type: concept\ncategory: kiwi\n---\n\n"
        + "\x01" * 900_000,
    )
    kiwi_directive(project, "reader", '<execute resource="kiwi-mcp" action="load"/>')
    run_id = await agent_run(runs, "reader")
    loaded = await runs.call_tool_waiting(
        run_id,
        "kiwi-mcp.load",
        {"item_type": "knowledge", "item_id": "noisy"},
        client_name="agent",
        wait_seconds=10,
    )
    assert loaded.status == "denied" and "bytes as JSON text" in loaded.reason, loaded
    assert (await runs.status(run_id)).status == "awaiting_agent"
    await runs.cancel(run_id)


async def test_attack_a_file_read_whose_answer_escapes_past_the_payload_limit_stops_the_run(runs, project):
    """The same with filesystem.read: the file is under the read limit, its JSON spelling is not."""
    write(project / "notes" / "noisy.txt", "\x01" * 900_000)
    kiwi_directive(project, "reader", '<read resource="filesystem" path="notes/**"/>')
    run_id = await agent_run(runs, "reader")
    read = await runs.call_tool_waiting(
        run_id, "filesystem.read", {"path": "notes/noisy.txt"}, client_name="agent", wait_seconds=10
    )
    # Exact and within the limit as base64.
    assert read.status == "ok" and read.result["encoding"] == "base64", read.status
    assert base64.b64decode(read.result["content"]) == b"\x01" * 900_000
    assert (await runs.status(run_id)).status == "awaiting_agent"
    await runs.cancel(run_id)


async def test_attack_a_tool_whose_answer_passes_the_payload_limit_runs_again_and_again(runs, project):
    """A local tool's raw (non-JSON) output is its answer. Under the 1 MB output cap, control characters
    spelled as JSON passed Temporal's 2 MB limit: the activity's completion was refused, taken for a
    retryable failure, and the tool ran again, up to five times (a mutating tool's effect five times)."""
    tool = project / ".ai" / "tools" / "ops" / "noisy"
    write(
        tool / "tool.yaml",
        "tool_id: noisy\ntool_type: bash\nversion: '1.0.0'\ncategory: ops\ndescription: Prints noise\n"
        "executor:\n  entrypoint: run.sh\nmutates_state: true\n",
    )
    write(tool / "run.sh", "echo ran >> notes/ran.txt\nhead -c 900000 /dev/zero | tr '\\0' '\\001'\n")
    (project / "notes").mkdir(exist_ok=True)
    kiwi_directive(project, "noisy_run", '<execute resource="tool" id="noisy"/>')
    run_id = await agent_run(runs, "noisy_run")
    called = await runs.call_tool(run_id, "noisy", {})
    assert (project / "notes" / "ran.txt").read_text().count("ran") == 1, "the tool ran more than once"
    assert called.status == "error" and called.error_type == "ToolFailed", called.status
    assert "ran once and is not retried" in called.reason
    assert (await runs.status(run_id)).status == "awaiting_agent"
    await runs.cancel(run_id)


async def test_attack_many_steps_of_large_outputs_add_up_past_the_payload_limit(runs, project):
    """Each step's outputs under the per-step limit, their sum over what the hand-over can carry."""
    steps = "".join(f'<step name="s{i}"><action>Step {i}.</action></step>' for i in range(6))
    kiwi_directive(project, "many", '<read resource="filesystem" path="notes/**"/>', steps)
    run_id = await agent_run(runs, "many")
    for i in range(4):
        await runs.complete_step(run_id, f"s{i}", {"text": "y" * 240_000})
    with pytest.raises(KiwiError) as refused:
        await runs.complete_step(run_id, "s4", {"text": "y" * 240_000})
    assert refused.value.type == "InputInvalid" and "a run holds at most" in str(refused.value)
    # Small outputs still pass: the run is never stuck by what its steps already hold.
    await runs.complete_step(run_id, "s4", {"text": "done"})

    async def on_s5():
        view = (await runs.status(run_id)).current_step
        return view if view is not None and view.name == "s5" else None

    await wait_for(on_s5, what="the run to reach s5")
    await runs.cancel(run_id)
