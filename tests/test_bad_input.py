"""Bad input from an (untrusted) agent or a careless author: a clear, typed error, never a stuck run or a traceback."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path

import pytest
from mcp.client import Client

from kiwi.cli import main as kiwi_main
from kiwi.errors import ItemInvalid, KiwiError
from kiwi.toolargs import (
    MAX_COMMAND_BYTES,
    MAX_CONTENT_BYTES,
    ArgumentError,
    check_arguments,
    coerce_step_arguments,
    unsendable,
)
from mcp_frontend.server import build_server
from tests.helpers import awaiting_step, directive_md, write, write_directive

NPM = Path(__file__).parent / "npm" / "node_modules" / "@modelcontextprotocol"
EVERYTHING = NPM / "server-everything" / "dist" / "index.js"

WORKBENCH = directive_md(
    '<step name="work"><action>Work.</action></step>',
    name="workbench",
    permissions='<read resource="filesystem" path="**"/><write resource="filesystem" path="notes/**"/>'
    '<execute resource="shell" commands="echo"/><execute resource="tool" id="git.commit"/>'
    '<execute resource="tool" id="directive.run"/>',
)

TYPES_TOOL = """\
tool_id: show_types
tool_type: python
executor: {type: python, entrypoint: main.py}
parameters:
  - {name: count, type: integer, required: true}
  - {name: ratio, type: number}
  - {name: loud, type: boolean}
  - {name: items, type: array}
  - {name: options, type: object}
  - {name: label, type: string}
"""
TYPES_MAIN = """\
def main(**params):
    return {name: [type(value).__name__, value] for name, value in params.items()}
