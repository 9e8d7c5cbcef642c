"""Tool executors inside a run: an api tool call against the same request made directly with httpx, a
python tool with packages (cold: its environment is built; warm: it exists) against one without, and,
where Podman or Docker and a static busybox exist, a docker tool against the same `run` from the CLI.

    .venv/bin/python bench/bench_tools.py [--calls 50]

The HTTP server is a stdlib one on loopback; the package (termcolor) comes from the index pip is
configured for, so the cold figure is mostly pip's and the index's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
from temporalio.client import Client as TemporalClient  # noqa: E402

from activities.container import LIMITS, container_engine  # noqa: E402
from bench.common import beside, pct, scratch_project, tuned_dev_server  # noqa: E402
from kiwi.converter import data_converter
from kiwi.items.store import ItemStore  # noqa: E402
from kiwi.runs import RunClient  # noqa: E402
from kiwi.seal import seal_interceptors  # noqa: E402
from tests.helpers import directive_md, write, write_directive  # noqa: E402
from workers.main import build_worker  # noqa: E402


class Hello(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"data": {"hello": "world"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


async def timed(calls: int, fn) -> list[float]:
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


def line(name: str, samples: list[float]) -> str:
    return f"{name:<34} p50 {pct(samples, 0.5):7.1f} ms   p99 {pct(samples, 0.99):7.1f} ms"


def busybox_image(root: Path) -> str | None:
    """A local image holding a static busybox, or None where there is no engine or busybox."""
    engine, busybox = container_engine(), shutil.which("busybox")
    if engine is None or busybox is None:
        return None
    (root / "image" / "bin").mkdir(parents=True)
    shutil.copy(busybox, root / "image" / "bin" / "busybox")
    (root / "image" / "bin" / "sh").symlink_to("busybox")
    with tarfile.open(root / "image.tar", "w") as tar:
        tar.add(root / "image", arcname=".")
    name = "localhost/kiwi-bench-busybox:1"
    made = subprocess.run([*engine, "import", str(root / "image.tar"), name], capture_output=True)
    return name if made.returncode == 0 else None


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    http = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    port = http.server_address[1]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        scratch_project(root)
        os.environ["KIWI_HOME"] = beside(root, "kiwi-home")
        write(
            root / ".ai" / "config" / "agent_harness.yaml",
            "loop_detection:\n  repeat_threshold: 1000000\n  max_warnings: 1000000\n",
        )
        write(
            root / ".ai" / "tools" / "bench" / "hello" / "tool.yaml",
            f"tool_id: hello\ntool_type: api\nexecutor:\n  url: http://127.0.0.1:{port}/hello\n"
            "  response: data\n",
        )
        for tool_id, requires in (("plain", ""), ("coloured", "requires:\n  packages: [termcolor>=3]\n")):
            folder = root / ".ai" / "tools" / "bench" / tool_id
            write(folder / "main.py", "def main():\n    return {'ok': True}\n")
            write(
                folder / "tool.yaml",
                f"tool_id: {tool_id}\ntool_type: python\nexecutor:\n  entrypoint: main.py\n{requires}",
            )
        image = busybox_image(root)
        if image:
            folder = root / ".ai" / "tools" / "bench" / "boxed"
            write(folder / "run.sh", "echo '{\"ok\": true}'\n")
            write(
                folder / "tool.yaml",
                f"tool_id: boxed\ntool_type: docker\nexecutor:\n  image: {image}\n"
                "  command: [/bin/sh, /tool/run.sh]\n",
            )
        write_directive(
            root / ".ai" / "directives" / "bench.md",
            directive_md(
                '<step name="work"><action>Call tools.</action></step>',
                name="bench",
                permissions='<execute resource="tool" id="hello,plain,coloured,boxed"/>'
                f'<execute resource="network" hosts="127.0.0.1:{port}"/>',
            ),
        )
        server = tuned_dev_server(root)
        await server.start()
        try:
            temporal = await TemporalClient.connect(
                server.address, data_converter=data_converter, interceptors=seal_interceptors()
            )
            async with build_worker(temporal, "kiwi-bench-tools"):
                runs = RunClient(temporal, ItemStore(root), task_queue="kiwi-bench-tools")
                run_id = await runs.start("bench", {})
                while (await runs.status(run_id)).status != "awaiting_agent":
                    await asyncio.sleep(0.05)

                async def call(tool: str) -> None:
                    result = await runs.call_tool(run_id, tool, {})
                    assert result.status == "ok", result

                async with httpx.AsyncClient(trust_env=False) as direct:

                    async def direct_get() -> None:
                        (await direct.get(f"http://127.0.0.1:{port}/hello")).raise_for_status()

                    await timed(5, direct_get)
                    direct_samples = await timed(args.calls, direct_get)
                await timed(5, lambda: call("hello"))
                api_samples = await timed(args.calls, lambda: call("hello"))
                cold = await timed(1, lambda: call("coloured"))
                warm = await timed(args.calls, lambda: call("coloured"))
                plain = await timed(args.calls, lambda: call("plain"))
                boxed, engine_run = [], []
                if image:
                    boxed = await timed(max(5, args.calls // 5), lambda: call("boxed"))
                    engine = container_engine() or []

                    async def bare_run() -> None:
                        proc = await asyncio.create_subprocess_exec(
                            *engine,
                            "run",
                            "--rm",
                            "--network",
                            "none",
                            *LIMITS,
                            image,
                            "/bin/sh",
                            "-c",
                            "echo ok",
                            stdout=asyncio.subprocess.DEVNULL,
                        )
                        await proc.wait()

                    engine_run = await timed(max(5, args.calls // 5), bare_run)
                    subprocess.run([*engine, "rmi", "-f", image], capture_output=True)
                await runs.cancel(run_id, "bench done")
        finally:
            server.stop()
            http.shutdown()
    print(line("direct httpx GET", direct_samples))
    print(line("api tool in a run (same GET)", api_samples))
    print(f"{'python tool with packages, cold':<34} {cold[0]:11.0f} ms (environment built)")
    print(line("python tool with packages, warm", warm))
    print(line("python tool without packages", plain))
    if boxed:
        print(line("docker tool in a run", boxed))
        print(line("the same container run from the CLI", engine_run))
    else:
        print("docker tool: skipped (no container engine or no busybox here)")


if __name__ == "__main__":
    asyncio.run(main())
