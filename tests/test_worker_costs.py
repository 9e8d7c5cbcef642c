"""What the worker does once instead of on every call stays correct: the MCP registry's change check,
the shared payload converter, an activity's answer converted once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from temporalio.converter import DataConverter, WorkflowSerializationContext

from kiwi.contracts import McpCallResult
from kiwi.converter import KiwiPayloadConverter, data_converter
from kiwi.upstream.pool import McpPool, McpRefused

REGISTRY = "mcps:\n  {name}:\n    command: node\n    args: ['{arg}']\n"


def _registry(project: Path, name: str, arg: str) -> Path:
    path = project / ".ai" / "config" / "mcp_registry.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(REGISTRY.format(name=name, arg=arg))
    return path


def test_an_edited_registry_is_read_again_by_the_next_call(tmp_path, monkeypatch):
    monkeypatch.setenv("AI_USER_SPACE", str(tmp_path / "user"))
    project = tmp_path / "project"
    path = _registry(project, "first", "a.js")
    pool = McpPool()
    assert pool.config(str(project), "first").args == ["a.js"]
    stamp = path.stat()
    # Replaced the way editors save (a new file renamed over the old one), with the old mtime and size:
    # the file's identity still tells the change.
    replacement = path.with_suffix(".new")
    replacement.write_text(REGISTRY.format(name="first", arg="b.js"))
    os.utime(replacement, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    replacement.replace(path)
    assert pool.config(str(project), "first").args == ["b.js"]
    # Edited in place to another size.
    _registry(project, "second", "longer.js")
    assert pool.config(str(project), "second").args == ["longer.js"]
    with pytest.raises(McpRefused, match="no MCP server 'first'"):
        pool.config(str(project), "first")
    # Removed: no server is configured any more.
    path.unlink()
    with pytest.raises(McpRefused, match="no MCP server 'second'"):
        pool.config(str(project), "second")


def test_every_data_converter_shares_one_payload_converter_and_round_trips():
    context = WorkflowSerializationContext(namespace="default", workflow_id="run-x")
    first = DataConverter(payload_converter_class=KiwiPayloadConverter).payload_converter
    second = data_converter.with_context(context).payload_converter
    assert KiwiPayloadConverter() is KiwiPayloadConverter()
    # (The SDK wraps the payload converter it is given; the wrapped one is the process's one.)
    inner = {id(getattr(c, "_inner_payload_converter", c)) for c in (first, second)}
    assert inner == {id(KiwiPayloadConverter())}
    value = McpCallResult(result={"content": [{"type": "text", "text": "é\u0000"}]}, is_error=False)
    payloads = second.to_payloads([value])
    assert first.from_payloads(payloads, [McpCallResult]) == [value]
