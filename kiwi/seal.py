"""Seals: what a Kiwi worker runs must come from Kiwi, not from whoever reaches Temporal.

A run's input (its grants, local tools, approvers, project folder) is worked out by the client that
starts it, and its activities run whatever the workflow task that scheduled them says. Without seals,
whoever can start a workflow on Kiwi's task queue (on ``kiwi dev``: every local user, over loopback
gRPC), or can poll that queue with a worker of their own, runs code as the worker's user with grants
of their choosing.

Every Kiwi process that starts runs or runs them holds one secret, the seal key (``KIWI_SEAL_KEY``, 64
hex digits, shared by every front end and worker of a deployment; else ``$KIWI_HOME/seal.key``, made
owner-only on first use). Each request that makes a worker act carries a header, an HMAC over what it
asks for, and the worker checks it before acting:

- a run's start (``kiwi run``, the front end's sessions, a child run, continue-as-new): over the
  workflow type, its id and its input; checked before the run's first step;
- a call into a run (the ``call_tool``, ``complete_step`` and ``tool_context`` updates): over the run,
  the update's name and id and its arguments; checked by the update's validator, so a refused call
  leaves no trace in the run;
- an activity: over the run (id and execution), the activity's name and its arguments; checked before
  the activity runs. Local activities run inside the worker that ran the workflow task, so they need none;
- an activity's result: over the run, the activity's id and name, and the result's payload (its metadata
  ``kiwi-result-seal``); checked by the run before the result is decoded, in runs that met the patch
  ``RESULTS_SEALED``. Whoever reaches Temporal can complete an activity by its id with a result of their
  making; a run that gets one fails (``NotSealed``) rather than act on it. An activity's failure carries a
  seal too (its last detail, over its type, message and retry); one without is taken as a failure whose
  words are not shown (the agent would read them).

A start's check runs when the run's first workflow task is new, by the workflow's own ``__init__`` on its
input as it came (signals and calls in that task change the run's state before anything else could look),
and a refused run records a marker (``kiwi-not-sealed``) so that it replays as refused. A call's check runs
in the validator (a refused call leaves no trace) and again where the call would act, in replay too, in a
run whose own start is sealed: whoever can poll Kiwi's task queue can answer a workflow task and accept an
update no validator saw. Runs older than seals, or whose seal no longer verifies (a new key), replay their
calls as they ran.

What seals stop is a Temporal client without the key. They do not stop someone who works at Temporal's
protocol level: a poller of their own answering a forged run's first workflow task, a running activity made to
run again (a retryable failure by its id, a reset of the activity), a reset, a start copied from history; nor
code a run starts as the worker's user reading the key file (``$KIWI_HOME/seal.key``: set ``KIWI_SEAL_KEY``
instead). Commands, local tools and MCP servers get an allow-listed environment without the key, and a process
holding it is not dumpable (Linux), so they cannot read it from ``/proc/<worker>/environ`` or the worker's
memory. Signals (a human's decision carries its own Ed25519 signature), queries and history are not sealed.
README, Security: "What seals stop, and what they do not"; Temporal's own access control (mTLS, API keys) is
the boundary.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import hmac
import json
import os
import re
import stat
import sys
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import temporalio.client
import temporalio.worker
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.converter import PayloadConverter
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

from kiwi.errors import Failure, KiwiError

KEY_VARIABLE = "KIWI_SEAL_KEY"
# More keys seals are checked against (never made with), while the key changes: comma-separated.
ACCEPTED_VARIABLE = "KIWI_SEAL_KEYS_ACCEPTED"
KEY_FILE = "seal.key"
HEADER = "kiwi-seal"
# The metadata a sealed activity result carries (on the result's payload, which travels in history as is).
RESULT = "kiwi-result-seal"
# The detail a sealed activity failure carries (the last of its details).
FAILURE_SEAL = "kiwi-failure-seal"
# The marker a refused start records, so that it replays as refused (queries, `kiwi status`).
NOT_SEALED = "kiwi-not-sealed"
# Activities scheduled before seals existed carry none: one a worker of the older code scheduled and a new
# worker picks up (a retry after an upgrade) runs as it would have. When it was scheduled is Temporal's
# record (the first attempt's time), not something the request says, so no new request passes as one.
SEALS_SINCE = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
# Updates that act on a run (a call, a step's end) or read its tools; each has a validator that checks the seal.
SEALED_UPDATES = frozenset({"call_tool", "complete_step", "tool_context"})


class NotSealed(Failure):
    """A start, call or activity without a valid seal: it came from outside Kiwi, or from a Kiwi process
    holding another seal key."""


def _converter() -> PayloadConverter:
    from kiwi.converter import KiwiPayloadConverter

    return KiwiPayloadConverter()


def payloads_of(args: Sequence[Any], converter: PayloadConverter | None = None) -> list[Payload]:
    """Arguments as the payloads Kiwi's converter writes (those already payloads, as they are)."""
    # (A dynamic activity's arguments come as one list of the payloads themselves.)
    if (
        len(args) == 1
        and isinstance(args[0], list | tuple)
        and args[0]
        and all(isinstance(a, RawValue) for a in args[0])
    ):
        return [a.payload for a in args[0]]
    if all(isinstance(a, RawValue) for a in args):
        return [a.payload for a in args]
    convert = converter or _converter()
    return [a.payload if isinstance(a, RawValue) else convert.to_payload(a) for a in args]


