"""Large payloads kept out of Temporal's messages: a content-addressed store every Kiwi process shares.

Temporal hands a run everything admitted for it in one workflow task, and the worker's answer to that task
must stay under gRPC's 4 MB: the updates a task accepts or rejects are echoed back in it, request and all,
and a child run starts with its directive's snapshot as its input. Five agents each sending a 900 KB call
while the worker was away, or six child runs of a large directive started together, made that answer too
large, and Temporal ended the run. Kiwi's data converter therefore writes every payload of 256 KB or more
to this store and sends a reference in its place (Temporal's external storage): the run's history, its
tasks and the echoes carry ~150 bytes a payload, and whoever reads the payload (the worker, the front end,
``kiwi runs``) fetches it from the store.

The store is a folder: one file a payload, named by the SHA-256 of its bytes, written once (a temporary
file renamed into place) with owner-only permissions, and checked against its name whenever it is read: a
file changed or replaced on disk is refused, never handed to a run. Every process that starts runs, calls
them or works on them must see the same folder: on one machine that is the default,
``$KIWI_HOME/payloads`` (see ``kiwi.devserver.data_dir``); across machines, ``KIWI_PAYLOAD_STORE`` names
a folder they share (a volume in ``deploy/``). ``KIWI_PAYLOAD_STORE=off`` keeps every payload inline, as
before (and the 4 MB limit with it).
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.converter import (
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)

from kiwi.devserver import data_dir
from kiwi.errors import KiwiError

# Payloads this large or larger go to the store (Temporal's default threshold).
THRESHOLD_BYTES = 256 * 1024
STORE_VARIABLE = "KIWI_PAYLOAD_STORE"
DRIVER_NAME = "kiwi-files"
_DIGEST = re.compile(r"[0-9a-f]{64}")
# A reference as it sits in a history event: the JSON of Temporal's ExternalStorageReference.
_REFERENCE = re.compile(rb'"sha256"\s*:\s*"([0-9a-f]{64})"')
# The least age `kiwi payloads prune` removes: a payload just stored may belong to a call on its way.
MIN_PRUNE_AGE_SECONDS = 3600


class PayloadStoreError(KiwiError):
    type = "PayloadStoreError"


def store_folder() -> Path | None:
    """Where payloads go: ``KIWI_PAYLOAD_STORE``, else ``<data dir>/payloads``; None when it is ``off``."""
    named = os.environ.get(STORE_VARIABLE, "").strip()
    if named.lower() == "off":
        return None
    if named:
        folder = Path(named).expanduser()
        if not folder.is_absolute():
            # Each process would read it from its own working folder: a worker started in /srv and the CLI
            # run from a project would use two stores, and neither would find the other's payloads.
            raise PayloadStoreError(
                f"{STORE_VARIABLE}={named} is a relative path: every Kiwi process must see the same folder",
                hint=f"give an absolute path (e.g. {STORE_VARIABLE}=$HOME/kiwi-payloads), or off",
            )
        return folder
    return data_dir() / "payloads"


def unwritable(folder: Path) -> str:
    """Why this process cannot keep payloads in ``folder`` ('' when it can): made if missing, and written."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return f"{folder} cannot be written: {exc.strerror or exc}"
    return ""


def check_store() -> None:
    """Refuse a payload store this process cannot use, at start (trial F35: a front end and a worker started
    with one, and the first large call failed, long after): `kiwi worker`, `kiwi mcp` and `kiwi dev`."""
    folder = store_folder()
    problem = unwritable(folder) if folder is not None else ""
    if problem:
        raise PayloadStoreError(
            f"the payload store {problem}",
            hint=f"make it writable for this user, or set {STORE_VARIABLE} to a folder that is (every Kiwi process "
            "must reach the same one; off keeps payloads inline)",
        )


