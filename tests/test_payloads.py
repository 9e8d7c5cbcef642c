"""The payload store (kiwi/payloads.py): payloads of 256 KB and more travel between Kiwi processes as
references to content-addressed files, so a run's tasks, history and update echoes stay small. Tested on
real files and against the real stack (a Temporal dev server, a real MCP server, a real project), the
attacks first: a stored payload changed on disk, a reference naming a path."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.converter import StorageDriverClaim, StorageDriverRetrieveContext, StorageDriverStoreContext

from kiwi.converter import data_converter
from kiwi.errors import KiwiError
from kiwi.payloads import THRESHOLD_BYTES, FilePayloadStore, PayloadStoreError, external_storage, store_folder
from tests.test_batches import _admitted
from tests.test_mcp_servers import text_of
from tests.test_review_attacks_s10 import _ledger_run, _lines, _replays
from workers.main import build_worker


def _payload(text: str) -> Payload:
    return data_converter.payload_converter.to_payload({"text": text})


async def _store(store: FilePayloadStore, *payloads: Payload) -> list[StorageDriverClaim]:
    return await store.store(StorageDriverStoreContext(), list(payloads))


async def _read(store: FilePayloadStore, *claims: StorageDriverClaim) -> list[Payload]:
    return await store.retrieve(StorageDriverRetrieveContext(), list(claims))


async def test_a_payload_comes_back_as_stored_from_an_owner_only_file_named_by_its_hash(tmp_path):
    store = FilePayloadStore(tmp_path / "payloads")
    first, second = _payload("a" * 1000), _payload("b" * 1000)
    claims = await _store(store, first, second, first)
    assert [c.claim_data["sha256"] for c in claims][0] == claims[2].claim_data["sha256"]  # stored once
    assert await _read(store, *claims) == [first, second, first]
    files = sorted(p for p in (tmp_path / "payloads").rglob("*") if p.is_file())
    assert [f.name for f in files] == sorted({c.claim_data["sha256"] for c in claims})
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert stat.S_IMODE((tmp_path / "payloads").stat().st_mode) == 0o700


async def test_a_payload_changed_on_disk_is_refused_and_rewritten_when_stored_again(tmp_path):
    store = FilePayloadStore(tmp_path / "payloads")
    original = _payload("honest arguments")
    (claim,) = await _store(store, original)
    path = tmp_path / "payloads" / claim.claim_data["sha256"][:2] / claim.claim_data["sha256"]
    path.write_bytes(_payload("swapped arguments").SerializeToString())
    with pytest.raises(PayloadStoreError, match="changed on disk"):
        await _read(store, claim)
    # Whoever stores the same payload again puts the true bytes back.
    await _store(store, original)
    assert await _read(store, claim) == [original]


@pytest.mark.parametrize(
    "digest", ["../../../etc/passwd", "/etc/passwd", "ab/../../x", "A" * 64, "0" * 63, ""]
)
async def test_a_reference_that_names_a_path_or_no_digest_reads_nothing(tmp_path, digest):
    outside = tmp_path / "secret.txt"
    outside.write_text("not a payload")
    store = FilePayloadStore(tmp_path / "payloads")
    with pytest.raises(PayloadStoreError, match="names no stored payload"):
        await _read(store, StorageDriverClaim({"sha256": digest}))


async def test_a_payload_missing_from_the_store_names_the_setting_every_process_must_share(tmp_path):
    store = FilePayloadStore(tmp_path / "payloads")
    with pytest.raises(PayloadStoreError) as caught:
        await _read(store, StorageDriverClaim({"sha256": "0" * 64}))
    assert "not in the payload store" in caught.value.message
    assert "KIWI_PAYLOAD_STORE" in caught.value.hint


def test_the_store_is_kiwi_home_by_default_the_variable_when_set_and_none_when_off(tmp_path, monkeypatch):
    monkeypatch.delenv("KIWI_PAYLOAD_STORE", raising=False)
    assert store_folder() == Path(os.environ["KIWI_HOME"]) / "payloads"
    monkeypatch.setenv("KIWI_PAYLOAD_STORE", str(tmp_path / "shared"))
    assert store_folder() == tmp_path / "shared"
    assert external_storage().payload_size_threshold == THRESHOLD_BYTES
    monkeypatch.setenv("KIWI_PAYLOAD_STORE", "off")
    assert store_folder() is None and external_storage() is None


async def test_the_data_converter_sends_large_payloads_as_references_and_small_ones_inline():
    small, large = "s" * 1000, "l" * (THRESHOLD_BYTES + 1)
    payloads = await data_converter.encode([small, large])
    assert payloads[0].ByteSize() > 1000 and b"sss" in payloads[0].data
    assert payloads[1].ByteSize() < 1000 and b"lll" not in payloads[1].SerializeToString()
    assert await data_converter.decode(payloads, [str, str]) == [small, large]


async def _events(runs, run_id: str, kind: str) -> list:
    return [e async for e in runs.handle(run_id).fetch_history_events() if e.HasField(kind)]


async def test_a_large_call_travels_as_a_reference_and_a_swapped_payload_file_never_runs(
    temporal_env, project, tmp_path
):
    """Attack: someone with write access to the payload store replaces the file of a call's arguments while
    the call waits for the run (admitted, no worker yet). The worker refuses the changed payload (its
    workflow task fails, naming it) and the server never sees the swapped arguments; once the true file is
    back, the call runs with the arguments the agent sent. The run's history holds a reference, not them."""
    runs, run_id, queue, ledger = await _ledger_run(temporal_env, project, tmp_path)
    folder = store_folder()
    before = set(folder.rglob("*")) if folder.exists() else set()
    (task,) = await _admitted(runs, run_id, [("ledger.length", {"tag": "t" * 400_000})])
    (stored,) = [p for p in set(folder.rglob("*")) - before if p.is_file()]
    true_bytes = stored.read_bytes()
    swapped = Payload.FromString(true_bytes)
    swapped.data = swapped.data.replace(b"t" * 400_000, b"u" * 400_000)
    stored.write_bytes(swapped.SerializeToString())

    async with build_worker(temporal_env.client, queue, sandboxed=True):
        async with asyncio.timeout(60):
            async for event in runs.handle(run_id).fetch_history_events(wait_new_event=True):
                if event.HasField("workflow_task_failed_event_attributes"):
                    message = event.workflow_task_failed_event_attributes.failure.message
                    break
        assert "changed on disk" in message, message
        assert _lines(ledger) == [] and not task.done()
        stored.write_bytes(true_bytes)
        result = await asyncio.wait_for(task, 90)
    assert text_of(result.result) == "400000 characters"
    assert _lines(ledger) == ["length 400000"]
    accepted = [
        e.workflow_execution_update_accepted_event_attributes.accepted_request
        for e in await _events(runs, run_id, "workflow_execution_update_accepted_event_attributes")
    ]
    (call,) = [r for r in accepted if r.input.name == "call_tool"]
    assert call.input.args.ByteSize() < 2000  # the reference, not the 400 KB
    await _replays(runs, run_id)