def digest(args: Sequence[Any], converter: PayloadConverter | None = None) -> bytes:
    """What a seal covers of a request's arguments: their payloads as Kiwi's converter writes them."""
    h = hashlib.sha256()
    for payload in payloads_of(args, converter):
        h.update(len(payload.data).to_bytes(8, "big"))
        h.update(payload.data)
    return h.digest()


def frozen(args: Sequence[Any], converter: PayloadConverter | None = None) -> list[RawValue]:
    """``args`` converted now, as the payloads that will be sent: what is sealed is what goes, even if an
    argument (a run's state) changes before the SDK would have converted it."""
    return [RawValue(p) for p in payloads_of(args, converter)]


def message(kind: str, *names: str, args: Sequence[Any], converter: PayloadConverter | None = None) -> bytes:
    """What the seal of one request covers: ``kind`` (start, update, activity), the names it is for, its
    arguments."""
    return "\0".join((kind, *names)).encode() + b"\0" + digest(args, converter)


def mac(
    key: bytes, kind: str, *names: str, args: Sequence[Any], converter: PayloadConverter | None = None
) -> bytes:
    """The seal of one request (see :func:`message`)."""
    return hmac.new(key, message(kind, *names, args=args, converter=converter), hashlib.sha256).digest()


def _header(value: bytes) -> Payload:
    return Payload(metadata={"encoding": b"binary/plain"}, data=value)


def _sealed(headers: Mapping[str, Payload], keys: Sequence[bytes], covered: bytes) -> bool:
    """Whether ``headers`` carry the seal of ``covered`` (a :func:`message`) by one of ``keys``."""
    payload = headers.get(HEADER)
    return payload is not None and any(
        hmac.compare_digest(payload.data, hmac.new(key, covered, hashlib.sha256).digest()) for key in keys
    )


# ---------------------------------------------------------------------------------------------- the key

_KEYS: dict[tuple[str, str], bytes] = {}


def key_path() -> Path:
    from kiwi.devserver import data_dir

    return data_dir() / KEY_FILE


def seal_key() -> bytes:
    """This process's seal key: ``KIWI_SEAL_KEY``, else ``$KIWI_HOME/seal.key`` (made on first use)."""
    text = _variable(KEY_VARIABLE).strip()
    path = "" if text else str(key_path())
    if (text, path) not in _KEYS:
        _KEYS[(text, path)] = _from_text(text) if text else _from_file(Path(path))
        _undumpable()
    return _KEYS[(text, path)]


# The key variables while :func:`keys_hidden` keeps them out of the environment (this process still uses them).
_HIDDEN: dict[str, str] = {}


def _variable(name: str) -> str:
    return os.environ.get(name) or _HIDDEN.get(name, "")


