"""YAML parsing for Kiwi's small config and manifest files, parsed once per distinct text.

Every run start reads ``agent_harness.yaml``, ``mcp_registry.yaml`` and each local tool's
manifest; PyYAML's pure-Python parser made that a large share of a start. The cache is keyed
by the text, so an edited file is parsed again, and callers get their own copy to change.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from kiwi.errors import ItemInvalid, Problem


@lru_cache(maxsize=512)
def _parse(text: str) -> Any:
    return yaml.safe_load(text)


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)``, cached; raises ``yaml.YAMLError`` as it does."""
    return copy.deepcopy(_parse(text))


def read(path: Path) -> Any:
    """A config file's YAML (``{}`` when empty), or ItemInvalid naming the file, line and column."""
    try:
        return safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ItemInvalid([Problem(f"malformed YAML: {getattr(exc, 'problem', exc)}", str(path),
                                   mark.line + 1 if mark else 0, mark.column + 1 if mark else 0)]) from None

