"""Review s12: attacks on the payload store (kiwi/payloads.py) and `kiwi payloads prune`, against the real
stack (a Temporal dev server, a real MCP server, a real project) and real files."""

from __future__ import annotations

import asyncio
import os
import stat
import time
import uuid
from datetime import timedelta

import pytest

from kiwi.converter import data_converter
from kiwi.payloads import MIN_PRUNE_AGE_SECONDS, prune, store_folder
from tests.test_batches import _admitted
from tests.test_mcp_servers import text_of
from tests.test_review_attacks_s10 import _ledger_run, _lines
from workers.main import build_worker


async def test_prune_keeps_the_arguments_of_a_call_admitted_but_not_yet_taken(
    temporal_env, project, tmp_path
):
    """Operator loses data: an agent's 400 KB call is admitted for a run while its worker is away (a
    deploy, an outage) for longer than prune's --older-than. No history shows the call yet (an admitted
    update is in no event), so prune removed its arguments' file, and when the worker came back the run
    could not read the call: every workflow task failed, and the run (every later call too) was stuck."""
    runs, run_id, queue, ledger = await _ledger_run(temporal_env, project, tmp_path)
    folder = store_folder()
    before = set(folder.rglob("*")) if folder.exists() else set()
    (task,) = await _admitted(runs, run_id, [("ledger.length", {"tag": "k" * 400_000})])
    (stored,) = [p for p in set(folder.rglob("*")) - before if p.is_file()]
    # Prune runs two hours later (the least age it takes is one), the worker still away.
    done = await prune(temporal_env.client, MIN_PRUNE_AGE_SECONDS, now=time.time() + 2 * 3600)
    assert stored.name not in done["removed"] and stored.exists(), done
    async with build_worker(temporal_env.client, queue, sandboxed=True):
        result = await asyncio.wait_for(task, 90)
    assert text_of(result.result) == "400000 characters"
    assert _lines(ledger) == ["length 400000"]


async def test_prune_keeps_what_runs_of_another_namespace_refer_to(temporal_env):
    """Operator loses data: every Kiwi process of a user shares one store by default ($KIWI_HOME/payloads),
    whatever namespace its runs are in, but prune read the histories of one namespace: it removed the
    payloads of every run in the others, and those runs could no longer read their inputs."""
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, RegisterNamespaceRequest
    from temporalio.client import Client
    from temporalio.service import RPCError

    from tests.helpers import wait_for

    service = temporal_env.client.workflow_service
    namespace = f"kiwi-s12-{uuid.uuid4().hex[:8]}"
    await service.register_namespace(
        RegisterNamespaceRequest(namespace=namespace, workflow_execution_retention_period=timedelta(days=1))
    )

    async def known() -> bool:
        try:
            await service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
        except RPCError:
            return False
        return True

    await wait_for(known, what="the new namespace")
    other = Client(temporal_env.client.service_client, namespace=namespace, data_converter=data_converter)
    folder = store_folder()
    before = set(folder.rglob("*")) if folder.exists() else set()
    text = "n" * 300_000
    handle = await other.start_workflow(
        "DirectiveRun", text, id=f"s12-{uuid.uuid4().hex[:8]}", task_queue="nobody"
    )
    (stored,) = [p for p in set(folder.rglob("*")) - before if p.is_file()]
    three_days_ago = time.time() - 3 * 86400
    os.utime(stored, (three_days_ago, three_days_ago))

    done = await prune(temporal_env.client, 86400)
    assert stored.name not in done["removed"] and stored.exists(), done
    (started,) = [
        e
        async for e in handle.fetch_history_events()
        if e.HasField("workflow_execution_started_event_attributes")
    ]
    payloads = started.workflow_execution_started_event_attributes.input.payloads
    assert await data_converter.decode(payloads, [str]) == [text]
    await handle.terminate()


async def test_a_pipe_or_link_at_a_payloads_path_is_neither_waited_on_nor_followed(tmp_path):
    """Attack (someone who can write in the store): a named pipe put where a payload's file goes hung every
    reader and every store of that payload for good (a thread blocked opening it: the workflow task timed
    out, again and again), and a symbolic link was read through to whatever it names. A path that is no
    plain file is refused when read and replaced when the payload is stored again."""
    from temporalio.converter import (
        StorageDriverRetrieveContext,
        StorageDriverStoreContext,
    )

    from kiwi.payloads import FilePayloadStore, PayloadStoreError

    store = FilePayloadStore(tmp_path / "payloads")
    payload = data_converter.payload_converter.to_payload({"text": "p" * 1000})
    (claim,) = await store.store(StorageDriverStoreContext(), [payload])
    digest = claim.claim_data["sha256"]
    path = tmp_path / "payloads" / digest[:2] / digest
    outside = tmp_path / "outside"
    outside.write_bytes(path.read_bytes())
    for planted in ("pipe", "link"):
        path.unlink()
        if planted == "pipe":
            os.mkfifo(path)
        else:
            path.symlink_to(outside)
        try:
            async with asyncio.timeout(10):
                with pytest.raises(PayloadStoreError, match="not a file Kiwi wrote"):
                    await store.retrieve(StorageDriverRetrieveContext(), [claim])
                await store.store(StorageDriverStoreContext(), [payload])
        finally:
            if planted == "pipe" and stat.S_ISFIFO(path.lstat().st_mode):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # (frees a thread still waiting)
        assert stat.S_ISREG(path.lstat().st_mode), planted
        assert await store.retrieve(StorageDriverRetrieveContext(), [claim]) == [payload]