"""


# ---------------------------------------------------------------- the pure rules
@pytest.mark.parametrize(
    ("tool", "args", "names"),
    [
        ("shell.run", {"command": "echo hi", "timeout": "abc"}, "'timeout' must be a number"),
        ("shell.run", {"command": "echo hi", "timeout": float("inf")}, "'timeout' must be a finite number"),
        ("shell.run", {"command": "echo hi", "timeout": -1}, "'timeout' must be more than 0"),
        ("shell.run", {"command": "echo hi", "timeout": 10**9}, "'timeout' must be at most 3600"),
        ("shell.run", {"argv": "echo hi"}, "'argv' must be a JSON array"),
        ("shell.run", {"argv": ["echo", 3]}, "'argv' item 1 must be a string"),
        ("shell.run", {}, "'command' (a string) or 'argv'"),
        (
            "filesystem.write",
            {"path": "notes/a", "content": "x", "encoding": "latin-1"},
            '\'encoding\' must be one of "utf-8", "base64"',
        ),
        (
            "filesystem.write",
            {"path": "notes/a", "content": "x" * (MAX_CONTENT_BYTES + 1)},
            "'content' is 1,000,001 bytes, over the limit",
        ),
        ("filesystem.write", {"path": "notes/a", "content": {"a": 1}}, "'content' must be a string"),
        ("filesystem.read", {"path": ["a"]}, "'path' must be a string"),
        ("filesystem.read", {}, "'path' is required"),
        ("filesystem.move", {"source": "a"}, "'destination' is required"),
        ("git.commit", {"message": "m", "paths": "src/app.py"}, "'paths' must be a JSON array"),
        ("directive.run", {"directive": "child", "inputs": "x=1"}, "'inputs' must be a JSON object"),
        ("directive.run", {"inputs": {}}, "'directive' (the directive's name) is required"),
        ("files.read_text_file", {"path": "x" * 1_600_000}, "over the limit of 1,500,000"),
        (
            "git.commit",
            {"message": "m", "paths": ["a"], "extra": 1},
            "no argument 'extra'; it takes paths, message",
        ),
    ],
)
def test_wrong_arguments_name_the_argument_and_what_to_send(tool, args, names):
    problem = check_arguments(tool, args)
    assert problem is not None and names in problem.reason, problem
    assert tool in problem.reason and (problem.hint or tool.startswith("files."))


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("shell.run", {"command": "echo hi", "timeout": "30"}),
        ("shell.run", {"argv": ["echo", "hi"], "timeout": 2.5, "cwd": "."}),
        ("filesystem.write", {"path": "notes/a", "content": "x" * MAX_CONTENT_BYTES, "encoding": "utf-8"}),
        ("filesystem.list", {}),
        ("git.commit", {"message": "m", "paths": ["a"]}),
        # Kiwi MCP's other arguments to its meta-tools (the compat directives send them): taken, ignored.
        ("kiwi-mcp.search", {"query": "x", "source": "local", "sort_by": "score"}),
        ("kiwi-mcp.load", {"tool_name": "t", "sections": "all"}),
        ("files.anything", {"nested": {"deep": [1, 2, None]}}),
    ],
)
def test_right_arguments_pass(tool, args):
    assert check_arguments(tool, args) is None


def test_step_text_is_typed_by_the_schema_and_a_lone_placeholder_keeps_its_type():
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "on": {"type": "boolean"},
            "list": {"type": "array"},
            "obj": {"type": "object"},
            "text": {"type": "string"},
            "maybe": {"type": ["integer", "null"]},
            "either": {"anyOf": [{"type": "number"}, {"type": "string"}]},
            "kept": {"type": "integer"},
        },
    }
    raw = {
        "n": "3",
        "x": "2.5",
        "on": "false",
        "list": '["a", 1]',
        "obj": '{"k": [1]}',
        "text": "42",
        "maybe": "null",
        "either": "7",
        "kept": "{inputs.k}",
        "undeclared": "5",
    }
    rendered = {**raw, "kept": "9"}
    typed = coerce_step_arguments("t", raw, rendered, schema)
    assert typed == {
        "n": 3,
        "x": 2.5,
        "on": False,
        "list": ["a", 1],
        "obj": {"k": [1]},
        "text": "42",
        "maybe": None,
        "either": "7",
        "kept": "9",
        "undeclared": "5",
    }
    assert coerce_step_arguments("t", raw, rendered, None) == rendered
    with pytest.raises(ArgumentError) as bad:
        coerce_step_arguments("t", {"n": "three"}, {"n": "three"}, schema)
    assert bad.value.reason == "t: parameter 'n' must be an integer, got the text 'three'"
    assert "a whole number" in bad.value.hint
    with pytest.raises(ArgumentError) as bad_list:
        coerce_step_arguments("t", {"list": "a, b"}, {"list": "a, b"}, schema)
    assert "parameter 'list' must be a JSON array" in bad_list.value.reason


# ---------------------------------------------------------------- through real runs
async def _workbench(runs, project) -> str:
    write_directive(project / ".ai" / "directives" / "workbench.md", WORKBENCH)
    run_id = await runs.start("workbench", {})
    await awaiting_step(runs, run_id, "work")
    return run_id


@pytest.mark.parametrize(
    ("tool", "args", "names"),
    [
        ("shell.run", {"command": "echo hi", "timeout": "abc"}, "argument 'timeout'"),
        ("shell.run", {"command": "echo hi", "timeout": 1e308}, "argument 'timeout'"),
        (
            "filesystem.write",
            {"path": "notes/a.txt", "content": "x", "encoding": "latin-1"},
            "argument 'encoding'",
        ),
        ("filesystem.write", {"path": "notes/a.txt", "content": "é" * 1_000_000}, "argument 'content'"),
        ("git.commit", {"message": "m", "paths": 3}, "argument 'paths'"),
        ("directive.run", {"directive": "workbench", "inputs": []}, "argument 'inputs'"),
        # Arguments a built-in does not take (review s33: dropped, so a misspelt content wrote an empty file).
        ("filesystem.write", {"path": "notes/a.txt", "contnet": "x"}, "no argument 'contnet'"),
        ("filesystem.read", {"path": "notes/a.txt", "offset": 5}, "no argument 'offset'"),
        ("filesystem.read", {"path": "notes/a.txt", "max_bytes": -5}, "'max_bytes' must be at least 1"),
        (
            "filesystem.read",
            {"path": "a", "max_bytes": 1000001},
            "'max_bytes' must be at most 1000000, got 1000001",
        ),
        ("filesystem.read", {"path": "notes/a.txt", "max_bytes": "5"}, "'max_bytes' must be an integer"),
        ("shell.run", {"command": "echo hi", "env": {"A": "1"}}, "no argument 'env'"),
    ],
)
async def test_a_wrong_argument_is_an_input_error_at_once_and_the_run_carries_on(
    runs, project, tool, args, names
):
    run_id = await _workbench(runs, project)
    result = await asyncio.wait_for(runs.call_tool(run_id, tool, args), timeout=20)
    assert result.status == "error" and result.error_type == "InputInvalid", result
    assert names in result.reason and result.hint
    assert not (project / "notes" / "a.txt").exists()
    fine = await runs.call_tool(run_id, "shell.run", {"command": "echo still here", "timeout": "30"})
    assert fine.status == "ok" and fine.result["stdout"].strip() == "still here"
    status = await runs.status(run_id)
    assert status.status == "awaiting_agent"
    # Arguments too large to send are answered by the client; the run refuses (and records) the rest.
    assert [c.status for c in status.last_calls] == (["ok"] if unsendable(tool, args) else ["error", "ok"])


async def test_filesystem_read_reads_max_bytes_at_most_and_says_it_cut(runs, project):
    """README trial s34: the README and a step's hint name filesystem.read's max_bytes, and the run dropped it,
    reading the whole file."""
    run_id = await _workbench(runs, project)
    write(project / "notes" / "long.md", "0123456789" * 10)
    head = await runs.call_tool(run_id, "filesystem.read", {"path": "notes/long.md", "max_bytes": 4})
    assert head.status == "ok", head
    assert (head.result["content"], head.result["size"], head.result["truncated"]) == ("0123", 100, True)
    whole = await runs.call_tool(run_id, "filesystem.read", {"path": "notes/long.md", "max_bytes": 100})
    assert (whole.result["content"], whole.result["truncated"]) == ("0123456789" * 10, False)
    # A cut inside a character stays text, cut before it (second review s34: it came back as base64).
    write(project / "notes" / "accents.md", "é€…")
    cut = await runs.call_tool(run_id, "filesystem.read", {"path": "notes/accents.md", "max_bytes": 4})
    assert (cut.result["content"], cut.result["truncated"], cut.result.get("encoding")) == (
        "é",
        True,
        None,
    ), cut


async def test_three_megabytes_of_content_is_refused_with_the_limit_before_it_reaches_the_run(
    runs, project, temporal_env
):
    run_id = await _workbench(runs, project)
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:

        async def execute(**arguments):
            result = await asyncio.wait_for(client.call_tool("execute", arguments), timeout=20)
            return result.structured_content or json.loads(result.content[0].text)

        big = await execute(
            item_type="tool",
            action="call",
            run_id=run_id,
            item_id="filesystem.write",
            parameters={"path": "notes/big.txt", "content": "x" * 3_000_000},
        )
        # Answered typed, as the run answers arguments that do not fit (one shape for one mistake, README trial
        # s33: an MCP error for a built-in tool, a typed result for a local one), recorded by no run.
        assert (big["status"], big["error_type"], big["call_seq"]) == ("error", "InputInvalid", 0), big
        assert "argument 'content' is 3,000,000 bytes" in big["reason"], big
        huge = await execute(
            item_type="tool",
            action="call",
            run_id=run_id,
            item_id="word_count",
            parameters={"text": "x " * 1_000_000},
        )
        assert huge["error_type"] == "InputInvalid" and "over the limit of 1,500,000" in huge["reason"], huge
        # A missing argument of a built-in tool: the shape the run gives a local tool's (status error, InputInvalid).
        wrong = await execute(
            item_type="tool",
            action="call",
            run_id=run_id,
            item_id="filesystem.read",
            parameters={"file": "a"},
        )
        assert (wrong["status"], wrong["error_type"]) == ("error", "InputInvalid"), wrong
        assert "'path' is required" in wrong["reason"] and "path" in wrong["hint"], wrong
        fine = await execute(
            item_type="tool",
            action="call",
            run_id=run_id,
            item_id="filesystem.write",
            parameters={"path": "notes/ok.txt", "content": "small"},
        )
        assert fine["status"] == "ok", fine
    assert (
        not (project / "notes" / "big.txt").exists() and (project / "notes" / "ok.txt").read_text() == "small"
    )
    assert (await runs.status(run_id)).status == "awaiting_agent"


async def test_the_run_client_answers_an_oversized_call_itself_and_the_run_carries_on(runs, project):
    """A caller using RunClient directly: an update this large would leave the run retrying it."""
    run_id = await _workbench(runs, project)
    big = await runs.call_tool(run_id, "word_count", {"text": "x " * 1_000_000})
    assert big.status == "error" and big.error_type == "InputInvalid" and "1,500,000" in big.reason
    fine = await runs.call_tool(run_id, "filesystem.write", {"path": "notes/ok.txt", "content": "small"})
    assert fine.status == "ok" and (project / "notes" / "ok.txt").read_text() == "small"


async def test_step_parameters_are_typed_for_local_mcp_and_built_in_tools(runs, project):
    write(project / ".ai" / "tools" / "show_types" / "tool.yaml", TYPES_TOOL)
    write(project / ".ai" / "tools" / "show_types" / "main.py", TYPES_MAIN)
    write(
        project / ".ai" / "config" / "mcp_registry.yaml",
        f'mcps:\n  everything:\n    command: node\n    args: ["{EVERYTHING}", "stdio"]\n',
    )
    write_directive(
        project / ".ai" / "directives" / "typed.md",
        directive_md(
            '<step name="local"><tool_call tool="show_types"><param name="count">3</param>'
            '<param name="ratio">0.5</param><param name="loud">true</param><param name="items">["a", "b"]</param>'
            '<param name="options">{"deep": {"n": 1}}</param><param name="label">{inputs.label}</param>'
            "</tool_call></step>"
            '<step name="upstream"><tool_call tool="everything.get-sum"><param name="a">2</param>'
            '<param name="b">{inputs.b}</param></tool_call></step>'
            '<step name="builtin"><tool_call tool="shell.run"><param name="argv">["echo", "typed"]</param>'
            '<param name="timeout">30</param></tool_call></step>',
            name="typed",
            tools='<tools><mcp name="everything" required="true"/></tools>',
            inputs='<input name="label" type="string" required="true"/><input name="b" type="integer" required="true"/>',
            permissions='<execute resource="tool" id="show_types"/><execute resource="mcp" name="everything" '
            'actions="get-sum"/><execute resource="shell" commands="echo"/>'
            '<read resource="filesystem" path="**"/>',
        ),
    )
    run_id = await runs.start("typed", {"label": "007", "b": "40"})
    result = await runs.handle(run_id).result()
    assert result.status == "completed", result.error
    assert result.outputs["local"]["result"] == {
        "count": ["int", 3],
        "ratio": ["float", 0.5],
        "loud": ["bool", True],
        "items": ["list", ["a", "b"]],
        "options": ["dict", {"deep": {"n": 1}}],
        "label": ["str", "007"],
    }
    assert "42" in result.outputs["upstream"]["result"]["content"][0]["text"]
    assert result.outputs["builtin"]["result"]["stdout"].strip() == "typed"


@pytest.mark.parametrize(
    ("param", "names"),
    [
        (
            '<tool_call tool="show_types"><param name="count">many</param></tool_call>',
            "show_types: parameter 'count' must be an integer, got the text 'many'",
        ),
        (
            '<tool_call tool="shell.run"><param name="command">echo hi</param><param name="timeout">abc</param>'
            "</tool_call>",
            "shell.run: parameter 'timeout' must be a number",
        ),
        (
            '<tool_call tool="filesystem.write"><param name="path">notes/x</param><param name="encoding">latin-1'
            "</param></tool_call>",
            "filesystem.write: parameter 'encoding' must be one of",
        ),
    ],
)
async def test_a_step_parameter_that_does_not_fit_fails_the_step_before_the_call(runs, project, param, names):
    write(project / ".ai" / "tools" / "show_types" / "tool.yaml", TYPES_TOOL)
    write(project / ".ai" / "tools" / "show_types" / "main.py", TYPES_MAIN)
    write_directive(
        project / ".ai" / "directives" / "untyped.md",
        directive_md(
            f'<step name="call">{param}</step>',
            name="untyped",
            permissions='<execute resource="tool" id="show_types"/><execute resource="shell" commands="echo"/>'
            '<write resource="filesystem" path="notes/**"/>',
        ),
    )
    run_id = await runs.start("untyped", {})
    with pytest.raises(Exception):  # noqa: B017 - the run fails; its status says why
        await runs.handle(run_id).result()
    status = await runs.status(run_id)
    assert status.status == "failed" and names in status.error, status.error
    assert [s.status for s in status.steps] == ["failed"]
    assert status.calls == 0 and not (project / "notes" / "x").exists()


async def test_a_step_parameter_a_built_in_does_not_take_is_refused_and_kiwi_validate_names_it(runs, project):
    """Review s33: a misspelt <param> of a built-in was dropped, so `contnet` wrote an empty notes/x (or emptied
    one that was there). `kiwi validate` names it with the spelling meant; the run refuses the call."""
    from kiwi.items.validation import validate_file

    write(project / "notes" / "x", "kept")
    path = project / ".ai" / "directives" / "misspelt.md"
    write_directive(
        path,
        directive_md(
            '<step name="call"><tool_call tool="filesystem.write"><param name="path">notes/x</param>'
            '<param name="contnet">made</param></tool_call></step>',
            name="misspelt",
            permissions='<write resource="filesystem" path="notes/**"/>',
        ),
    )
    checked = validate_file(path)
    assert checked["valid"] is False
    assert [p["message"] for p in checked["problems"] if p["severity"] == "error"] == [
        "step \"call\": filesystem.write has no <param> 'contnet'; it takes path, encoding, content "
        "(send it as 'content')"
    ]
    run_id = await runs.start("misspelt", {})
    with pytest.raises(Exception):  # noqa: B017 - the run fails; its status says why
        await runs.handle(run_id).result()
    status = await runs.status(run_id)
    assert status.status == "failed" and "filesystem.write has no argument 'contnet'" in status.error, status
    assert [(c.status, c.origin) for c in status.last_calls] == [("error", "step")], status.last_calls
    assert (project / "notes" / "x").read_text() == "kept"


async def test_a_failed_call_fails_its_step_visibly(runs, project):
    write_directive(
        project / ".ai" / "directives" / "reads.md",
        directive_md(
            '<step name="read"><tool_call tool="filesystem.read"><param name="path">notes/missing.md</param>'
            '</tool_call></step><step name="after"><action>x</action></step>',
            name="reads",
            permissions='<read resource="filesystem" path="notes/**"/>',
        ),
    )
    run_id = await runs.start("reads", {})
    with pytest.raises(Exception):  # noqa: B017
        await runs.handle(run_id).result()
    status = await runs.status(run_id)
    assert status.status == "failed" and "filesystem.read error" in status.error
    assert [(s.name, s.status) for s in status.steps] == [("read", "failed"), ("after", "pending")]


# ---------------------------------------------------------------- config files
BOMB = (
    "\n".join(
        ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
        + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]
    )
    + "\n"
)


@pytest.mark.parametrize(
    "where", [".ai/config/agent_harness.yaml", ".ai/config/mcp_registry.yaml", ".ai/tools/bomb/tool.yaml"]
)
def test_a_yaml_alias_bomb_in_any_config_file_is_refused_fast_naming_the_file(
    tmp_path, monkeypatch, capsys, where
):
    from kiwi.harness import load_harness
    from kiwi.upstream.registry import load_registry

    monkeypatch.chdir(tmp_path)
    assert kiwi_main(["init"]) == 0
    text = BOMB if not where.endswith("tool.yaml") else "tool_id: bomb\ntool_type: python\n" + BOMB
    write(tmp_path / where, text)
    capsys.readouterr()
    started = time.monotonic()
    if where.endswith("tool.yaml"):
        assert kiwi_main(["validate", str(tmp_path / where)]) == 1
        shown = "".join(capsys.readouterr())
    else:
        with pytest.raises(ItemInvalid) as refused:
            (load_harness if "harness" in where else load_registry)(tmp_path, tmp_path / "user")
        shown = str(refused.value.problems[0])
    assert time.monotonic() - started < 5
    assert where.rsplit("/", 1)[-1] in shown and "aliases are expanded" in shown and "Traceback" not in shown


def test_yaml_limits_refuse_the_bomb_but_read_ordinary_aliases(tmp_path):
    from kiwi import yamltext

    started = time.monotonic()
    with pytest.raises(ItemInvalid) as refused:
        yamltext.read(write(tmp_path / "bomb.yaml", BOMB))
    assert time.monotonic() - started < 2
    problem = refused.value.problems[0]
    assert problem.path.endswith("bomb.yaml") and "aliases are expanded" in problem.message
    with pytest.raises(ItemInvalid) as big:
        yamltext.read(write(tmp_path / "big.yaml", "k: " + "x" * 1_100_000))
    assert "over the limit" in big.value.problems[0].message
    with pytest.raises(ItemInvalid) as recursive:
        yamltext.read(write(tmp_path / "loop.yaml", "a: &a [1, *a]\n"))
    assert "recursive" in recursive.value.problems[0].message
    shared = yamltext.read(write(tmp_path / "ok.yaml", "base: &base {timeout: 5}\none: *base\ntwo: *base\n"))
    assert shared == {"base": {"timeout": 5}, "one": {"timeout": 5}, "two": {"timeout": 5}}


# ---------------------------------------------------------------- the command line
@pytest.mark.parametrize(
    ("argv", "says", "fix"),
    [
        (
            ["call", "filesystem.read", "[1,2]"],
            "arguments must be a JSON object of named arguments, got an array",
            'kiwi call filesystem.read \'{"path"',
        ),
        (["call", "filesystem.read", "{bad"], "arguments are not JSON", "a JSON object"),
        (
            ["call", "shell.run", '{"command": "ls", "timeout": "abc"}'],
            "shell.run: argument 'timeout' must be a number",
            '"timeout": 120',
        ),
        (["validate", "/nonexistent"], "no such file or folder: /nonexistent", "kiwi validate .ai"),
        (
            ["run", "hello_kiwi", "--deadline", "-5"],
            "--deadline must be a positive number of seconds, got -5",
            "--deadline 3600",
        ),
        (["run", "hello_kiwi", "--input", "oops"], "input 'oops' is not KEY=VALUE", "--input name="),
    ],
)
def test_cli_mistakes_are_one_clear_error_and_a_non_zero_exit(project, capsys, argv, says, fix):
    # An address nobody listens on: each mistake is caught before Temporal is asked anything.
    code = kiwi_main([*argv, *(["--address", "127.0.0.1:9"] if argv[0] in ("call", "run") else [])])
    out = capsys.readouterr()
    assert code == 1 and out.out == ""
    assert out.err.startswith(f"kiwi: {says}") and fix in out.err, out.err
    assert "Traceback" not in out.err and "cannot reach Temporal" not in out.err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_cli_validate_reports_an_unreadable_item_instead_of_failing(project, capsys):
    locked = project / ".ai" / "directives" / "hello_kiwi.md"
    locked.chmod(0)
    assert kiwi_main(["validate", str(locked)]) == 1
    out = capsys.readouterr()
    assert "FAIL" in out.out and "cannot read the file" in out.out


def test_validate_and_sign_take_a_folder_inside_an_item_folder(tmp_path, monkeypatch, capsys):
    # `kiwi validate .ai/directives/drafts` found no item files (only the item folder itself, or a folder
    # holding one, counted), and `kiwi sign` of it signed nothing, silently, with exit code 0.
    monkeypatch.chdir(tmp_path)
    assert kiwi_main(["init"]) == 0
    drafts = tmp_path / ".ai" / "directives" / "drafts"
    drafts.mkdir()
    hello = (tmp_path / ".ai" / "directives" / "hello_kiwi.md").read_text()
    (drafts / "hello_again.md").write_text(hello.replace("Write the greeting<", "Write the greeting again<"))
    capsys.readouterr()
    assert kiwi_main(["validate", str(drafts)]) == 0
    shown = capsys.readouterr().out
    assert "hello_again.md (directive: hello_kiwi)" in shown and "modified after signing" in shown
    assert kiwi_main(["sign", str(drafts)]) == 0
    assert "signed " in capsys.readouterr().out
    assert kiwi_main(["validate", str(drafts)]) == 0
    assert "signature valid" in capsys.readouterr().out
    # A folder with no items in it is said to have none, by both, with exit code 1.
    empty = tmp_path / ".ai" / "directives" / "empty"
    empty.mkdir()
    assert kiwi_main(["validate", str(empty)]) == 1
    assert "no item files found" in capsys.readouterr().err
    assert kiwi_main(["sign", str(empty)]) == 1
    assert "no item files found" in "".join(capsys.readouterr())


async def test_with_several_keys_the_hint_names_the_option_of_the_command(
    runs, project, tmp_path_factory, monkeypatch
):
    # `kiwi approve`, `resume` and `decide` take the key as --as (or --by); their hint said --key, which
    # they refuse. `kiwi sign` takes --key.
    from kiwi.keys import create_key, default_key

    monkeypatch.setenv("KIWI_KEYS_DIR", str(tmp_path_factory.mktemp("keys")))
    create_key("alice")
    create_key("bob")
    with pytest.raises(KiwiError) as signing:
        default_key()
    assert signing.value.hint == "choose one with --key NAME"
    with pytest.raises(KiwiError) as approving:
        default_key(None, option="--as")
    assert approving.value.hint == "choose one with --as NAME"
    # RunClient picks the key once it knows the run is one (README trial s39: a misspelt run was told to choose a
    # key), before it asks the run anything.
    run_id = await runs.start("hello_kiwi", {"name": "Ada"})
    for action in (
        runs.resume(run_id),
        runs.decide_approval(run_id, "approval-1", True),
        runs.decide(run_id, "decision-1", "yes"),
    ):
        with pytest.raises(KiwiError) as refused:
            await action
        assert refused.value.hint == "choose one with --as NAME"
    await runs.cancel(run_id)


@pytest.mark.parametrize(
    "argv", [["dev", "--port", "99999"], ["dev", "--mcp-port", "http"], ["worker", "--health-port", "0"]]
)
def test_a_port_out_of_range_is_a_usage_error_not_a_traceback(project, capsys, argv):
    # `kiwi dev --port 99999` ended in an OverflowError traceback from the port check.
    assert kiwi_main(argv) == 2
    err = capsys.readouterr().err
    assert "is no port number: give one from 1 to 65535" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "group, actions",
    [
        ("keys", ["init", "list"]),
        ("registry", ["migrate", "status", "yank", "versions", "add-publisher"]),
        ("tools", ["proposals", "accept"]),
        ("payloads", ["prune"]),
    ],
)
def test_a_command_group_without_its_action_lists_the_actions(project, capsys, group, actions):
    # Review s36: `kiwi keys` alone said "the following arguments are required: ACTION" and not which.
    assert kiwi_main([group]) == 2
    err = capsys.readouterr().err
    assert f"kiwi {group}: error: the following arguments are required: ACTION" in err, err
    listed = err.split("  ACTION\n", 1)[1]
    for action in actions:
        assert re.search(rf"^    {action}\b", listed, re.M), (action, err)


@pytest.mark.parametrize(
    "argv, usage, said",
    [
        (
            ["run", "hello_kiwi", "--wiat"],
            "usage: kiwi run ",
            "unrecognized arguments: --wiat (did you mean --wait?)",
        ),
        (["audti"], "usage: kiwi ", "invalid choice: 'audti' (choose from "),
        (["registry", "stauts"], "usage: kiwi registry ", "; did you mean 'status'?"),
    ],
)
def test_a_misspelt_command_or_option_names_the_one_meant(project, capsys, argv, usage, said):
    # README trial s37: `kiwi run ... --wiat` printed kiwi's own usage, `kiwi audti` every command, neither the
    # one meant (Python 3.11's argparse suggests nothing).
    assert kiwi_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and said in err, err
    if argv == ["audti"]:
        assert err.rstrip().endswith("did you mean 'audit'?"), err


@pytest.mark.parametrize("line", ["port: abc", "port: 99999", "ui_port: -1"])
def test_a_port_out_of_range_in_temporal_dev_yml_names_the_file_and_the_fix(project, capsys, line):
    (project / "temporal-dev.yml").write_text(f"temporal:\n  {line}\n")
    assert kiwi_main(["dev", "--config", str(project / "temporal-dev.yml")]) == 1
    err = capsys.readouterr().err
    option = line.split(":")[0]
    assert (
        f"temporal-dev.yml: temporal.{option} is " in err and "expected a port number from 1 to 65535" in err
    )
    assert "Traceback" not in err


def test_an_unknown_option_in_temporal_dev_yml_is_refused_and_commands_beside_it_say_so(project, capsys):
    """README trial s34: `temporal: {prot: 27233}` was taken without a word (kiwi dev on 7233), and with
    `port: "abc"` the commands beside kiwi dev went to the default address silently."""
    (project / "temporal-dev.yml").write_text("temporal:\n  prot: 27233\n")
    assert kiwi_main(["dev", "--config", str(project / "temporal-dev.yml")]) == 1
    err = capsys.readouterr().err
    assert "temporal-dev.yml: unknown option 'prot' in temporal (known: ip, port, " in err, err
    assert "did you mean temporal.port?" in err, err
    (project / "temporal-dev.yml").write_text("tempral:\n  port: 27233\n")
    assert kiwi_main(["dev", "--config", str(project / "temporal-dev.yml")]) == 1
    assert (
        "unknown section 'tempral'" in (err := capsys.readouterr().err) and "did you mean temporal?" in err
    ), err
    (project / "temporal-dev.yml").write_text("temporal:\n  port: abc\n")
    from kiwi.connect import dev_address

    assert dev_address() is None
    assert dev_address() is None
    warned = capsys.readouterr().err
    assert warned.count("kiwi: warning: ") == 1, warned
    assert "temporal.port is 'abc'; expected a port number from 1 to 65535; its address is not used" in warned
    # A mistake in another section is kiwi dev's to say: the commands beside it still take the right address
    # (README trial s34: a typo in `worker` made them drop `temporal.port`).
    (project / "temporal-dev.yml").write_text("temporal:\n  port: 27233\nworker:\n  sandboxd: true\n")
    assert dev_address() == "127.0.0.1:27233"
    assert capsys.readouterr().err == ""


def test_a_folder_without_a_project_stays_one_and_is_said_to_be_one(tmp_path, monkeypatch, capsys):
    # A new-user trial: `kiwi search` in a folder without .ai/ wrote its index to .ai/.cache there, after
    # which every command (kiwi doctor too) took the folder for a project; a missing item's hint was to
    # run `kiwi search`, not `kiwi init`.
    folder = tmp_path / "not-a-project"
    folder.mkdir()
    monkeypatch.chdir(folder)
    assert kiwi_main(["search", "hello"]) == 0
    assert kiwi_main(["show", "hello_kiwi"]) == 1
    assert list(folder.iterdir()) == []
    err = capsys.readouterr().err
    assert f"{folder} is no Kiwi project (no .ai/ at or above it): `kiwi init` makes one here" in err


def test_with_json_an_error_is_json_on_standard_output_too(project, capsys):
    # A new-user trial: `kiwi status run-nope --json` and friends printed their error as text only, so a
    # script reading JSON got nothing.
    code = kiwi_main(["run", "hello_kiwi", "--input", "oops", "--json", "--address", "127.0.0.1:9"])
    out = capsys.readouterr()
    assert code == 1 and out.err.startswith("kiwi: input 'oops' is not KEY=VALUE")
    said = json.loads(out.out)
    assert said["error"] == "InputInvalid" and said["message"].startswith("input 'oops' is not KEY=VALUE")
    assert "--input name=" in said["hint"]


async def test_attack_a_step_command_filled_with_a_huge_input_fails_the_step_before_its_words_are_checked(
    runs, project
):
    """Attack: a signed directive's step runs ``ls {inputs.paths}``; the agent starts it with 300 KB of paths.
    An agent's own shell.run over MAX_COMMAND_BYTES is refused before admission walks its words, but a step's
    command had no limit: admission parsed and checked every path in the run's workflow task. Safe: the step
    fails naming the limit before any word is checked or anything runs; the same step with a short input
    runs."""
    write(project / "notes" / "a.md", "a\n")
    write_directive(
        project / ".ai" / "directives" / "lister.md",
        directive_md(
            '<step name="list"><tool_call tool="shell.run"><param name="command">ls {inputs.paths}</param>'
            "</tool_call></step>",
            name="lister",
            inputs='<input name="paths" type="string" required="true"/>',
            permissions='<execute resource="shell" commands="ls"/><read resource="filesystem" path="**"/>',
        ),
    )
    run_id = await runs.start("lister", {"paths": "notes/a.md " * 30_000})
    with pytest.raises(Exception):  # noqa: B017 - the run fails; its status says why
        await runs.handle(run_id).result()
    status = await runs.status(run_id)
    assert status.status == "failed", status
    assert (
        # (The input is one word of the command since s36: its words with a separator after each.)
        f"step 'list': shell.run: the command is 330,004 bytes, over the limit of {MAX_COMMAND_BYTES:,}"
        in (status.error)
    ), status.error
    assert "fewer paths per command" in status.error
    assert [s.status for s in status.steps] == ["failed"]
    history = await runs.handle(run_id).fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert "run_command" not in scheduled, scheduled
    short = await runs.start("lister", {"paths": "notes/a.md"})
    done = await runs.handle(short).result()
    assert done.status == "completed", done.error
    assert done.outputs["list"]["result"]["stdout"].strip() == "notes/a.md"


def test_command_line_mistakes_found_by_the_s18_trial(project, capsys):
    """`kiwi search approval delete` (unquoted words) was a usage error; `--limit 0` and `-1` printed "no
    runs" and exit 0; a usage error with --json printed argparse's usage, not the JSON the README promises."""
    assert kiwi_main(["search", "hello", "kiwi"]) == 0
    assert "hello_kiwi" in capsys.readouterr().out
    for argv in (["search", "hello", "--limit", "0"], ["runs", "--limit", "-1"]):
        assert kiwi_main(argv) == 2
        assert "is no count: give a whole number from 1 up" in capsys.readouterr().err
    assert kiwi_main(["runs", "--status", "bogus", "--json"]) == 1
    shown = json.loads(capsys.readouterr().out)
    assert shown["error"] == "InputInvalid" and "invalid choice: 'bogus'" in shown["message"]
    assert shown["hint"] == "see `kiwi runs --help`"
    assert kiwi_main(["runs", "--status", "bogus"]) == 2
    assert "usage: kiwi runs" in capsys.readouterr().err