class FilePayloadStore(StorageDriver):
    """Temporal storage driver over a folder of content-addressed files (see the module's docstring).

    The folder is looked up when a payload is first stored or read, not when the converter is built, so a
    process that sets ``KIWI_PAYLOAD_STORE`` before it talks to Temporal is served from that folder.
    """

    def __init__(self, folder: Path | None = None) -> None:
        self._folder = folder

    def name(self) -> str:
        return DRIVER_NAME

    def folder(self) -> Path:
        folder = self._folder or store_folder()
        if folder is None:
            raise PayloadStoreError(
                f"a payload was stored outside Temporal but {STORE_VARIABLE}=off in this process",
                hint=f"give every Kiwi process the same {STORE_VARIABLE} (unset: the default folder)",
            )
        return folder

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        return await asyncio.to_thread(self._store_all, [p.SerializeToString() for p in payloads])

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        return await asyncio.to_thread(self._read_all, [dict(c.claim_data) for c in claims])

    def _store_all(self, blobs: list[bytes]) -> list[StorageDriverClaim]:
        folder = self.folder()
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        claims = []
        for blob in blobs:
            digest = hashlib.sha256(blob).hexdigest()
            path = folder / digest[:2] / digest
            if not (_holds(path, digest) and _renewed(path)):
                path.parent.mkdir(mode=0o700, exist_ok=True)
                # Written whole under a temporary name, then renamed: a reader never sees half a payload.
                fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".incoming-")
                try:
                    with os.fdopen(fd, "wb") as out:
                        out.write(blob)
                        out.flush()
                        os.fsync(out.fileno())
                    os.replace(temporary, path)
                except BaseException:
                    Path(temporary).unlink(missing_ok=True)
                    raise
            claims.append(StorageDriverClaim({"sha256": digest, "size": str(len(blob))}))
        return claims

    def _read_all(self, claims: list[dict[str, str]]) -> list[Payload]:
        folder = self.folder()
        payloads = []
        for claim in claims:
            digest = claim.get("sha256", "")
            if not _DIGEST.fullmatch(digest):
                raise PayloadStoreError(f"a payload reference names no stored payload ({digest[:80]!r})")
            path = folder / digest[:2] / digest
            try:
                blob = _read_regular(path)
            except NotRegular:
                raise PayloadStoreError(
                    f"payload {digest[:16]}… in {folder} is not a file Kiwi wrote (a link, a pipe, a folder); "
                    "refusing it",
                    hint="the store's files are written once: restore the file or the run cannot go on",
                ) from None
            except FileNotFoundError:
                raise PayloadStoreError(
                    f"payload {digest[:16]}… is not in the payload store {folder}",
                    hint=f"every Kiwi process (worker, front end, CLI) needs the same {STORE_VARIABLE}",
                ) from None
            if hashlib.sha256(blob).hexdigest() != digest:
                raise PayloadStoreError(
                    f"payload {digest[:16]}… in {folder} was changed on disk; refusing it",
                    hint="the store's files are written once: restore the file or the run cannot go on",
                )
            payloads.append(Payload.FromString(blob))
        return payloads


def _renewed(path: Path) -> bool:
    """Stored again now: `kiwi payloads prune` goes by when a payload was last stored. False when the file
    went (prune took it between the check and now): then it is written again."""
    try:
        os.utime(path)
    except FileNotFoundError:
        return False
    return True


class NotRegular(OSError):
    """A store path that is no plain file (a symbolic link, a pipe, a folder): never read through."""


def _read_regular(path: Path) -> bytes:
    """The bytes of a plain file, never following a link or waiting on a pipe someone put in its place."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # (O_NOFOLLOW met a symbolic link)
            raise NotRegular(str(path)) from None
        raise
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(str(path))
        return file.read()


def _holds(path: Path, digest: str) -> bool:
    """The file is there, plain and whole (a crash between write and rename leaves only a temporary
    file; anything else there is replaced by the rename)."""
    try:
        return hashlib.sha256(_read_regular(path)).hexdigest() == digest
    except OSError:
        return False


def external_storage() -> ExternalStorage | None:
    """The data converter's external storage, or None when ``KIWI_PAYLOAD_STORE=off``."""
    if os.environ.get(STORE_VARIABLE, "").strip().lower() == "off":
        return None
    return ExternalStorage(drivers=[FilePayloadStore()], payload_size_threshold=THRESHOLD_BYTES)


def check_prune_age(older_than_seconds: float) -> None:
    if older_than_seconds < MIN_PRUNE_AGE_SECONDS:
        raise PayloadStoreError(
            f"--older-than must be at least {MIN_PRUNE_AGE_SECONDS // 3600} hour",
            hint="a payload stored in the last hour may belong to a call on its way to a run",
        )


