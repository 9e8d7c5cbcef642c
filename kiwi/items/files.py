"""Reading item files: regular files only, bounded, never blocking on a FIFO."""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_ITEM_BYTES = 1_000_000


class NotAnItemFile(OSError):
    """An item path that is no regular file (a FIFO, a device, a socket) or is over MAX_ITEM_BYTES."""


def read_item_bytes(path: Path, limit: int = MAX_ITEM_BYTES, *, head: int | None = None) -> bytes:
    """An item file's bytes (its first ``head`` bytes whatever its size, when given). Opened without
    blocking and checked on the open descriptor: a FIFO named like an item (or swapped in after the
    scan) is refused instead of hanging the reader forever."""
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise NotAnItemFile(f"{path}: not a regular file; items are regular files")
        if head is None and info.st_size > limit:
            raise NotAnItemFile(f"file is {info.st_size:,} bytes; items are limited to {limit:,}")
        return handle.read(head) if head is not None else handle.read(limit + 1)[:limit]
