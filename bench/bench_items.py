"""Item store benchmark: 10,000 generated items. Prints figures against the issue's targets.

.venv/bin/python bench/bench_items.py [--items 10000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import pct  # noqa: E402
from kiwi.items.directive import parse_directive  # noqa: E402
from kiwi.items.store import ItemStore  # noqa: E402
from tests.helpers import directive_md  # noqa: E402

WORDS = [
    "deploy",
    "database",
    "schema",
    "migrate",
    "test",
    "lint",
    "build",
    "release",
    "docs",
    "cache",
    "api",
    "auth",
    "token",
    "user",
    "email",
    "queue",
    "worker",
    "report",
    "metrics",
    "backup",
    "restore",
    "index",
    "search",
    "parse",
    "render",
    "upload",
    "image",
    "video",
    "audio",
]


QUERIES = [
    "deploy database",
    "auth token",
    "search index",
    "backup restore metrics",
    "email queue worker",
    "render image",
    "lint",
    "release docs",
]


def generate(root: Path, count: int) -> None:
    ai = root / ".ai"
    for i in range(count):
        a, b, c = WORDS[i % len(WORDS)], WORDS[(i * 7) % len(WORDS)], WORDS[(i * 13) % len(WORDS)]
        kind = i % 10
        if kind < 6:
            body = (
                f'<step name="s1"><description>{a} the {b}</description><action>Run {c} checks</action></step>'
                f'<step name="s2"><tool_call tool="filesystem.read"><param name="path">src/{a}.py</param>'
                "</tool_call></step>"
            )
            text = directive_md(
                body, name=f"{a}_{b}_{i}", permissions='<read resource="filesystem" path="src/**"/>'
            )
            (ai / "directives" / a).mkdir(parents=True, exist_ok=True)
            (ai / "directives" / a / f"{a}_{b}_{i}.md").write_text(
                text.replace("Demo directive", f"{a} {b} {c}")
            )
        elif kind < 8:
            folder = ai / "tools" / b / f"{b}_{c}_{i}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "tool.yaml").write_text(
                f"tool_id: {b}_{c}_{i}\ntool_type: python\ndescription: {b} {c} {a}\nexecutor:\n  entrypoint: m.py\n"
                f"parameters:\n  - name: {a}\n    type: string\ntags: [{a}, {b}]\n"
            )
        else:
            (ai / "knowledge" / c).mkdir(parents=True, exist_ok=True)
            (ai / "knowledge" / c / f"k{i}.md").write_text(
                f"---\nzettel_id: k{i}\ntitle: {c} {a} notes\nentry_type: pattern\ncategory: {c}\ntags: [{a}]\n---\n\n"
                + f"How to {a} {b} with {c}. " * 20
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["AI_USER_SPACE"] = str(root / "user")
        generate(root, args.items)
        store = ItemStore(root)
        t0 = time.perf_counter()
        counts = store.refresh()
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        store.refresh()
        rescan = time.perf_counter() - t0
        queries = QUERIES
        for q in queries:
            store.search(q, refresh=False)
        latencies = []
        for _ in range(20):
            for q in queries:
                t0 = time.perf_counter()
                store.search(q, refresh=False)
                latencies.append((time.perf_counter() - t0) * 1000)
        typical = next((root / ".ai" / "directives").rglob("*.md")).read_text()
        validate = []
        for _ in range(200):
            t0 = time.perf_counter()
            parse_directive(typical, "typical.md")
            validate.append((time.perf_counter() - t0) * 1000)
    print(
        f"items: {counts['added']} indexed (load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)"
    )
    print(f"index build:        {build:7.2f} s    (target <= 10 s)")
    print(f"re-scan unchanged:  {rescan:7.3f} s    (target <= 1 s)")
    print(f"warm query p50:     {pct(latencies, 0.5):7.2f} ms   (target <= 5 ms)")
    print(f"warm query p99:     {pct(latencies, 0.99):7.2f} ms   (target <= 20 ms)")
    print(f"validate directive: {statistics.median(validate):7.2f} ms   (target <= 5 ms, p50)")


if __name__ == "__main__":
    main()