def test_kiwi_status_text_lists_refused_decisions(capsys):
    """Found by the s18 trial: the DecisionRefused hint says `kiwi status RUN` lists refused decisions, but
    only --json had them."""
    from kiwi.cli.statusview import print_status
    from kiwi.contracts import RefusedDecision, RunStatus

    refused = RefusedDecision(
        request_id="approval-1", by="mallory", reason="'mallory' is not a trusted approver"
    )
    print_status(
        RunStatus(
            run_id="run-x",
            directive="d",
            version="1.0.0",
            status="awaiting_approval",
            refused_decisions=[refused],
        )
    )
    assert (
        "refused decision on approval-1 by 'mallory': 'mallory' is not a trusted approver"
        in capsys.readouterr().out
    )


def test_an_open_question_of_a_resumed_run_says_the_run_went_on_without_an_answer():
    """Found by the s18 trial: after `kiwi resume` of a run held by the agent's question, its status showed
    both the open escalation and awaiting_agent, with nothing saying how the two fit."""
    from kiwi.cli.progress import answers
    from kiwi.contracts import DecisionRequest, RunStatus

    asked = DecisionRequest(request_id="decision-x", reason="two ways", options=["a", "b"])
    held = answers(
        RunStatus(run_id="run-x", directive="d", version="1", status="awaiting_human", decisions=[asked])
    )
    went_on = answers(
        RunStatus(run_id="run-x", directive="d", version="1", status="awaiting_agent", decisions=[asked])
    )
    assert "resumed without an answer" not in held[0] and "`kiwi decide run-x decision-x a|b`" in held[0]
    assert "the run was resumed without an answer, and an answer still reaches the agent" in went_on[0]