async def prune(
    client: Client,
    older_than_seconds: float,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    now: float | None = None,
) -> dict[str, object]:
    """Remove the store's payloads that no run Temporal still holds refers to and that nobody stored in
    the last ``older_than_seconds``.

    Every execution of every namespace of the server is read (open ones and closed ones within their
    retention; the store is shared by the user's processes whatever namespace their runs are in: the
    client's namespace alone when the server will not list them), and every
    reference in its history keeps its file. The age covers what no history shows yet: a call admitted for
    a run but not yet taken, a run just started (each store of a payload renews its file's time). A call
    admitted while the run's worker is away waits longer than any age: while an open run has a workflow
    task nobody took, everything stored since ``older_than_seconds`` before it was first scheduled stays.
    """
    check_prune_age(older_than_seconds)
    folder = store_folder()
    if folder is None:
        raise PayloadStoreError(f"{STORE_VARIABLE}=off: there is no payload store to prune")
    # (A test runs prune as if later: the server's clock, the task times, cannot be set back.)
    now = time.time() if now is None else now
    cutoff = now - older_than_seconds
    candidates = {}
    for path in folder.glob("??/*") if folder.is_dir() else []:
        with_time = path.lstat()
        if with_time.st_mtime < cutoff and (
            _DIGEST.fullmatch(path.name) or path.name.startswith((".incoming-", ".pruning-"))
        ):
            candidates[path.name] = path
    referenced: set[str] = set()
    runs = 0
    # A call admitted for a run is in no event until a worker takes the run's workflow task: while a run has
    # a task nobody took (its worker away), whatever was stored since that task's first scheduling (less
    # the age, for a call on its way then) may be such a call's payload, however old the age says it is.
    untaken_since = now
    namespaces = await _namespaces(client)
    async for there, execution in _every_execution(client, namespaces):
        handle = there.get_workflow_handle(execution.id, run_id=execution.run_id)
        if execution.status == WorkflowExecutionStatus.RUNNING:
            pending = (await handle.describe()).raw_description.pending_workflow_task
            first = (
                "original_scheduled_time" if pending.HasField("original_scheduled_time") else "scheduled_time"
            )
            scheduled = getattr(pending, first)
            if scheduled.seconds:
                untaken_since = min(untaken_since, scheduled.seconds + scheduled.nanos / 1e9)
        history = await handle.fetch_history()
        for event in history.events:
            referenced.update(references_in(event))
        runs += 1
        if progress is not None and runs % 500 == 0:
            progress(runs)
    cutoff = min(cutoff, untaken_since - older_than_seconds)
    removed, freed = [], 0
    for name, path in sorted(candidates.items()):
        if name in referenced:
            continue
        try:
            if dry_run:
                if path.lstat().st_mtime >= cutoff:
                    continue  # stored again while we read the histories
                size = path.lstat().st_size
            else:
                # Moved aside first, then its time read: a store that renewed the file before the move is
                # seen (and the file put back), one after it finds no file and writes it again.
                aside = path.with_name(f".pruning-{name}")
                os.replace(path, aside)
                seen = aside.lstat()
                if seen.st_mtime >= cutoff:
                    os.replace(aside, path)
                    continue  # stored again while we read the histories
                size = seen.st_size
                aside.unlink()
        except FileNotFoundError:
            continue
        removed.append(name)
        freed += size
    return {
        "store": str(folder),
        "namespaces": namespaces,
        "runs_read": runs,
        "removed": removed,
        "bytes_freed": freed,
        "kept_in_use": len(candidates) - len(removed),
        "dry_run": dry_run,
    }


def references_in(message: Message) -> set[str]:
    """The digests of the store's payloads ``message`` (a history event) refers to: read from the payloads
    Temporal marks as external-storage references only. A digest in a payload's own data (an agent's
    arguments holding ``"sha256": "<hex>"``) is no reference: it would keep a payload nobody refers to."""
    if b"sha256" not in message.SerializeToString():
        return set()  # (most events: no reference, and no walk over their fields)
    found: set[str] = set()
    for payload in _payloads(message):
        metadata = payload.metadata
        encoding = metadata.get("encoding", b"")
        if (
            encoding == b"json/external-storage-reference"
            or metadata.get("__temporal_external_storage_reference") == b"true"
            or (encoding == b"json/protobuf" and metadata.get("messageType") == _REFERENCE_TYPE)
        ):
            found.update(d.decode() for d in _REFERENCE.findall(payload.data))
    return found


_REFERENCE_TYPE = b"temporal.api.sdk.v1.ExternalStorageReference"


def _payloads(message: Message) -> Iterator[Payload]:
    """Every Payload message inside ``message``, however deep (lists and maps included)."""
    if isinstance(message, Payload):
        yield message
        return
    for field, value in message.ListFields():
        if field.type != field.TYPE_MESSAGE:
            continue
        if field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].type == field.TYPE_MESSAGE:
                for item in value.values():
                    yield from _payloads(item)
        elif isinstance(value, Message):
            yield from _payloads(value)
        else:  # (a repeated field)
            for item in value:
                yield from _payloads(item)


async def _namespaces(client: Client) -> list[str]:
    """Every namespace of the server (the client's alone when it will not say)."""
    from temporalio.api.workflowservice.v1 import ListNamespacesRequest
    from temporalio.service import RPCError

    names: list[str] = []
    token = b""
    try:
        while True:
            page = await client.workflow_service.list_namespaces(
                ListNamespacesRequest(page_size=100, next_page_token=token)
            )
            names += [n.namespace_info.name for n in page.namespaces]
            token = page.next_page_token
            if not token:
                break
    except RPCError:
        return [client.namespace]
    return sorted(set(names) | {client.namespace})


async def _every_execution(client: Client, namespaces: list[str]):
    for namespace in namespaces:
        there = (
            client
            if namespace == client.namespace
            else Client(client.service_client, namespace=namespace, data_converter=client.data_converter)
        )
        async for execution in there.list_workflows(""):
            yield there, execution