async def test_status_of_a_run_its_worker_cannot_go_on_with_says_why(temporal_env, project, tmp_path):
    """Found by the s19 README trial: a run whose workflow task fails (a payload changed on disk, a store
    the worker does not see) showed only "Workflow Task in failed state"; the reason was in the worker's
    log alone. `kiwi status` now says it, from the run's history."""
    runs, run_id, queue, _ = await _ledger_run(temporal_env, project, tmp_path)
    folder = store_folder()
    before = set(folder.rglob("*")) if folder.exists() else set()
    (task,) = await _admitted(runs, run_id, [("ledger.length", {"tag": "s" * 400_000})])
    (stored,) = [p for p in set(folder.rglob("*")) - before if p.is_file()]
    stored.write_bytes(b"not the payload")
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        async with asyncio.timeout(60):
            async for event in runs.handle(run_id).fetch_history_events(wait_new_event=True):
                if event.HasField("workflow_task_failed_event_attributes"):
                    break
        with pytest.raises(KiwiError, match="cannot take its next step: its worker fails it: payload .*"):
            await runs.status(run_id)
    task.cancel()
    await runs.handle(run_id).terminate("test over")


def _echo_input_runs(temporal_env, project):
    """A RunClient on a queue of its own, for a project whose directive echo_input takes one text input."""
    from tests.helpers import directive_md, run_client, write_directive

    write_directive(
        project / ".ai" / "directives" / "echo_input.md",
        directive_md(
            '<step name="work"><action>Read {input:text}.</action></step>',
            name="echo_input",
            permissions="",
            inputs='<input name="text" type="string" required="true"/>',
        ),
    )
    return run_client(temporal_env.client, project)