def test_the_help_offers_only_what_a_command_uses(capsys):
    """Found by the s18 trial: every --address help ended 'else 127.0.0.1:7233', leaving out the
    temporal-dev.yml step the commands take; `kiwi worker` offered --project (which it never used: it
    serves runs of every project); `kiwi run` offered --all-projects (a run starts in one project)."""
    for argv, absent in (
        (["worker", "--project", "x"], "--project"),
        (["run", "d", "--all-projects"], "--all-projects"),
    ):
        assert kiwi_main(argv) == 2
        assert f"unrecognized arguments: {absent}" in capsys.readouterr().err
    from kiwi.cli import build_parser

    with pytest.raises(SystemExit):  # (--help prints and exits, as argparse does)
        build_parser().parse_args(["runs", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "else the address the project's temporal-dev.yml gives `kiwi dev`" in shown


def test_the_audit_text_says_who_decided_what(capsys):
    """Found by the s18 trial: `kiwi audit`'s text showed no request id, option, approver, note or error type,
    and long event names pushed its columns out of line."""
    from kiwi.cli.audit import _audit_detail

    assert _audit_detail(
        {"event": "approval_requested", "tool": "filesystem.delete", "request_id": "approval-3"}
    ) == ("approval-3")
    assert _audit_detail(
        {"event": "decided", "request_id": "d-1", "option": "archive", "by": "bob", "note": "keep"}
    ) == ("option archive by bob note: keep")
    assert _audit_detail(
        {"event": "approval_decided", "tool": "t", "request_id": "approval-3", "by": "alice"}
    ) == ("approval-3 by alice")
    assert _audit_detail(
        {"event": "tool_call", "tool": "x.y", "reason": "gone", "error_type": "McpUnavailable"}
    ) == ("gone (McpUnavailable)")


def test_kiwi_call_reads_large_arguments_from_a_file_or_standard_input(tmp_path, monkeypatch):
    """Found by the s18 trial: `kiwi call` took its arguments as one command-line word only, so 300 KB
    (what the payload store is for) failed in the shell ('Argument list too long')."""
    import io

    from kiwi.cli.runs import _call_arguments

    big = {"path": "notes/big.md", "content": "x" * 300_000}
    (tmp_path / "args.json").write_text(json.dumps(big))
    assert _call_arguments("filesystem.write", f"@{tmp_path / 'args.json'}") == big
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(big)))
    assert _call_arguments("filesystem.write", "-") == big
    with pytest.raises(KiwiError, match="cannot read the arguments from .*missing.json"):
        _call_arguments("filesystem.write", f"@{tmp_path / 'missing.json'}")


