"""YAML parsing for Kiwi's small config and manifest files, parsed once per distinct text.

Every run start reads ``agent_harness.yaml``, ``mcp_registry.yaml`` and each local tool's
manifest; PyYAML's pure-Python parser made that a large share of a start. The cache is keyed
by the text, so an edited file is parsed again, and callers get their own copy to change.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any

import yaml


@lru_cache(maxsize=512)
def _parse(text: str) -> Any:
    return yaml.safe_load(text)


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)``, cached; raises ``yaml.YAMLError`` as it does."""
    return copy.deepcopy(_parse(text))