def without_keys(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the seal key variables: for a server Kiwi starts that is not Kiwi (Temporal's dev
    server), whose environment other processes of the user can read (review s21 R3)."""
    return {k: v for k, v in env.items() if k not in (KEY_VARIABLE, ACCEPTED_VARIABLE)}


@contextlib.contextmanager
def keys_hidden() -> Any:
    """The seal key variables out of this process's environment while a server that takes it whole starts
    (the embedded PostgreSQL: its processes' environments are readable by the user's other processes, and
    the tools a run starts are such processes; review s21 R3). This process goes on reading them here."""
    held = {name: os.environ[name] for name in (KEY_VARIABLE, ACCEPTED_VARIABLE) if name in os.environ}
    _HIDDEN.update(held)
    for name in held:
        del os.environ[name]
    try:
        yield
    finally:
        for name, value in held.items():
            os.environ.setdefault(name, value)
            _HIDDEN.pop(name, None)


def guard() -> None:
    """At a Kiwi command's start: a process with the key in its environment is not dumpable from the start
    (the key sits in ``/proc/<pid>/environ`` from the first instruction; review s21 R7)."""
    if os.environ.get(KEY_VARIABLE) or os.environ.get(ACCEPTED_VARIABLE):
        _undumpable()


def _undumpable() -> None:
    """Linux: no other process of this user may read this one's memory or environment, where the key now
    is (``/proc/<pid>/environ``, ``/proc/<pid>/mem``, ptrace): the commands, local tools and MCP servers a
    worker starts run as its user (review s20 F6). Core dumps go with it."""
    if sys.platform != "linux":
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0


def accepted_keys() -> tuple[bytes, ...]:
    """The keys of ``KIWI_SEAL_KEYS_ACCEPTED`` (comma-separated): seals made with them pass too, while the
    key changes (the new one before every process seals with it, the old one after; README: "Changing the
    key")."""
    text = _variable(ACCEPTED_VARIABLE)
    return tuple(_from_text(part.strip(), ACCEPTED_VARIABLE) for part in text.split(",") if part.strip())


def _from_text(text: str, variable: str = KEY_VARIABLE) -> bytes:
    if not re.fullmatch(r"[0-9a-fA-F]{64}", text):
        raise KiwiError(
            f"{variable} must be 64 hex digits (a 32-byte key)"
            + (", commas between keys" if variable == ACCEPTED_VARIABLE else ""),
            hint=f"make one with `openssl rand -hex 32` and give every front end and worker the same {KEY_VARIABLE}",
        )
    return bytes.fromhex(text)


def _from_file(path: Path) -> bytes:
    # (The folder as any Kiwi process makes it: the file alone is owner-only. $KIWI_HOME holds the local
    # registry's PostgreSQL, which runs as a user of its own when Kiwi runs as root.)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        # Written whole under another name, then linked into place: processes starting together (a
        # shared volume) all read the one key that won, never a half-written file.
        draft = path.with_name(f".{KEY_FILE}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(os.urandom(32).hex() + "\n")
                out.flush()
                os.fsync(out.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(draft, path)
        finally:
            draft.unlink()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise KiwiError(f"cannot read the seal key {path}: {exc.strerror}", hint=_file_hint(path)) from exc
    with os.fdopen(fd) as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise KiwiError(
                f"the seal key {path} must be a file of yours that no one else can read",
                hint=f"chmod 600 {path} (or remove it: the next Kiwi process makes a new one)",
            )
        text = file.read().strip()
    try:
        return _from_text(text)
    except KiwiError as exc:
        raise KiwiError(f"the seal key {path} is not 64 hex digits", hint=_file_hint(path)) from exc


def _file_hint(path: Path) -> str:
    return f"remove {path} and start Kiwi again (it makes a new one), or set {KEY_VARIABLE}"


# ------------------------------------------------------------------------------------- client side


def seal_interceptors() -> list[SealInterceptor]:
    """The interceptors a Temporal client made outside :func:`kiwi.connect.connect` needs to start runs."""
    return [SealInterceptor()]


class SealInterceptor(temporalio.client.Interceptor, temporalio.worker.Interceptor):
    """Seals what a Kiwi client asks of a worker, and checks seals in a Kiwi worker (see the module)."""

    def __init__(self, key: bytes | None = None, accepted: Sequence[bytes] | None = None) -> None:
        self._key = key
        self._accepted = None if accepted is None else tuple(accepted)
        if key is not None or accepted:
            # A key given here is in this process's memory as one read from the environment is (review s21
            # R9: only a key this module read made the process undumpable).
            _undumpable()

    @property
    def key(self) -> bytes:
        """The key given, else this process's (:func:`seal_key`), read when first needed: a client that only
        reads runs works without one, and a worker reads it before it polls (``workers.main``)."""
        if self._key is None:
            self._key = seal_key()
        return self._key

    @property
    def keys(self) -> tuple[bytes, ...]:
        """The keys a seal is checked against: :attr:`key`, then the accepted ones given, else those of
        ``KIWI_SEAL_KEYS_ACCEPTED``. Seals are made with :attr:`key` alone."""
        if self._accepted is None:
            self._accepted = accepted_keys()
        return (self.key, *(k for k in self._accepted if k != self.key))

    def intercept_client(
        self, next: temporalio.client.OutboundInterceptor
    ) -> temporalio.client.OutboundInterceptor:
        return _ClientOutbound(next, self)

    def intercept_activity(
        self, next: temporalio.worker.ActivityInboundInterceptor
    ) -> temporalio.worker.ActivityInboundInterceptor:
        return _ActivityInbound(next, self.keys)

    def workflow_interceptor_class(
        self, input: temporalio.worker.WorkflowInterceptorClassInput
    ) -> type[temporalio.worker.WorkflowInboundInterceptor]:
        keys = self.keys
        input.unsafe_extern_functions[EXTERN] = lambda: keys  # (for start_sealed, in the workflow's __init__)
        return type("SealedWorkflowInbound", (_WorkflowInbound,), {"keys": keys})


class _ClientOutbound(temporalio.client.OutboundInterceptor):
    def __init__(self, next: temporalio.client.OutboundInterceptor, seals: SealInterceptor) -> None:
        super().__init__(next)
        self.seals = seals

    def _seal(self, input: Any, kind: str, *names: str) -> None:
        input.args = frozen(input.args)
        input.headers = {**input.headers, HEADER: _header(mac(self.seals.key, kind, *names, args=input.args))}

    async def start_workflow(self, input: temporalio.client.StartWorkflowInput) -> Any:
        self._seal(input, "start", input.workflow, input.id)
        return await super().start_workflow(input)

    async def start_workflow_update(self, input: temporalio.client.StartWorkflowUpdateInput) -> Any:
        input.update_id = input.update_id or str(uuid.uuid4())
        self._seal(input, "update", input.id, input.update, input.update_id)
        return await super().start_workflow_update(input)

    async def start_update_with_start_workflow(
        self, input: temporalio.client.StartWorkflowUpdateWithStartInput
    ) -> Any:
        start, update = input.start_workflow_input, input.update_workflow_input
        self._seal(start, "start", start.workflow, start.id)
        update.update_id = update.update_id or str(uuid.uuid4())
        self._seal(update, "update", start.id, update.update, update.update_id)
        return await super().start_update_with_start_workflow(input)


# ------------------------------------------------------------------------------------- worker side

EXTERN = "kiwi_seal_key"


def start_sealed(args: Sequence[Any]) -> bool:
    """Whether this run's start carries its seal; called by the workflow's ``__init__``, on its input as it
    came (pure: the same answer in every replay with the same key; a worker without seals says no)."""
    keys = workflow.extern_functions().get(EXTERN)
    if keys is None:
        return False
    info = workflow.info()
    covered = message(
        "start", info.workflow_type, info.workflow_id, args=args, converter=workflow.payload_converter()
    )
    return _sealed(info.headers, keys(), covered)


def _resolved_mac(key: bytes, parent: str, parent_run: str, snapshot: Any, converter: Any = None) -> str:
    bare = snapshot.model_copy(update={"seal": ""})
    return mac(key, "resolved", parent, parent_run, snapshot.run_id, args=[bare], converter=converter).hex()


def seal_resolved(snapshot: Any) -> Any:
    """``resolve_directive``'s answer (a child's snapshot) with its seal, for the run that asked
    (review s20 F3: an answer completed by its activity id, no key needed, was the child the parent started)."""
    info = activity.info()
    value = _resolved_mac(seal_key(), info.workflow_id or "", info.workflow_run_id or "", snapshot)
    return snapshot.model_copy(update={"seal": value})


def resolved_sealed(snapshot: Any) -> bool:
    """Whether a child's snapshot is the one this run's own ``resolve_directive`` made (workflow code; pure)."""
    keys = workflow.extern_functions().get(EXTERN)
    if keys is None:
        return False
    info = workflow.info()
    return any(
        hmac.compare_digest(
            snapshot.seal,
            _resolved_mac(key, info.workflow_id, info.run_id, snapshot, workflow.payload_converter()),
        )
        for key in keys()
    )


class _WorkflowInbound(temporalio.worker.WorkflowInboundInterceptor):
    keys: tuple[bytes, ...]  # (set on the class made for each worker: the first seals, all of them check)

    def init(self, outbound: temporalio.worker.WorkflowOutboundInterceptor) -> None:
        super().init(_WorkflowOutbound(outbound, self.keys))

    async def execute_workflow(self, input: temporalio.worker.ExecuteWorkflowInput) -> Any:
        info = workflow.info()
        if workflow.unsafe.is_replaying():
            # A refused run recorded that it was (the marker); a sealed run, or one older than seals,
            # carries none, and replays as it ran.
            refused = workflow.patched(NOT_SEALED)
        else:
            # Checked by the workflow's own __init__ (``start_sealed``), on its input as it came: signals
            # and calls handled in the first task change that input (the run's state) before this runs.
            # (A workflow type without that check is checked here.)
            sealed = getattr(workflow.instance(), "sealed", None)
            if sealed is None:
                sealed = start_sealed(input.args)
            refused = not sealed and workflow.patched(NOT_SEALED)
        if refused:
            message = (
                f"run {info.workflow_id} was not started by Kiwi: its start carries no valid seal, so its "
                "input (grants, tools, project) is not trusted and nothing of it ran. Start runs with kiwi "
                f"(`kiwi run`, an agent through `kiwi mcp`); a Kiwi process with another {KEY_VARIABLE} than "
                "this worker's cannot start them either"
            )
            # (So that its status, a query, says so too.)
            if (refuse := getattr(workflow.instance(), "refuse_start", None)) is not None:
                refuse(message)
            raise NotSealed.error(message)
        return await super().execute_workflow(input)

    def _update_sealed(self, input: temporalio.worker.HandleUpdateInput) -> bool:
        info = workflow.info()
        covered = message(
            "update",
            info.workflow_id,
            input.update,
            input.id,
            args=input.args,
            converter=workflow.payload_converter(),
        )
        return _sealed(input.headers, self.keys, covered)

    def _refused_update(self, input: temporalio.worker.HandleUpdateInput) -> Exception:
        return NotSealed.error(
            f"this {input.update} was not sent by Kiwi (no valid seal): refused. Send calls through "
            f"kiwi (`kiwi mcp`, `kiwi call`) with this worker's {KEY_VARIABLE}"
        )

    def handle_update_validator(self, input: temporalio.worker.HandleUpdateInput) -> None:
        # Refused here, the update never enters history (Kiwi's worker took the workflow task).
        if input.update in SEALED_UPDATES and not self._update_sealed(input):
            raise self._refused_update(input)
        super().handle_update_validator(input)

    async def handle_update_handler(self, input: temporalio.worker.HandleUpdateInput) -> Any:
        # Again where it would act, in replay too: a workflow task answered by someone else's poller can
        # accept an update no validator saw. Only in runs whose own start is sealed (runs older than seals
        # took unsealed calls, and replay them as they ran); a refusal here stops the run's workflow
        # tasks (the run stalls, visibly) rather than answer an update its history says was accepted.
        if (
            input.update in SEALED_UPDATES
            and getattr(workflow.instance(), "sealed", False)
            and not self._update_sealed(input)
        ):
            raise RuntimeError(str(self._refused_update(input)))
        return await super().handle_update_handler(input)


class _WorkflowOutbound(temporalio.worker.WorkflowOutboundInterceptor):
    def __init__(self, next: temporalio.worker.WorkflowOutboundInterceptor, keys: tuple[bytes, ...]) -> None:
        super().__init__(next)
        self.keys = keys
        self.key = keys[0]

    def _seal(self, input: Any, kind: str, *names: str) -> None:
        input.args = frozen(input.args, workflow.payload_converter())
        input.headers = {**input.headers, HEADER: _header(mac(self.key, kind, *names, args=input.args))}

    def start_activity(self, input: temporalio.worker.StartActivityInput) -> workflow.ActivityHandle:
        info = workflow.info()
        self._seal(input, "activity", info.workflow_id, info.run_id, input.activity)
        handle = super().start_activity(input)
        run = workflow.instance()
        # Checked in runs that met RESULTS_SEALED and whose own start is sealed: one whose seal no longer
        # verifies (a new key) took results sealed with the old one, and replays as it ran.
        if getattr(run, "results_sealed", False) and getattr(run, "sealed", False):
            # (The activity's id is the SDK's sequence number unless the workflow names one; the SDK reads
            # the result's type from this input when the result comes.)
            activity_id = input.activity_id or str(handle._seq)  # type: ignore[attr-defined]
            covered = _result_message(info.workflow_id, info.run_id, activity_id, input.activity)
            hint = SealedResult(self.keys, covered, input.ret_type)
            input.ret_type = hint  # type: ignore[assignment]
            # A completion with no result at all resolves the activity with None, never decoded (review
            # s21 R1); Kiwi's workers always send one (None is a payload too). (An empty list of payloads
            # Temporal's core refuses: the run's workflow task fails until someone looks.)
            resolve = handle._resolve_success  # type: ignore[attr-defined]

            def resolved(result: Any) -> None:
                if not hint.checked:
                    raise hint.refused()
                resolve(result)

            handle._resolve_success = resolved  # type: ignore[attr-defined]
            fail = handle._resolve_failure  # type: ignore[attr-defined]
            handle._resolve_failure = lambda err: fail(hint.vetted(err))  # type: ignore[attr-defined]
        return handle

    async def start_child_workflow(
        self, input: temporalio.worker.StartChildWorkflowInput
    ) -> workflow.ChildWorkflowHandle:
        self._seal(input, "start", input.workflow, input.id)
        return await super().start_child_workflow(input)

    def continue_as_new(self, input: temporalio.worker.ContinueAsNewInput) -> Any:
        # (Converted here: the argument is the run's state, which the task's other coroutines may still
        # change before the SDK would convert it at the task's end.)
        info = workflow.info()
        self._seal(input, "start", input.workflow or info.workflow_type, info.workflow_id)
        return super().continue_as_new(input)


# ------------------------------------------------------------------------------------ activity results


def _result_mac(key: bytes, message: bytes, payload: Payload) -> bytes:
    encoding = payload.metadata.get("encoding", b"")
    h = hmac.new(key, message, hashlib.sha256)
    h.update(b"\0" + encoding + b"\0" + hashlib.sha256(payload.data).digest())
    return h.digest()


def _result_message(workflow_id: str, run_id: str, activity_id: str, activity_type: str) -> bytes:
    return "\0".join(("result", workflow_id, run_id, activity_id, activity_type)).encode()


def _failure_mac(key: bytes, message: bytes, kind: str, text: str, non_retryable: bool) -> str:
    covered = "\0".join(("failure", kind, text, "1" if non_retryable else "0")).encode()
    return hmac.new(key, message + b"\0" + covered, hashlib.sha256).hexdigest()


def _sealed_failure(key: bytes, message: bytes, err: ApplicationError) -> ApplicationError:
    """``err`` with its seal as one more detail (the run reads a failure's type and message, never its
    details): over the run, the activity's id and name, the failure's type, message and retry."""
    seal = _failure_mac(key, message, err.type or "", err.message, err.non_retryable)
    return ApplicationError(
        err.message,
        *err.details,
        {FAILURE_SEAL: seal},
        type=err.type,
        non_retryable=err.non_retryable,
        next_retry_delay=err.next_retry_delay,
        category=err.category,
    )


def _progress_mac(
    key: bytes, workflow_id: str, run_id: str, activity_id: str, detail: Mapping[str, Any]
) -> str:
    shown = [detail.get("progress"), detail.get("total"), detail.get("message")]
    covered = json.dumps(["progress", workflow_id, run_id, activity_id, *shown], separators=(",", ":"))
    return hmac.new(key, covered.encode(), hashlib.sha256).hexdigest()


def seal_progress(detail: dict[str, Any], info: activity.Info) -> dict[str, Any]:
    """A long call's progress (its activity's heartbeat details, which the front end shows the agent) with
    its seal (review s21 R4: heartbeat details can be recorded by the activity's id, from outside Kiwi).
    ``info``: the activity's, taken in its own task (a progress callback may run in another activity's)."""
    key = seal_key()
    return {
        **detail,
        "seal": _progress_mac(
            key, info.workflow_id or "", info.workflow_run_id or "", info.activity_id, detail
        ),
    }


def progress_sealed(detail: Mapping[str, Any], workflow_id: str, run_id: str, activity_id: str) -> bool:
    """Whether a long call's progress is one a Kiwi worker reported (no key here: no)."""
    try:
        keys = (seal_key(), *accepted_keys())
    except KiwiError:
        return False
    given = detail.get("seal")
    return isinstance(given, str) and any(
        hmac.compare_digest(given, _progress_mac(k, workflow_id, run_id, activity_id, detail)) for k in keys
    )


class SealedResult:
    """The type hint a run that checks its activities' results decodes one with (set by the run's outbound
    interceptor when it schedules the activity; :meth:`opened` by Kiwi's payload converter)."""

    __slots__ = ("checked", "keys", "message", "type")

    def __init__(self, keys: Sequence[bytes], message: bytes, type: Any) -> None:
        self.keys, self.message, self.type = keys, message, type
        self.checked = False  # (whether a result's seal was checked: one with no payload never is)

    def opened(self, payload: Payload) -> Any:
        """The type the result decodes to, once its seal is checked; :class:`NotSealed` (which fails the
        run: the result is in its history, and every replay would meet it again) when it is not Kiwi's."""
        seal = payload.metadata.get(RESULT)
        if seal is None or not any(
            hmac.compare_digest(seal, _result_mac(key, self.message, payload)) for key in self.keys
        ):
            raise self.refused()
        self.checked = True
        return self.type

    def vetted(self, err: BaseException) -> BaseException:
        """An activity's failure as the run takes it: one whose application error carries no valid seal
        keeps its place (the call fails) but not its words: whoever reaches Temporal can fail an activity
        by its id with a type and message of their making, which the agent would read (review s21 R2)."""
        cause = err.__cause__ if isinstance(err, ActivityError) else None
        if not isinstance(cause, ApplicationError):
            return err  # (a timeout or a cancellation: Temporal's, and shown to the agent in words of Kiwi's)
        seal = cause.details[-1] if cause.details else None
        given = seal.get(FAILURE_SEAL) if isinstance(seal, dict) else None
        if isinstance(given, str) and any(
            hmac.compare_digest(
                given, _failure_mac(key, self.message, cause.type or "", cause.message, cause.non_retryable)
            )
            for key in self.keys
        ):
            return err
        err.__cause__ = NotSealed.error(
            f"activity {self.activity} failed, and its failure carries no valid seal: it was "
            "not made by a Kiwi worker, so what it says is not shown (the worker's log has a real one)"
        )
        return err

    @property
    def activity(self) -> str:
        """``ID (TYPE)`` of the activity whose result this is (from what the seal covers)."""
        activity_id, activity_type = self.message.decode().split("\0")[3:5]
        return f"{activity_id} ({activity_type})"

    def refused(self) -> Exception:
        return NotSealed.error(
            f"the result of activity {self.activity} carries no valid seal: it was not "
            "made by a Kiwi worker (an activity completed by its id from outside Kiwi, or by a worker "
            f"holding another {KEY_VARIABLE}), so this run stops rather than act on it"
        )


class _ActivityInbound(temporalio.worker.ActivityInboundInterceptor):
    def __init__(self, next: temporalio.worker.ActivityInboundInterceptor, keys: tuple[bytes, ...]) -> None:
        super().__init__(next)
        self.keys = keys
        self.key = keys[0]

    async def execute_activity(self, input: temporalio.worker.ExecuteActivityInput) -> Any:
        info = activity.info()
        if not info.is_local and info.scheduled_time >= SEALS_SINCE:
            covered = message(
                "activity",
                info.workflow_id or "",
                info.workflow_run_id or "",
                info.activity_type,
                args=input.args,
                converter=activity.payload_converter(),
            )
            if not _sealed(input.headers, self.keys, covered):
                raise NotSealed.error(
                    f"activity {info.activity_type} was not scheduled by a Kiwi run (no valid seal): refused, "
                    "nothing ran"
                )
        if info.is_local:
            return await super().execute_activity(input)
        covered = _result_message(
            info.workflow_id or "", info.workflow_run_id or "", info.activity_id, info.activity_type
        )
        try:
            result = await super().execute_activity(input)
        except ApplicationError as err:
            raise _sealed_failure(self.key, covered, err) from err.__cause__
        except FailureError:
            raise  # (a cancellation: Temporal's own)
        except Exception as err:  # noqa: BLE001 - what the SDK would make of it, sealed
            failure = ApplicationError(str(err) or type(err).__name__, type=type(err).__name__)
            raise _sealed_failure(self.key, covered, failure) from err
        # Sealed as the payload that is sent, for the run to check (SealedResult).
        payload = Payload()
        payload.CopyFrom(
            result.payload
            if isinstance(result, RawValue)
            else activity.payload_converter().to_payload(result)
        )
        payload.metadata[RESULT] = _result_mac(self.key, covered, payload)
        return RawValue(payload)