@pytest.mark.parametrize(
    "kind, given, taken",
    [
        ("string", 5, "5"),  # (a number or boolean for a string input: its JSON text, as the README says)
        ("string", True, "true"),
        ("integer", "3", 3),
        ("number", "2.5", 2.5),
        ("boolean", "yes", True),
        ("array", "a, b", ["a", "b"]),
    ],
)
def test_an_input_given_in_another_json_type_is_taken_as_the_readme_says(kind, given, taken):
    from kiwi.templating import coerce_input

    assert coerce_input(kind, given) == taken


@pytest.mark.parametrize(
    "kind, given, says",
    [
        # Named as JSON names them (they were Python's: "got dict", "got list", "got True"; review s33).
        ("string", {"first": "Ada"}, "expected a string, got an object"),
        ("string", ["Ada"], "expected a string, got an array"),
        ("integer", "3.5", "expected an integer, got the text '3.5'"),
        ("integer", True, "expected an integer, got true"),
        ("boolean", "maybe", "expected a boolean (true/false), got the text 'maybe'"),
        ("object", "[1]", "expected a JSON object, got an array"),
        ("array", {"a": 1}, "expected a JSON array, got an object"),
        ("number", "1e400", "expected a finite number, got the text '1e400'"),
        ("number", "nan", "expected a number, got the text 'nan'"),
        ("number", "-1e999", "expected a finite number"),
    ],
)
def test_an_input_of_a_type_that_cannot_be_taken_is_refused(kind, given, says):
    from kiwi.templating import coerce_input

    with pytest.raises(ValueError, match=re.escape(says)):
        coerce_input(kind, given)


