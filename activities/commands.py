"""``shell.run``, local tools and ``git.*``: child processes, never a shell."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from temporalio import activity

from activities import confinement, gitnamed, setaside
from activities.diskchecks import _checked_cwd, _confinement, _deleted_folders, _denied, _parse_output, _stamp
from activities.localtools import _check_parameters, _check_requirements, typed_parameters
from activities.placewatch import _holdable, _made_and_aside, _settings_in_reach, _Watch, _written_now
from activities.process import run_process
from activities.repochecks import _check_git_repository, git_identity
from activities.toolenv import lib_folder, tool_python
from activities.unpacking import _unpack
from kiwi.contracts import CommandRequest, LocalToolRequest
from kiwi.errors import ToolFailed, ToolNotFound, ToolTypeUnsupported
from kiwi.shellpolicy import ShellVerdict, program_name, unpacking
from kiwi.upstream.pool import scrub, scrub_text

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


def _unexpanded(words: list[str], cwd: str) -> list[str]:
    """The words that look like a shell's wildcard patterns and name no file: a shell would have expanded them."""
    return [
        w
        for w in words
        if not w.startswith("-") and any(c in w for c in "*?[") and not os.path.lexists(os.path.join(cwd, w))
    ]


class CommandActivities:
    @activity.defn(name="run_command")
    async def run_command(self, req: CommandRequest) -> dict[str, Any]:
        # On a thread: a command of many paths (16,000 at the 64 KiB limit) takes a quarter of a second to
        # check on disk, which on the event loop every run of the worker waited for.
        cwd, paths, modeled, named = await asyncio.to_thread(_checked_cwd, req)
        # git looks for a repository no higher than the project's own folder.
        env = {**req.env, "GIT_CEILING_DIRECTORIES": os.path.dirname(os.path.realpath(req.project_root))}
        if program_name(req.argv[0]) == "tar":
            # A -T list is names only: GNU tar also reads options there (-C /elsewhere), which Kiwi never saw.
            # An archive named HOST:PATH is a file here, not a remote one reached by running rsh or ssh.
            env["TAR_OPTIONS"] = "--verbatim-files-from --force-local"
        argv = req.argv
        if program_name(argv[0]) == "rg" and not confinement.available():
            # rg reads the ignore files of every folder above the one it searches, out of the project too, and
            # prints a line it cannot parse in its error (review s30: `outer/.ignore` above the project; rg 13
            # reads them with --no-ignore-parent too): where no wall keeps it in, it reads no ignore file. First
            # (a `--` may be an option's value: `rg -e -- x`); Kiwi refuses the options that undo it.
            argv = [argv[0], "--no-ignore", *argv[1:]]
        git_config: list[tuple[str, str]] = []
        if program_name(req.argv[0]) == "git":
            git_config = await _check_git_repository(req, str(cwd), env)
            await _deleted_folders(req, paths, str(cwd), env)
            env = {**await git_identity(str(cwd), req.project_root), **env}
        unpack = unpacking(req.argv, req.cwd or ".")
        if isinstance(unpack, ShellVerdict):
            raise _denied(f"{unpack.reason} ({unpack.hint})" if unpack.hint else unpack.reason)
        if unpack is not None:
            return await _unpack(req, unpack, cwd, env)
        root = os.path.realpath(req.project_root)
        missing = confinement.not_made(root, req.write_grants)
        watch = _Watch.of(req, paths, modeled, root)
        settings = await asyncio.to_thread(_settings_in_reach, req, watch, named)
        settings_before = {item: gitnamed.identity(root, item) for item in settings}
        before = await asyncio.to_thread(watch.look, confinement.NESTED_WALK_LIMIT)
        held = watch.held(before or {})
        if watch.whole and before is None:
            raise _denied(
                f"'{os.path.basename(req.argv[0])}' is a program Kiwi does not model, which may write "
                f"{', '.join(repr(f or '.') for f in watch.folders)} whole, and Kiwi looks there after it for a "
                f"repository or Kiwi project it made; past {confinement.NESTED_WALK_LIMIT:,} entries it does "
                "not (grant the folders it writes, narrower, or use a program Kiwi models)"
            )
        if before is None:
            # (A program Kiwi models, in a project past the limit: what it writes and the folders above are
            # looked at, not the rest of what the wall lets it write; README: Repositories by their layout.)
            watch.folders = []
            before = await asyncio.to_thread(watch.look, None)
            held = watch.held(before)
        held = sorted({*held, *(item.place for item in settings if _holdable(root, item, watch.whole))})
        holdable = confinement.available() and not confinement.namespaces_refused()
        if watch.whole and held and not holdable and confinement.available():
            raise _denied(
                f"'{os.path.basename(req.argv[0])}' is a program Kiwi does not model, which may write "
                f"{', '.join(repr(f or '.') for f in watch.folders)} whole, where "
                f"{', '.join(held[:5])} {'is' if len(held) == 1 else 'are'}, whose settings a human's git or kiwi "
                "obeys; they are held read-only for it in a namespace of the command's own, which this kernel "
                f"does not give ({confinement.namespaces_refused()}): grant narrower folders, or use a program "
                "Kiwi models"
            )
        # (A program Kiwi models, where nothing can be held: the checks of its words keep it out of a
        # repository by its layout, and one whose settings it changed all the same, `cp -r stage/. fixtures/`,
        # is found after it by its settings and loses its HEAD.)
        try:
            result = await run_process(
                argv,
                cwd=str(cwd),
                project=req.project_root,
                timeout=req.timeout_seconds,
                max_output=req.max_output_bytes,
                stdin=req.stdin,
                env=env,
                git_config=git_config,
                confine=_confinement(req, nested=held),
            )
        finally:
            # (All of what it made, however many: past a limit, a `.git` it made stayed, review s30.)
            watch.written += _written_now(req, paths, modeled)
            after = await asyncio.to_thread(watch.look, None)
            missing += watch.made(before, after or {})
            changed = [
                item for item, found in settings_before.items() if gitnamed.identity(root, item) != found
            ]
            # (What a glob a setting runs matches now and did not before: `scripts/lint-*.sh` made, round 4.)
            changed += [m for m in gitnamed.with_matches(root, settings) if m not in settings_before]
            missing += [item.place for item in changed]
            moved = setaside.set_aside(root, missing, _stamp()) if missing else []
        if changed:
            aside = dict(moved)
            activity.logger.warning("a shell command changed files git's settings name, set aside: %s", moved)
            raise _denied(
                "the command changed "
                + ", ".join(
                    f"'{item.place}', which git's settings name ({item.why}), set aside for a human to look at: "
                    + (
                        f"'{aside[item.place]}'"
                        if aside.get(item.place)
                        else "(removed, or could not be moved)"
                    )
                    for item in changed
                )
                + "; Kiwi changes such a file only where a write grant names it"
            )
        if moved:
            activity.logger.warning("a shell command made protected places, set aside: %s", moved)
            raise _denied(
                f"the command made {_made_and_aside(moved)}; only a grant naming a protected place reaches it (one "
                "that was not there, so the kernel could not hold it)"
            )
        answer = {
            "exit_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "truncated": result.truncated,
        }
        patterns = _unexpanded(req.argv[1:], str(cwd)) if result.exit_code else []
        if patterns:
            # (README trial s38: `wc -l data/*.txt` failed with "No such file", and nothing said why.)
            answer["note"] = (
                f"nothing expands {', '.join(patterns[:3])}: Kiwi runs the program without a shell, so it got the "
                "pattern as a name; name each file (filesystem.list lists a folder)"
            )
        return answer

    @activity.defn(name="run_local_tool")
    async def run_local_tool(self, req: LocalToolRequest) -> Any:
        tool = req.tool
        entry = Path(tool.entrypoint)
        if not entry.is_file():
            raise ToolNotFound.error(f"tool '{tool.tool_id}': entrypoint {entry.name} is missing")
        _check_parameters(tool, req.params)
        req = req.model_copy(update={"params": typed_parameters(tool, req.params)})
        passed = _check_requirements(tool)
        if tool.tool_type == "python":
            # -P: nothing from the working folder (the project, which agents may write) is imported: with
            # -c, Python put it first on the import path, and a json.py there ran in place of the runner's.
            argv = [await tool_python(tool), "-P", "-c", _PYTHON_RUNNER, str(entry)]
            env = dict(passed)
            lib = lib_folder(tool.entrypoint)
            if lib:
                env["PYTHONPATH"] = lib
        elif tool.tool_type == "bash":
            argv = ["bash", str(entry), *[str(v) for v in req.params.values()]]
            env = {
                **passed,
                **{
                    f"KIWI_PARAM_{k.upper()}": v if isinstance(v, str) else json.dumps(v)
                    for k, v in req.params.items()
                },
            }
        else:
            raise ToolTypeUnsupported.error(
                f"tool '{tool.tool_id}' has type {tool.tool_type}, which this worker cannot run yet"
            )
        # Any Python the tool starts (a bash tool's `python3 -m json.tool`) puts nothing of its working folder,
        # the project, on its import path either (second s18 review).
        env.setdefault("PYTHONSAFEPATH", "1")
        result = await run_process(
            argv,
            cwd=req.project_root,
            project=req.project_root,
            timeout=tool.timeout_seconds,
            max_output=req.max_output_bytes,
            stdin=json.dumps(req.params),
            env=env,
        )
        # (What was cut is never shown: a secret the cut split would be no longer whole where it is scrubbed.)
        if result.exit_code != 0:
            shown = result.stderr or result.stdout
            lines = shown.strip().splitlines()
            cut = result.truncated and len(shown.encode()) >= req.max_output_bytes  # (this stream was cut)
            tail = lines[:-1][-5:] if cut else lines[-5:]
            raise ToolFailed.error(
                scrub_text(
                    scrub(
                        f"tool '{tool.tool_id}' exited with {result.exit_code}: " + " | ".join(tail), passed
                    )
                )
            )
        if result.truncated:
            raise ToolFailed.error(f"tool '{tool.tool_id}' printed more than {req.max_output_bytes:,} bytes")
        try:
            return scrub(_parse_output(result.stdout), passed)
        except json.JSONDecodeError as exc:
            raise ToolFailed.error(f"tool '{tool.tool_id}' printed invalid JSON: {exc}") from None
