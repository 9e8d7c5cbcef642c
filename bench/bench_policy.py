"""Policy benchmark: one permission check against 100 grants, and the whole pure policy path.

.venv/bin/python bench/bench_policy.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kiwi.guards import detect_loop, digest, rate_patterns, redact, summarise_call  # noqa: E402
from kiwi.policy import PermissionSet  # noqa: E402


def timed(fn, n: int = 20000) -> tuple[float, float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    samples.sort()
    return samples[n // 2] / 1000, samples[int(n * 0.99)] / 1000


def main() -> None:
    grants = PermissionSet(
        fs_read=[f"pkg{i}/src/**/*.py" for i in range(50)]
        + [f"docs{i}/*.md" for i in range(49)]
        + ["app/**"],
        fs_write=[f"out{i}/**" for i in range(100)],
        tools=[f"tool_{i}" for i in range(100)],
        shell=["git", "npm", "pytest"],
    )
    args = {"path": "app/models/user.py"}
    check = timed(lambda: grants.check("filesystem.read", args))
    limits = {"filesystem.write": 100, "shell.run": 50, "mcp.*": 200}
    hashes = [digest(["filesystem.read", {"path": f"f{i}"}]) for i in range(10)]

    def whole() -> None:
        grants.check("filesystem.read", args)
        rate_patterns("filesystem.read", limits, {})
        detect_loop(hashes + [digest(["filesystem.read", args])], 3)
        {
            "tool": "filesystem.read",
            "arguments": redact(args),
            "summary": summarise_call("filesystem.read", args),
        }

    path = timed(whole)
    print(f"(load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
    print(
        f"permission check, 100 grants: p50 {check[0]:6.1f} us  p99 {check[1]:6.1f} us   (target p50 <= 20 us)"
    )
    print(
        f"whole policy path (check, rate, loop, audit record): p50 {path[0]:6.1f} us  p99 {path[1]:6.1f} us"
        "   (target <= 1 ms)"
    )


if __name__ == "__main__":
    main()