@pytest.mark.parametrize(
    "argv",
    [
        ["pull", "word_count", "--type", "script"],
        ["registry", "yank", "word_count@1.0.0", "--type", "script"],
        ["registry", "versions", "word_count", "--type", "script"],
    ],
)
def test_the_registry_commands_take_script_for_tool_as_the_readme_says(argv):
    """README trial s33: `kiwi pull word_count --type script` was refused by argparse, though the README says
    script is another name for tool in the CLI's --type (search and show took it)."""
    from kiwi.cli import build_parser

    assert build_parser().parse_args(argv).type == "tool"


async def test_an_optional_input_a_step_uses_without_a_default_is_a_warning_and_a_clear_failure(
    runs, project
):
    """README trial s34: an optional input with no default, used in a step's parameter, validated ok, and the run
    failed saying "no input is called 'ratio'", of a declared input. validate warns; the run's failure names the
    input and both fixes."""
    from kiwi.items.validation import validate_file

    path = project / ".ai" / "directives" / "scaled.md"
    write_directive(
        path,
        directive_md(
            '<step name="w"><tool_call tool="filesystem.write"><param name="path">notes/r.txt</param>'
            '<param name="content">{ratio}</param></tool_call></step>',
            name="scaled",
            permissions='<write resource="filesystem" path="notes/**"/>',
            inputs='<input name="ratio" type="number" required="false"/>',
        ),
    )
    checked = validate_file(path)
    assert checked["valid"] is True
    assert [p["message"] for p in checked["problems"] if p["severity"] == "warning"] == [
        'step "w" uses {ratio}, an optional input with no default: a run started without it fails there; give it '
        'a default (<input name="ratio" ... default="...">) or make it required="true"'
    ]
    run_id = await runs.start("scaled", {})
    with pytest.raises(Exception):  # noqa: B017 - the run fails; its status says why
        await runs.handle(run_id).result()
    status = await runs.status(run_id)
    assert status.status == "failed", status
    assert status.error.startswith(
        "{ratio} has no value: the optional input 'ratio' was not given and has no default; pass it"
    ), status.error
    given = await runs.start("scaled", {"ratio": "0.5"})
    assert (await runs.handle(given).result()).status == "completed"
    assert (project / "notes" / "r.txt").read_text() == "0.5"