async def test_a_run_started_with_a_large_input_holds_a_reference_in_its_history(temporal_env, project):
    """A directive input of 300 KB: the run's start event carries a reference, and the run reads the input
    (its status shows it) from the store."""
    runs = _echo_input_runs(temporal_env, project)
    text = "v" * 300_000
    async with build_worker(temporal_env.client, runs.task_queue, sandboxed=True):
        run_id = await runs.start("echo_input", {"text": text})
        await runs.first_task_done(run_id)
        assert (await runs.status(run_id)).inputs == {"text": text}
    (started,) = await _events(runs, run_id, "workflow_execution_started_event_attributes")
    assert started.workflow_execution_started_event_attributes.input.ByteSize() < 2000
    await runs.cancel(run_id)


async def test_prune_removes_only_old_payloads_no_run_refers_to(temporal_env, project, capsys):
    """A run started with a 300 KB input refers to its stored payloads; another payload (a call that never
    reached a run) is referred to by nothing. Both are made three days old: `kiwi payloads prune
    --older-than 1` removes the orphan alone (a dry run first removes nothing), and the run still reads
    its input."""
    from kiwi.cli import main as kiwi_main

    runs = _echo_input_runs(temporal_env, project)
    text = "p" * 300_000
    run_id = await runs.start("echo_input", {"text": text})
    folder = store_folder()
    in_use = [p for p in folder.rglob("*") if p.is_file()]
    assert in_use
    (orphan_claim,) = await _store(FilePayloadStore(), _payload("o" * 300_000))
    orphan = folder / orphan_claim.claim_data["sha256"][:2] / orphan_claim.claim_data["sha256"]
    three_days_ago = time.time() - 3 * 86400
    for path in (*in_use, orphan):
        os.utime(path, (three_days_ago, three_days_ago))
    where = ["--address", temporal_env.client.service_client.config.target_host]
    where += ["--namespace", temporal_env.client.namespace]

    async def prune(*extra: str) -> dict:
        capsys.readouterr()
        code = await asyncio.to_thread(kiwi_main, ["payloads", "prune", "--older-than", "1", *where, *extra])
        assert code == 0
        return json.loads(capsys.readouterr().out)

    dry = await prune("--dry-run", "--json")
    assert dry["removed"] == [orphan.name] and dry["dry_run"] and orphan.exists()
    done = await prune("--json")
    assert done["removed"] == [orphan.name] and done["kept_in_use"] == len(in_use) and done["runs_read"] >= 1
    assert not orphan.exists() and all(p.exists() for p in in_use)
    async with build_worker(temporal_env.client, runs.task_queue, sandboxed=True):
        await runs.first_task_done(run_id)
        assert (await runs.status(run_id)).inputs == {"text": text}
    await runs.cancel(run_id)


def test_prune_refuses_an_age_under_an_hour(capsys):
    from kiwi.cli import main as kiwi_main

    assert kiwi_main(["payloads", "prune", "--older-than", "0.01", "--address", "127.0.0.1:1"]) == 1
    assert "at least 1 hour" in capsys.readouterr().err


async def test_ten_calls_just_under_the_threshold_from_ten_clients_do_not_end_the_run(
    temporal_env, project, tmp_path
):
    """Attack on the threshold: payloads under 256 KB stay inline. Ten clients (each a front end of its own,
    so no client-side lock holds them apart) send a call of 250 KB whose answer is 250 KB too, all admitted
    while the worker is away: one task is handed all ten, and its answer would echo every update (2.5 MB)
    besides the answers (2.5 MB). The run's task budget and RunBusy keep each task under 4 MB."""
    from temporalio.client import WorkflowExecutionStatus

    from kiwi.items.store import ItemStore
    from kiwi.runs import RunClient
    from tests.test_review_attacks_s11 import _terminated_reason

    runs, run_id, queue, ledger = await _ledger_run(temporal_env, project, tmp_path)
    tasks = []
    for i in range(10):
        client = RunClient(temporal_env.client, ItemStore(project), task_queue=queue)
        call = ("ledger.big", {"tag": f"{i}" * (250_000 + i), "size": 250_000})
        tasks += await _admitted(client, run_id, [call])
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        done, _ = await asyncio.wait(tasks, timeout=90)
        reason = await _terminated_reason(runs, run_id)
        assert (await runs.handle(run_id).describe()).status == WorkflowExecutionStatus.RUNNING, reason
        assert len(done) == 10, reason
        assert [len(text_of(t.result().result)) >= 250_000 for t in tasks] == [True] * 10
    await _replays(runs, run_id)
