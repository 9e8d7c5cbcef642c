"""What the tests share: directive text and project folders, waiting on a condition, a run client on a
task queue of its own, the symlink swapper of the race tests, reading an MCP tool answer."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import random
import signal
import textwrap
import threading
import uuid
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kiwi.items.store import ItemStore
from kiwi.runs import RunClient

# Real files from the original Kiwi MCP project (MIT licence; see compat/kiwi-mcp/SOURCES.md).
COMPAT = Path(__file__).resolve().parent / "compat" / "kiwi-mcp"


def directive_md(
    body: str,
    name: str = "demo",
    version: str = "1.0.0",
    permissions: str = "",
    inputs: str = "",
    tools: str = "",
    extra_meta: str = "",
) -> str:
    """A directive file: Markdown around one ```xml block; ``body`` is the <process> content."""
    return textwrap.dedent("""\
        # {name}

        Some prose before the block.

        ```xml
        <directive name="{name}" version="{version}">
          <metadata>
            <description>Demo directive {name}</description>
            <category>tests</category>
            <author>tests</author>
            <model tier="fast" />
            <permissions>
        {permissions}
            </permissions>
        {tools}
        {extra_meta}
          </metadata>
          <inputs>
        {inputs}
          </inputs>
          <process>
        {body}
          </process>
        </directive>
        ```
        """).format(
        name=name,
        version=version,
        permissions=permissions,
        inputs=inputs,
        tools=tools,
        extra_meta=extra_meta,
        body=body,
    )


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def bash_tool(project: Path, tool_id: str, script: str, description: str = "A tool") -> Path:
    """A human's bash tool ``tool_id`` in the project (`.ai/tools/ops/TOOL_ID`) running ``script``: its folder."""
    tool = project / ".ai" / "tools" / "ops" / tool_id
    write(
        tool / "tool.yaml",
        f"tool_id: {tool_id}\ntool_type: bash\nversion: '1.0.0'\ncategory: ops\ndescription: {description}\n"
        "executor:\n  entrypoint: run.sh\nmutates_state: false\n",
    )
    write(tool / "run.sh", script)
    return tool


def signed(text: str) -> str:
    """``text`` signed by the test's own key (made and trusted on first use, as `kiwi init` does)."""
    from kiwi.cli.keys import ensure_key
    from kiwi.signing import sign

    return sign(text, signer=ensure_key()[0], kind="directive")


def write_directive(path: Path, text: str) -> Path:
    """Write a directive as a human would after `kiwi sign`: its grants take effect."""
    return write(path, signed(text))


def approver(name: str) -> str:
    """A person who may approve calls: a key of their own, trusted for approving in the user space."""
    from kiwi.items.store import user_space
    from kiwi.keys import create_key, trust_key

    _, public = create_key(name)
    trust_key(user_space(), name, public, ["approve"])
    return name


async def wait_for(
    probe: Callable[[], Awaitable[Any]], *, timeout: float = 30.0, what: str = "condition"
) -> Any:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.02
    while True:
        value = await probe()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.5)


async def awaiting_step(runs: RunClient, run_id: str, step: str, timeout: float = 60):
    """Wait until ``run_id`` waits for the agent at ``step``."""

    async def probe():
        status = await runs.status(run_id)
        return status.status == "awaiting_agent" and status.current_step.name == step

    await wait_for(probe, timeout=timeout, what=f"step {step} to wait for the agent")


def run_client(client, project) -> RunClient:
    """A RunClient on a task queue of its own; start its (sandboxed) worker with ``build_worker``."""
    return RunClient(client, ItemStore(project), task_queue=f"kiwi-test-{uuid.uuid4().hex[:8]}")


SECRET = "TOP SECRET outside the project"


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every name below ``folder`` with its content (links by target), to prove nothing changed."""
    out: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        out[rel] = (
            f"-> {os.readlink(path)}" if path.is_symlink() else path.read_bytes() if path.is_file() else "dir"
        )
    return out


@contextlib.contextmanager
def loopback_http(handler: type[BaseHTTPRequestHandler]) -> Any:
    """An HTTP server on 127.0.0.1 answering with ``handler`` on a thread of its own; yields its port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def swap_after_check(monkeypatch: Any, checked_rel: str, swap: Callable[[], None]) -> list[str]:
    """A racer that wins once: right after the worker's filesystem activity checked the tree at ``checked_rel``
    (``activities.filesystem._check_tree``), ``swap`` renames what is there, as another program could. Returns a
    list that holds ``checked_rel`` once it has swapped."""
    from activities import filesystem

    checked = filesystem._check_tree
    swapped: list[str] = []

    def check_then_swap(folder: int, rel: str, *args: Any, **kwargs: Any) -> None:
        checked(folder, rel, *args, **kwargs)
        if rel == checked_rel and not swapped:
            swap()
            swapped.append(rel)

    monkeypatch.setattr(filesystem, "_check_tree", check_then_swap)
    return swapped


def _exchange_function():
    """``renameat2(RENAME_EXCHANGE)`` where libc has it: swaps two names atomically, the attacker's best tool."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]

    def exchange(a: Path, b: Path) -> None:
        if renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) != 0:  # AT_FDCWD, RENAME_EXCHANGE
            raise OSError(ctypes.get_errno(), "renameat2")

    return exchange


EXCHANGE = _exchange_function()


class Swapper(threading.Thread):
    """Keeps turning ``project/victim`` into a symlink to ``outside`` (or ``outside/secret``) and back.

    With ``renameat2`` the two names are exchanged atomically (``victim`` is always one or the other);
    elsewhere by four renames."""

    def __init__(self, project: Path, outside: Path, kind: str) -> None:
        super().__init__(daemon=True)
        self.victim, self.real, self.link = (
            project / "victim",
            project / "victim.real",
            project / "victim.link",
        )
        self.kind, self.stop, self.swaps, self.jitter = kind, threading.Event(), 0, random.Random()
        self.target = outside if kind == "dir" else outside / "secret"
        self.link.symlink_to(self.target, target_is_directory=kind == "dir")
        self.heal()

    def heal(self) -> None:
        """Put a real victim and the link back if a call removed or moved them."""
        for spare in (self.victim, self.link):
            if not spare.is_symlink() and not spare.exists() and not self.real.exists():
                if self.kind == "dir":
                    spare.mkdir(exist_ok=True)
                    (spare / "secret").write_text("inside")
                else:
                    spare.write_text("inside")
        for name in (self.victim, self.link):
            if name.is_dir() and not name.is_symlink() and not (name / "secret").exists():
                (name / "secret").write_text("inside")
        if not self.victim.is_symlink() and not self.link.is_symlink() and not self.link.exists():
            self.link.symlink_to(self.target, target_is_directory=self.kind == "dir")

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                if EXCHANGE is not None:
                    EXCHANGE(self.victim, self.link)
                else:
                    for src, dst in (
                        (self.victim, self.real),
                        (self.link, self.victim),
                        (self.victim, self.link),
                        (self.real, self.victim),
                    ):
                        os.rename(src, dst)
            except OSError:
                pass
            self.swaps += 1
            for _ in range(self.jitter.randrange(3)):
                os.stat(self.link.parent)  # a random pause, so the swaps do not fall into step with the calls
            if self.swaps % 8 == 0:
                with contextlib.suppress(OSError):
                    self.heal()

    def __enter__(self) -> Swapper:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.join()


def data(result) -> dict:
    """A tool's answer as JSON; an error answer (isError) must carry the seeds' error shape."""
    answer = (
        result.structured_content
        if result.structured_content is not None
        else json.loads(result.content[0].text)
    )
    if result.is_error:
        assert {"error", "item_type", "action", "item_id", "message", "hint"} <= set(answer), result
    return answer


async def execute(client: Any, arguments: dict[str, Any]) -> dict[str, Any]:
    """Kiwi's MCP ``execute`` tool called as an agent calls it; its answer as JSON."""
    return data(await client.call_tool("execute", arguments))


async def waits_for_agent(runs: RunClient, run_id: str) -> bool:
    return (await runs.status(run_id)).status == "awaiting_agent"


async def pending_approvals(runs: RunClient, run_id: str) -> list[Any]:
    return [a for a in (await runs.status(run_id)).approvals if a.status == "pending"]


def loopback_dev_server(folder: Path) -> Any:
    """A Temporal dev server on free loopback ports, its state in ``folder`` (not started yet)."""
    from kiwi.devserver import DevServer, free_port

    return DevServer(
        ip="127.0.0.1",
        port=free_port(),
        ui_port=free_port(),
        db_file=folder / "state.sqlite",
        pragmas={"journal_mode": "wal", "synchronous": "normal"},
    )


@contextlib.asynccontextmanager
async def kiwi_mcp_http(
    temporal_env: Any, runs: RunClient | None, project: Path, port: int, *, address: str | None = None
):
    """`kiwi mcp --http` for ``project`` as its own process group; yields (URL, process) once it answers,
    and kills the group at the end (SIGKILL: a test may also kill it itself, as a crash). ``address``: the
    Temporal it is told to use, instead of ``temporal_env``'s (which need not be up)."""
    import sys

    address = address or temporal_env.client.service_client.config.target_host
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kiwi",
        "mcp",
        "--http",
        "--port",
        str(port),
        "--address",
        address,
        "--task-queue",
        runs.task_queue if runs is not None else "kiwi",
        cwd=str(project),
        env={**os.environ},
        start_new_session=True,
        stderr=asyncio.subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        await wait_for(lambda: mcp_answers(url), timeout=60, what="kiwi mcp --http")
        yield url, proc
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


async def kiwi_cli(
    *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """The real `kiwi` command line in a child process (from ``cwd``): exit code, stdout, stderr."""
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kiwi",
        *argv,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode()


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class OtlpReceiver:
    """An OTLP/HTTP endpoint on loopback: keeps every span and metric name it is sent (decoded with the
    OpenTelemetry protobuf classes)."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans: list[dict[str, Any]] = []
        self.metrics: set[str] = set()
        self.labels: dict[str, set[tuple[str, str]]] = {}  # each metric's (attribute, value) pairs
        self.metric_services: set[str] = (
            set()
        )  # ("resource:NAME" per metrics resource, "point:NAME" per data point)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/v1/traces":
                    receiver._spans(ExportTraceServiceRequest.FromString(body))
                elif self.path == "/v1/metrics":
                    request = ExportMetricsServiceRequest.FromString(body)
                    for rm in request.resource_metrics:
                        resource = {a.key: _value(a.value) for a in rm.resource.attributes}
                        receiver.metric_services.add("resource:" + str(resource.get("service.name", "")))
                        for sm in rm.scope_metrics:
                            receiver.metrics.update(m.name for m in sm.metrics)
                            for m in sm.metrics:
                                for kind in ("sum", "gauge", "histogram"):
                                    if m.HasField(kind):
                                        receiver.labels.setdefault(m.name, set()).update(
                                            (a.key, str(_value(a.value)))
                                            for point in getattr(m, kind).data_points
                                            for a in point.attributes
                                        )
                                        receiver.metric_services.update(
                                            "point:" + str(_value(a.value))
                                            for point in getattr(m, kind).data_points
                                            for a in point.attributes
                                            if a.key == "service_name"
                                        )
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _spans(self, request: Any) -> None:
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            service = resource.get("service.name", "")
            for ss in rs.scope_spans:
                for span in ss.spans:
                    self.spans.append(
                        {
                            "name": span.name,
                            "service": service,
                            "instance": resource.get("service.instance.id", ""),
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_id": span.parent_span_id.hex(),
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                        }
                    )

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        return [s for s in list(self.spans) if s["trace_id"] == trace_id]

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


async def mcp_answers(url: str) -> bool:
    """Whether an MCP server over HTTP at ``url`` lists its tools yet (False while it is not listening)."""
    from mcp.client import Client

    try:
        async with Client(url) as probe:
            return bool(await probe.list_tools())
    except Exception:  # noqa: BLE001 - not listening yet
        return False


async def kiwi_worker(
    address: str, queue: str, *extra: str, env: dict[str, str] | None = None, stderr: bool = False
) -> asyncio.subprocess.Process:
    """`kiwi worker` as a process (and process group) of its own; returns once it printed its first line.
    Its stderr is discarded, so a chatty worker never blocks on a full pipe, unless ``stderr`` (piped: read
    it). ``env``: variables added."""
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kiwi",
        "worker",
        "--address",
        address,
        "--task-queue",
        queue,
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE if stderr else asyncio.subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert b"kiwi worker" in line, f"kiwi worker did not start: {line!r} (exit code {proc.returncode})"
    return proc


def write_parent_and_child(
    project: Path, *, helper_steps=("help",), boss_steps=("lead",), harness: str = ""
) -> None:
    """A project where the agent's loop in a run holds it at the second repeated call, a parent directive
    ``boss`` (one agent step per name in ``boss_steps``) that may start child runs, and ``helper`` (that may
    start them too, for grandchildren), both reading ``notes/**``."""
    write(
        project / ".ai" / "config" / "agent_harness.yaml",
        "loop_detection:\n  repeat_threshold: 2\n  max_warnings: 1\n" + harness,
    )
    write(project / "notes" / "a.txt", "a")
    grants = '<read resource="filesystem" path="notes/**"/><execute resource="tool" id="directive.run"/>'
    for name, steps in (("helper", helper_steps), ("boss", boss_steps)):
        body = "".join(f'<step name="{s}" mode="agent"><action>{s}</action></step>' for s in steps)
        write_directive(
            project / ".ai" / "directives" / f"{name}.md", directive_md(body, name=name, permissions=grants)
        )


async def start_parent_with_child(runs: Any) -> tuple[str, str]:
    """A ``boss`` run waiting at ``lead`` and the ``helper`` child the agent started from it (waiting at
    ``help``): see :func:`write_parent_and_child`. The two run ids."""
    parent = await runs.start("boss", {})
    await awaiting_step(runs, parent, "lead")
    child = (await runs.call_tool(parent, "directive.run", {"directive": "helper"})).result["run_id"]
    await awaiting_step(runs, child, "help")
    return parent, child


def agent_directive(project: Path, tools: list[str], hosts: str = "", name: str = "calls") -> None:
    """A directive ``name`` whose one step waits for the agent, granted ``tools`` (and ``hosts`` to reach)."""
    grants = "".join(f'<execute resource="tool" id="{t}"/>' for t in tools)
    if hosts:
        grants += f'<execute resource="network" hosts="{hosts}"/>'
    write_directive(
        project / ".ai" / "directives" / f"{name}.md",
        directive_md(
            '<step name="work"><action>Call the tools.</action></step>', name=name, permissions=grants
        ),
    )


async def call_with_start(runs: RunClient, directive: str, inputs: dict[str, Any], short: str, tool: str,
                          arguments: dict[str, Any]) -> Any:  # fmt: skip
    """Start ``directive`` and send a call_tool in the same request (update-with-start), so the run's first
    workflow task carries the call; the run's id and the update's handle."""
    from temporalio.client import WithStartWorkflowOperation, WorkflowUpdateStage
    from temporalio.common import WorkflowIDConflictPolicy

    from kiwi.contracts import CallToolRequest, DirectiveRunInput, run_workflow_id
    from workflows.directive_run import DirectiveRun

    run_id = run_workflow_id(directive, short)
    start = WithStartWorkflowOperation(
        DirectiveRun.run,
        DirectiveRunInput(snapshot=runs.snapshot(directive, inputs, run_id)),
        id=run_id,
        task_queue=runs.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
    )
    update = await runs.client.start_update_with_start_workflow(
        DirectiveRun.call_tool,
        CallToolRequest(tool=tool, arguments=arguments),
        start_workflow_operation=start,
        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
    )
    return run_id, update


SLOW_TOOL = """\
tool_id: slow
tool_type: python
executor: {type: python, entrypoint: main.py}
parameters:
  - {name: seconds, type: number, required: true}
"""
SLOW_MAIN = """\
import time


def main(seconds):
    time.sleep(seconds)
    return {"slept": seconds}
"""


def write_slow_steps(project) -> None:
    """A directive `slow` whose first automatic step takes 1.5 s (a local tool that sleeps) and whose second one
    writes a file."""
    write(project / ".ai" / "tools" / "slow" / "tool.yaml", SLOW_TOOL)
    write(project / ".ai" / "tools" / "slow" / "main.py", SLOW_MAIN)
    write_directive(
        project / ".ai" / "directives" / "slow.md",
        directive_md(
            '<step name="wait"><tool_call tool="slow"><param name="seconds">1.5</param></tool_call></step>'
            '<step name="write"><tool_call tool="filesystem.write"><param name="path">notes/late.txt</param>'
            '<param name="content">late</param></tool_call></step>',
            name="slow",
            permissions='<execute resource="tool" id="slow"/><write resource="filesystem" path="notes/**"/>',
        ),
    )


def distinct_ports(count: int, avoid: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """``count`` free ports, no two alike nor in ``avoid`` (the kernel may hand out a port it just handed out)."""
    ports: list[int] = []
    while len(ports) < count:
        ports.append(_free_port(avoid=[*avoid, *ports]))
    return ports


def _free_port(avoid: Any = ()) -> int:
    from kiwi.devserver import free_port

    return free_port(avoid=avoid)