def test_a_local_tools_arguments_take_the_types_its_manifest_declares():
    """README trial s34: a number for a `string` parameter reached the tool's main() as a number (word_count's
    `.split()` failed with a traceback). Numbers, true/false and text stand in for one another (the shape check
    lets them), so each reaches the tool as the type its manifest declares, when it reads as one."""
    from activities.localtools import typed_parameters
    from kiwi.contracts import LocalToolSpec

    schema = {
        "type": "object",
        "properties": {
            "text": {"type": "string"},
            "count": {"type": "integer"},
            "ratio": {"type": "number"},
            "loud": {"type": "boolean"},
            "items": {"type": "array"},
            "anything": {},
        },
    }
    tool = LocalToolSpec(tool_id="t", tool_type="python", entrypoint="main.py", input_schema=schema)
    given = {"text": 5, "count": "3", "ratio": "0.5", "loud": "true", "items": [1], "anything": 7}
    assert typed_parameters(tool, given) == {
        "text": "5",
        "count": 3,
        "ratio": 0.5,
        "loud": True,
        "items": [1],
        "anything": 7,
    }
    assert typed_parameters(tool, {"text": True, "count": 3.0, "loud": 1}) == {
        "text": "true",
        "count": 3,
        "loud": True,
    }
    # What reads as none of its type is refused before the tool runs (README trial s34, second round).
    from temporalio.exceptions import ApplicationError

    for given, said in (
        ({"count": "many"}, "'count' must be an integer, got the text 'many'"),
        ({"count": 2.5}, "'count' must be an integer, got the number 2.5"),
        ({"loud": "yes"}, "'loud' must be true or false, got the text 'yes'"),
        ({"loud": 7}, "'loud' must be true or false, got the number 7"),
    ):
        with pytest.raises(ApplicationError) as refused:
            typed_parameters(tool, given)
        assert refused.value.type == "InputInvalid" and said in str(refused.value), refused.value


