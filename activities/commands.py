"""``shell.run``, local tools and ``git.*``: child processes, never a shell."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.filesystem import confine
from activities.process import run_process
from kiwi.contracts import CommandRequest, GitRequest, LocalToolRequest

# Runs a Python tool: main(**params) when the entrypoint defines main, else the file as a
# script with the parameters as JSON on stdin. The result is one JSON document on stdout.
_PYTHON_RUNNER = r"""
import importlib.util, io, json, runpy, sys
path = sys.argv[1]
params = json.loads(sys.stdin.read() or "{}")
spec = importlib.util.spec_from_file_location("kiwi_tool", path)
module = importlib.util.module_from_spec(spec)
sys.path.insert(0, __import__("os").path.dirname(path))
spec.loader.exec_module(module)
if callable(getattr(module, "main", None)):
    result = module.main(**params)
    sys.stdout.write("\n__KIWI_RESULT__" + json.dumps(result, default=str))
else:
    sys.stdin = io.StringIO(json.dumps(params))
    runpy.run_path(path, run_name="__main__")
"""


def _parse_output(stdout: str) -> Any:
    marker = stdout.rfind("\n__KIWI_RESULT__")
    if marker >= 0:
        return json.loads(stdout[marker + len("\n__KIWI_RESULT__"):])
    text = stdout.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class CommandActivities:
    @activity.defn(name="run_command")
    async def run_command(self, req: CommandRequest) -> dict[str, Any]:
        cwd = confine(req.project_root, req.cwd or ".", ["**"], [])
        result = await run_process(req.argv, cwd=str(cwd), timeout=req.timeout_seconds,
                                   max_output=req.max_output_bytes, stdin=req.stdin, env=req.env)
        return {"exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
                "truncated": result.truncated}

    @activity.defn(name="run_local_tool")
    async def run_local_tool(self, req: LocalToolRequest) -> Any:
        tool = req.tool
        entry = Path(tool.entrypoint)
        if not entry.is_file():
            raise ApplicationError(f"tool '{tool.tool_id}': entrypoint {entry.name} is missing",
                                   type="ToolNotFound", non_retryable=True)
        if tool.tool_type == "python":
            argv = [sys.executable, "-c", _PYTHON_RUNNER, str(entry)]
            env = {}
        elif tool.tool_type == "bash":
            argv = ["bash", str(entry), *[str(v) for v in req.params.values()]]
            env = {f"KIWI_PARAM_{k.upper()}": v if isinstance(v, str) else json.dumps(v) for k, v in req.params.items()}
        else:
            raise ApplicationError(f"tool '{tool.tool_id}' has type {tool.tool_type}, which this worker cannot run yet",
                                   type="ToolTypeUnsupported", non_retryable=True)
        result = await run_process(argv, cwd=req.project_root, timeout=tool.timeout_seconds,
                                   max_output=req.max_output_bytes, stdin=json.dumps(req.params), env=env)
        if result.exit_code != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
            raise ApplicationError(f"tool '{tool.tool_id}' exited with {result.exit_code}: " + " | ".join(tail),
                                   type="ToolFailed", non_retryable=True)
        try:
            return _parse_output(result.stdout)
        except json.JSONDecodeError as exc:
            raise ApplicationError(f"tool '{tool.tool_id}' printed invalid JSON: {exc}", type="ToolFailed",
                                   non_retryable=True) from None


async def _git(root: str, *args: str, timeout: float = 60.0) -> tuple[int, str, str]:
    result = await run_process(["git", *args], cwd=root, timeout=timeout, max_output=1_000_000)
    return result.exit_code, result.stdout, result.stderr


async def _require_repo(root: str) -> None:
    code, _, _ = await _git(root, "rev-parse", "--is-inside-work-tree")
    if code != 0:
        raise ApplicationError("not a git repository: git tools are unavailable here", type="GitUnavailable",
                               non_retryable=True)


class GitActivities:
    @activity.defn(name="git_status")
    async def git_status(self, req: GitRequest) -> dict[str, Any]:
        await _require_repo(req.project_root)
        _, out, _ = await _git(req.project_root, "status", "--porcelain=v1", "--branch")
        lines = out.splitlines()
        return {"branch": lines[0][3:] if lines else "", "changes": lines[1:]}

    @activity.defn(name="git_diff")
    async def git_diff(self, req: GitRequest) -> dict[str, Any]:
        await _require_repo(req.project_root)
        _, out, _ = await _git(req.project_root, "diff", "--", *req.paths)
        return {"diff": out}

    @activity.defn(name="git_commit")
    async def git_commit(self, req: GitRequest) -> dict[str, Any]:
        await _require_repo(req.project_root)
        for path in req.paths or ["."]:
            confine(req.project_root, path, ["**"], [])
        code, _, err = await _git(req.project_root, "add", "--", *(req.paths or ["."]))
        if code != 0:
            raise ApplicationError(f"git add failed: {err.strip()}", type="GitFailed", non_retryable=True)
        code, out, err = await _git(req.project_root, "commit", "-m", req.message or "kiwi commit")
        if code != 0 and "nothing to commit" in (out + err):
            return {"committed": False, "reason": "nothing to commit"}
        if code != 0:
            raise ApplicationError(f"git commit failed: {err.strip() or out.strip()}", type="GitFailed",
                                   non_retryable=True)
        _, sha, _ = await _git(req.project_root, "rev-parse", "HEAD")
        return {"committed": True, "sha": sha.strip()}