def test_a_project_option_naming_a_folder_that_is_no_project_says_so(tmp_path, capsys):
    """README trial s34: `--project` naming a folder with no .ai/ was taken, and each command went on as if it
    were a project (`kiwi runs` listed none, `kiwi dev` served it). `kiwi init` and `kiwi doctor` still take it."""
    folder = tmp_path / "plain"
    folder.mkdir()
    assert kiwi_main(["runs", "--project", str(folder)]) == 1
    err = capsys.readouterr().err
    assert f"--project {folder}: {folder} is no Kiwi project (no .ai/ in it)" in err, err
    assert f"`kiwi init {folder}`" in err
    assert kiwi_main(["search", "hello", "--project", str(folder)]) == 1
    assert "is no Kiwi project" in capsys.readouterr().err


async def test_null_for_an_optional_argument_of_a_built_in_is_the_default(runs, project):
    """README trial s34: `"encoding": null` (and `max_bytes`, `timeout`, `paths`: null), which agents send for
    optional arguments all the time, failed the run's workflow task over and over: the call hung, every later call
    to the run was refused, and `kiwi cancel` did nothing. null is the argument left out."""
    run_id = await _workbench(runs, project)
    write(project / "notes" / "n.md", "null is the default")
    read = await asyncio.wait_for(
        runs.call_tool(
            run_id, "filesystem.read", {"path": "notes/n.md", "encoding": None, "max_bytes": None}
        ),
        30,
    )
    assert read.status == "ok" and read.result["content"] == "null is the default", read
    ran = await asyncio.wait_for(
        runs.call_tool(run_id, "shell.run", {"command": "echo still here", "timeout": None}), 30
    )
    assert ran.status == "ok" and ran.result["stdout"].strip() == "still here", ran
    # (A null cwd was refused as no path, though the worker takes it as the root: review s34.)
    rooted = await runs.call_tool(run_id, "shell.run", {"command": "echo rooted", "cwd": None})
    assert rooted.status == "ok" and rooted.result["stdout"].strip() == "rooted", rooted
    missing = await runs.call_tool(run_id, "filesystem.read", {"path": None})
    assert missing.error_type == "InputInvalid" and "'path' is required" in missing.reason, missing
    assert (await runs.status(run_id)).status == "awaiting_agent"


def test_migrate_of_a_script_that_is_not_there_says_so(project, capsys):
    """README trial s39: `kiwi migrate .ai/scripts/text/nope.py` said it "is not a legacy script", when the file
    does not exist."""
    assert kiwi_main(["migrate", ".ai/scripts/text/nope.py"]) == 1
    err = capsys.readouterr().err
    assert "nope.py does not exist" in err and "not a legacy script" not in err, err
