"""`kiwi validate` catches what the run would refuse, and names the spelling or grant that fixes it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from kiwi.cli import main as kiwi
from kiwi.errors import InputInvalid
from tests.helpers import directive_md, write

SORT = '<step name="sorted"><tool_call tool="shell.run"><param name="command">sort notes.txt</param></tool_call></step>'


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert kiwi(["init"]) == 0
    return tmp_path


def problems(
    project, capsys, name: str, body: str, permissions: str, inputs: str = "", extra_meta: str = ""
) -> list[str]:
    """The errors `kiwi validate` finds in directive ``name`` written with these parts (it exits 1)."""
    path = write(
        project / ".ai" / "directives" / f"{name}.md",
        directive_md(body, name=name, permissions=permissions, inputs=inputs, extra_meta=extra_meta),
    )
    assert kiwi(["validate", str(path), "--json"]) == 1
    return said(capsys, "error")


def said(capsys, severity: str = "") -> list[str]:
    """The messages `kiwi validate --json` printed for its one item (of ``severity`` when given)."""
    problems = json.loads(capsys.readouterr().out)["items"][0]["problems"]
    return [p["message"] for p in problems if not severity or p["severity"] == severity]


def test_a_step_calling_shell_without_a_shell_grant_is_an_error_naming_the_grant(project, capsys):
    found = problems(project, capsys, "nogrant", SORT, '<read resource="filesystem" path="**"/>')
    assert any(
        'step "sorted" calls shell.run' in m and '<execute resource="shell" commands="sort"/>' in m
        for m in found
    ), found


def test_a_misspelt_attribute_names_the_right_one(project, capsys):
    found = problems(
        project,
        capsys,
        "typo",
        SORT,
        '<read resource="filesystem" path="**"/><execute resource="shell" command="sort"/>',
    )
    assert any("has no attribute 'command'; did you mean commands=\"sort\"?" in m for m in found), found


def test_a_misspelt_resource_names_the_right_one(project, capsys):
    found = problems(project, capsys, "badres", SORT, '<execute resource="shel" commands="sort"/>')
    assert any('resource="shel"' in m and 'did you mean "shell"?' in m for m in found), found


def test_a_misspelt_built_in_tool_is_an_error_naming_the_right_one_and_no_mcp_grant(project, capsys):
    """README trial s34: `filesystem.wrte` validated (and signed); the run's step, meant to run by itself, waited
    for the agent. `shell.runn` was an error hinting at an MCP grant for a server called shell. A tool of a
    declared MCP server of such a name (mcp-server-git's git.git_status) is no misspelling."""
    body = (
        '<step name="w"><tool_call tool="filesystem.wrte"><param name="path">notes/a</param></tool_call>'
        '<tool_call tool="shell.runn"><param name="command">sort notes.txt</param></tool_call>'
        '<tool_call tool="git.checkpiont"/></step>'
    )
    permissions = '<write resource="filesystem" path="notes/**"/><execute resource="shell" commands="sort"/>'
    found = problems(project, capsys, "misspelt", body, permissions)
    assert found == [
        'step "w" calls filesystem.wrte, which is no tool of Kiwi\'s: did you mean filesystem.write?',
        'step "w" calls shell.runn, which is no tool of Kiwi\'s: did you mean shell.run?',
        'step "w" calls git.checkpiont, which is no tool of Kiwi\'s: did you mean git.checkpoint?',
    ], found
    # The trial's second round: a wrong case, and a misspelt local tool the directive grants.
    body = (
        '<step name="v"><tool_call tool="Filesystem.Write"><param name="path">notes/a</param></tool_call>'
        '<tool_call tool="word_cont"><param name="text">hi</param></tool_call></step>'
    )
    permissions = '<write resource="filesystem" path="notes/**"/><execute resource="tool" id="word_cont"/>'
    found = problems(project, capsys, "cased", body, permissions)
    assert found == [
        'step "v" calls Filesystem.Write, which is no tool of Kiwi\'s: did you mean filesystem.write?',
        'step "v" calls word_cont, which is no tool here: did you mean word_count?',
    ], found
    server = write(
        project / ".ai" / "directives" / "gitserver.md",
        directive_md(
            '<step name="s"><tool_call tool="git.git_status"/></step>',
            name="gitserver",
            permissions='<execute resource="mcp" name="git" actions="git_status"/>',
            tools='<tools><mcp name="git"><tool>git_status</tool></mcp></tools>',
        ),
    )
    assert kiwi(["validate", str(server)]) == 0, capsys.readouterr().out


async def test_a_step_calling_a_tool_that_is_none_gets_one_account_from_validate_show_and_the_run(
    runs, project, capsys
):
    """Review s36: a step calling `filesystem.reed` or `frobnicate` got three accounts. validate: "the run stops
    there, refusing its call" (and for frobnicate, add a grant of it); show: the agent does the step; the run
    refused to start (frobnicate) or waited for the agent, who could not call it either (filesystem.reed). Now
    all three say no run starts, naming the tool."""
    path = write(
        project / ".ai" / "directives" / "typo.md",
        directive_md(
            '<step name="one"><tool_call tool="filesystem.reed"><param name="path">notes/a</param></tool_call>'
            '</step><step name="two"><tool_call tool="frobnicate"/></step>',
            name="typo",
            permissions='<read resource="filesystem" path="**"/>',
        ),
    )
    capsys.readouterr()
    assert kiwi(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "calls filesystem.reed, which is no tool of Kiwi's: did you mean filesystem.read?" in out, out
    assert 'step "two" calls frobnicate, which is no tool here: no local tool has that id' in out, out
    assert "execute resource" not in out, out  # (a grant of it would not help)
    for step in ("one", "two"):
        assert f"step {step}: no run starts, as it calls a tool that is none (above)" in out, out
    assert kiwi(["show", "typo"]) == 0
    out = capsys.readouterr().out
    assert "calls filesystem.reed, which is no tool of Kiwi's" in out, out
    assert "step one: no run starts, as it calls a tool that is none (above)" in out, out
    assert "Kiwi cannot call itself" not in out, out
    # The run: refused at its start, filesystem.reed named (the step waited for the agent before).
    write(path, path.read_text().replace('<step name="two"><tool_call tool="frobnicate"/></step>', ""))
    with pytest.raises(InputInvalid, match=r"calls filesystem\.reed, which is no tool of Kiwi's") as refused:
        await runs.start("typo", {})
    assert "kiwi validate" in refused.value.hint, refused.value.hint


def test_a_local_tools_parameters_are_checked_as_the_run_checks_them(project, capsys):
    """README trial s34: a stray `txt` for word_count validated, and the run failed at that step after the steps
    before it ran. A name the tool does not take, a required one left out, a literal not of its type: errors;
    a placeholder is the run's to check."""
    write(
        project / ".ai" / "tools" / "text" / "repeat" / "tool.yaml",
        "tool_id: repeat\ntool_type: python\nexecutor: {type: python, entrypoint: main.py}\nparameters:\n"
        "  - {name: text, type: string, required: true}\n  - {name: times, type: integer}\n",
    )
    write(
        project / ".ai" / "tools" / "text" / "repeat" / "main.py",
        "def main(text, times=1):\n    return text\n",
    )
    grants = '<execute resource="tool" id="word_count"/><execute resource="tool" id="repeat"/>'
    body = (
        '<step name="a"><tool_call tool="word_count"><param name="txt">hi</param></tool_call></step>\n'
        '<step name="b"><tool_call tool="repeat"><param name="times">many</param></tool_call></step>\n'
        '<step name="c"><tool_call tool="repeat"><param name="text">hi</param>'
        '<param name="times">{inputs.n}</param><param name="tims">2</param></tool_call></step>'
    )
    number = '<input name="n" type="integer" required="true"/>'
    found = problems(project, capsys, "params", body, grants, inputs=number)
    assert found == [
        'step "a": word_count has no parameter \'txt\'; it takes text (did you mean <param name="text">?)',
        'step "b": repeat requires <param name="text">, which the step leaves out',
        "step \"b\": repeat: parameter 'times' must be an integer, got the text 'many' (write <param name=\"times\"> as a "
        "whole number, e.g. 3)",
        'step "c": repeat has no parameter \'tims\'; it takes text, times (did you mean <param name="times">?)',
    ], found
    # Each points at the <param> it names, not at its <tool_call>'s first column (README trial s35).
    assert kiwi(["validate", str(project / ".ai" / "directives" / "params.md"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)["items"][0]["problems"]
    a, b, c = body.splitlines()
    first = directive_md(body).splitlines().index(a) + 1
    assert [(p["line"], p["column"]) for p in report if p["severity"] == "error"] == [
        (first, a.index('<param name="txt">') + 1),
        (first + 1, b.index("<tool_call") + 1),
        (first + 1, b.index("<tool_call") + 1),
        (first + 2, c.index('<param name="tims">') + 1),
    ], report
    fixed = (
        '<step name="a"><tool_call tool="word_count"><param name="text">hi</param></tool_call></step>'
        '<step name="c"><tool_call tool="repeat"><param name="text">hi</param>'
        '<param name="times">{inputs.n}</param></tool_call></step>'
    )
    path = write(
        project / ".ai" / "directives" / "params.md",
        directive_md(
            fixed,
            name="params",
            permissions=grants,
            inputs='<input name="n" type="integer" required="true"/>',
        ),
    )
    assert kiwi(["validate", str(path)]) == 0, capsys.readouterr().out


def test_a_granted_call_validates(project, capsys):
    path = write(
        project / ".ai" / "directives" / "fine.md",
        directive_md(
            SORT,
            name="fine",
            permissions='<read resource="filesystem" path="**"/><execute resource="shell" commands="sort"/>',
        ),
    )
    assert kiwi(["validate", str(path)]) == 0
    # Unsigned, its runs get what its grants share with the base policy, which has no shell: said of the step
    # (README trial s37: "runs by itself", and the run failed there).
    out = capsys.readouterr().out
    assert (
        "step sorted: a run of the file as it is stops there: it is not signed by a trusted key, so its runs get "
        f"only what its grants share with the base policy (`kiwi sign {path}`)" in out
    ), out
    assert kiwi(["sign", str(path)]) == 0
    capsys.readouterr()
    assert kiwi(["validate", str(path)]) == 0
    assert "step sorted: runs by itself" in capsys.readouterr().out


def test_a_step_whose_call_the_run_refuses_is_not_said_to_run_by_itself(project, capsys):
    """README trial s35: under the FAIL of a step's refused call, validate still printed "step sorted: runs by
    itself"; the run stops there."""
    two = SORT + '<step name="ask" action="ask the human"/>'
    path = write(
        project / ".ai" / "directives" / "stops.md",
        directive_md(two, name="stops", permissions='<read resource="filesystem" path="**"/>'),
    )
    assert kiwi(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "step sorted: the run stops there, at the error above" in out, out
    assert "step sorted: runs by itself" not in out and "step ask: waits for the agent" in out, out
    assert kiwi(["validate", str(path), "--json"]) == 1
    steps = json.loads(capsys.readouterr().out)["items"][0]["steps"]
    assert [(s["step"], s["stops"]) for s in steps] == [("sorted", True), ("ask", False)]


async def test_validate_and_the_run_refuse_the_same_call(runs, project, temporal_env):
    """The same directive: `kiwi validate` names the grant, and the real run refuses the call."""
    from mcp.client import Client

    from mcp_frontend.server import build_server
    from tests.helpers import data, wait_for

    write(
        project / ".ai" / "directives" / "sorter.md",
        directive_md(SORT, name="sorter", permissions='<read resource="filesystem" path="**"/>'),
    )
    assert kiwi(["validate", ".ai/directives/sorter.md"]) == 1
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        started = data(
            await client.call_tool(
                "execute", {"item_type": "directive", "action": "run", "item_id": "sorter"}
            )
        )
        run_id = started["run_id"]

        async def refused():
            status = await runs.status(run_id)
            text = json.dumps(status.model_dump(mode="json"))
            return (
                text
                if "shell" in text and ("denied" in text or "not granted" in text or "not allowed" in text)
                else None
            )

        text = await wait_for(refused, timeout=30, what="the run's refusal of shell.run")
        assert "sort" in text
    # `kiwi run` says so before it starts the run (carried over: it started what validate marks FAIL, silent).
    from tests.helpers import kiwi_cli

    address = runs.client.service_client.config.target_host
    code, out, err = await kiwi_cli("run", "sorter", "--address", address, "--task-queue", runs.task_queue)
    # (It started, and failed at once at that step: exit 1, as a run shown failed is since the s34 trial.)
    assert code == 1 and "started run-sorter-" in out and "failed" in out, out + err
    assert re.search(
        r'kiwi run: warning: \.ai/directives/sorter\.md:\d+:\d+: step "sorted" calls shell\.run, which the run '
        r"would refuse: shell command 'sort' is not in the allowlist",
        err,
    ), err
    assert "the run stops there if it reaches it (`kiwi validate .ai/directives/sorter.md`)" in err
    # And a <param> the local tool does not take (second README trial s35: started without a word).
    write(
        project / ".ai" / "directives" / "counter.md",
        directive_md(
            '<step name="count"><tool_call tool="word_count"><param name="txet">hi</param></tool_call></step>',
            name="counter",
            permissions='<execute resource="tool" id="word_count"/>',
        ),
    )
    code, out, err = await kiwi_cli("run", "counter", "--address", address, "--task-queue", runs.task_queue)
    assert (
        "kiwi run: warning: .ai/directives/counter.md:" in err and "word_count has no parameter 'txet'" in err
    ), out + err
    # And a directive whose file grants the call but whose run will not have it: unsigned, it runs with what it
    # shares with the base policy (README trial s36: it started with no word and failed at once).
    write(
        project / ".ai" / "directives" / "sorter.md",
        directive_md(
            SORT,
            name="sorter",
            permissions='<read resource="filesystem" path="**"/><execute resource="shell" commands="sort"/>',
        ),
    )
    code, out, err = await kiwi_cli("run", "sorter", "--address", address, "--task-queue", runs.task_queue)
    assert (
        "kiwi run: warning: .ai/directives/sorter.md is not signed by a trusted key: runs with the base policy only"
        in err
    ), err
    # (Its own <permissions> grant it: the fix is to sign it, not the grant the refusal names. Second trial s36;
    # said in one piece, not after the refusal's "<permissions> has none": trial s37.)
    assert (
        'step "sorted" calls shell.run, which its <permissions> grant; but it is not signed, so its runs get only '
        "the base policy, which does not: `kiwi sign .ai/directives/sorter.md`; the run stops there" in err
    ), err
    assert 'add <execute resource="shell" commands="sort"/>' not in err and "has none" not in err, err


def test_signing_with_a_key_not_trusted_to_sign_warns_that_runs_get_the_base_policy(project, capsys):
    """README trial s34: `kiwi sign --key alice`, alice trusted to approve only, printed "signed ... as alice";
    the directive's runs got the base policy, and only a later `kiwi validate` said "NOT by a trusted key"."""
    assert kiwi(["keys", "init", "--name", "alice", "--roles", "approve"]) == 0
    capsys.readouterr()
    directive = ".ai/directives/hello_kiwi.md"
    assert kiwi(["sign", directive, "--key", "alice"]) == 0
    out, err = capsys.readouterr()
    assert "signed .ai/directives/hello_kiwi.md as alice" in out
    assert "warning: 'alice' is not trusted to sign here" in err and "base policy" in err, err
    assert kiwi(["sign", directive, "--key", "alice", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["items"][0]["trusted"] is False
    # validate says what the key lacks (README trial s39: "NOT by a trusted key", of a key trusted to approve).
    assert kiwi(["validate", directive]) == 0
    assert "by alice, NOT by a key trusted to sign)" in capsys.readouterr().out
    assert kiwi(["sign", directive, "--key", "root"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_signing_a_project_signs_its_items_checks_them_as_validate_does_and_says_its_warnings(
    project, capsys
):
    """`kiwi sign .ai` failed (exit 1) on agent_harness.yaml, read as a tool manifest, once `kiwi validate .ai`
    read the settings files; it signed a directive whose step gives word_count a stray `txt`, and printed none
    of validate's warnings (README trial s34)."""
    harness = project / ".ai" / "config" / "agent_harness.yaml"
    settings = harness.read_text()
    assert kiwi(["sign", ".ai"]) == 0, capsys.readouterr()
    assert harness.read_text() == settings
    hello = project / ".ai" / "directives" / "hello_kiwi.md"
    hello.write_text(hello.read_text().replace('<param name="text">', '<param name="txt">'))
    assert kiwi(["sign", str(hello)]) == 1
    assert "word_count has no parameter 'txt'" in capsys.readouterr().err
    hello.write_text(
        hello.read_text()
        .replace('<param name="txt">', '<param name="text">')
        .replace('required="true">Who to greet', 'required="false">Who to greet')
    )
    assert kiwi(["sign", str(hello)]) == 0
    out, err = capsys.readouterr()
    assert (
        "signed" in out and "kiwi sign: " in err and "uses {name}, an optional input with no default" in err
    ), err
    assert kiwi(["sign", str(harness)]) == 1
    assert "a settings file, not an item: Kiwi reads it unsigned" in capsys.readouterr().err
    assert harness.read_text() == settings


def test_validate_reads_the_settings_files_as_runs_read_them(project, capsys):
    """README trial s34: `kiwi validate .ai/config/agent_harness.yaml` read a valid harness as a tool manifest
    (FAIL: manifest needs tool_id), and `kiwi validate .ai` passed an mcp_registry.yaml whose `type: stdo` stopped
    every run from starting."""
    write(
        project / ".ai" / "config" / "mcp_registry.yaml", "mcps:\n  typo:\n    type: stdo\n    command: x\n"
    )
    assert kiwi(["validate", ".ai/config/agent_harness.yaml"]) == 0, capsys.readouterr()
    assert "ok   .ai/config/agent_harness.yaml (settings)" in capsys.readouterr().out
    assert kiwi(["validate", ".ai", "--json"]) == 1
    report = {i["path"]: i for i in json.loads(capsys.readouterr().out)["items"]}
    registry = report[".ai/config/mcp_registry.yaml"]
    assert registry["valid"] is False and registry["item_type"] == "settings", registry
    assert "mcps.typo.type: Input should be 'stdio'" in registry["problems"][0]["message"], registry
    assert report[".ai/directives/hello_kiwi.md"]["valid"] is True
    write(project / ".ai" / "config" / "agent_harness.yaml", "loop_detecton:\n  repeat_threshold: 3\n")
    assert kiwi(["validate", ".ai/config"]) == 1
    assert "did you mean loop_detection?" in capsys.readouterr().out


def test_tools_the_settings_and_a_directive_name_for_approval_are_checked(project, capsys):
    """README trial s34: `approvals.tools: [git.rolback]` validated, and git.rollback then ran with nobody asked.
    A name in Kiwi's namespaces that is none of its tools, or nearly a local tool's, is an error naming the one
    meant; a server no registry names is a warning (a directive may declare it), and the file stays valid."""
    harness = project / ".ai" / "config" / "agent_harness.yaml"
    write(
        harness,
        "approvals:\n  tools: [git.rolback, word_cont, github.create_issue, 'filesystem.*']\n"
        "rate_limits:\n  shell.rnu: 5\n  'mcp.*': 100\n  'filesytem.*': 3\ninternal_tools:\n  tools: [word_count]\n",
    )
    assert kiwi(["validate", str(harness), "--json"]) == 1
    found = json.loads(capsys.readouterr().out)["items"][0]["problems"]
    assert [(p["severity"], p["message"]) for p in found] == [
        ("error", "approvals.tools: 'git.rolback' is no tool of Kiwi's: did you mean git.rollback?"),
        ("error", "approvals.tools: 'word_cont' is no tool here: did you mean word_count?"),
        (
            "warning",
            "approvals.tools: 'github.create_issue' names MCP server 'github', which no mcp_registry.yaml "
            "registers; it matches only a directive that declares that server",
        ),
        ("error", "rate_limits: 'shell.rnu' is no tool of Kiwi's: did you mean shell.run?"),
        ("error", "rate_limits: 'filesytem.*' is no tool of Kiwi's: did you mean filesystem.*?"),
    ], found
    # kiwi doctor says the same (second README trial s35: "valid", and the approval never asked).
    from kiwi.cli.doctor import _configs

    (checked,) = [c for c in _configs(project) if c.name == "agent_harness.yaml"]
    assert not checked.ok and "did you mean git.rollback?" in checked.detail, checked
    write(
        project / ".ai" / "config" / "mcp_registry.yaml",
        "mcps:\n  github:\n    type: stdio\n    command: github-mcp\n",
    )
    write(harness, "approvals:\n  tools: [git.rollback, word_count, github.create_issue]\n")
    assert kiwi(["validate", str(harness)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [], "a registered server's tool is no warning"
    # A directive's own <approvals>.
    path = write(
        project / ".ai" / "directives" / "approving.md",
        directive_md(
            '<step name="s"><tool_call tool="git.status"/></step>',
            name="approving",
            permissions='<execute resource="tool" id="git.status"/>',
            extra_meta="<approvals><tool>git.rolback</tool><tool>github.*</tool></approvals>",
        ),
    )
    assert kiwi(["validate", str(path), "--json"]) == 1
    found = json.loads(capsys.readouterr().out)["items"][0]["problems"]
    assert [p["message"] for p in found] == [
        "<approvals>: 'git.rolback' is no tool of Kiwi's: did you mean git.rollback?"
    ], found
    # (On the <approvals> line, README trial s36: it named none.)
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "<approvals>" in text)
    assert (found[0]["line"], found[0]["column"]) == (line, 1), found


def test_trusted_keys_yaml_is_read_as_kiwi_reads_it(project, capsys):
    """README trial s34: `kiwi validate` read trusted_keys.yaml as a tool manifest (FAIL: manifest needs tool_id),
    and `kiwi validate .ai` left a broken one out. A misspelt key names the one meant, with its file."""
    trusted = project / ".ai" / "config" / "trusted_keys.yaml"
    write(trusted, "keys:\n  ops:\n    publc_key: ed25519:AAAA\n")
    assert kiwi(["validate", ".ai", "--json"]) == 1
    report = {i["path"]: i for i in json.loads(capsys.readouterr().out)["items"]}
    found = report[".ai/config/trusted_keys.yaml"]
    assert found["item_type"] == "settings" and found["valid"] is False, found
    assert [(p["path"], p["message"]) for p in found["problems"]] == [
        (str(trusted), "keys.ops.publc_key: no such key; did you mean public_key?"),
    ], found
    # Every other item is still checked; a signed one says its trust was not.
    hello = report[".ai/directives/hello_kiwi.md"]
    assert hello["valid"] is True and hello["trusted"] is False, hello
    assert hello["problems"][0]["message"] == (
        f"its signer's trust is not checked: {trusted} has mistakes (`kiwi validate {trusted}`)"
    ), hello
    # Second README trial s35: a public key that is none was listed as a trusted signer; a role misspelt.
    write(trusted, "keys:\n  bad:\n    public_key: 'ed25519:notbase64!!'\n  ops:\n    public_key: rsa:AAAA\n")
    assert kiwi(["validate", str(trusted), "--json"]) == 1
    found = said(capsys)
    assert len(found) == 2 and all("public_key is not an Ed25519 public key" in m for m in found), found
    assert found[0].startswith("keys.bad:") and found[1].startswith("keys.ops:"), found
    write(trusted, "keys:\n  ops:\n    public_key: ed25519:AAAA\n    roles: [sign, aprove]\n")
    assert kiwi(["validate", str(trusted), "--json"]) == 1
    found = said(capsys)
    assert found == ["keys.ops.roles.1: 'aprove' is no role; did you mean approve?"], found
    write(trusted, "keys: {}\n")
    # The user's, which `kiwi init` wrote with the key it made.
    user = Path(os.environ["AI_USER_SPACE"]) / "config" / "trusted_keys.yaml"
    assert kiwi(["validate", str(trusted), str(user)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"ok   {trusted} (settings)", f"ok   {user} (settings)"]


def test_every_mistaken_mcp_server_is_named_with_the_key_as_written_and_the_value_meant(project, capsys):
    """README trial s34: `timeout: -1` was named `timeout_seconds` (a name of Kiwi's, not the file's), `type:
    stido` had no did-you-mean, and only the first broken server was named."""
    registry = write(
        project / ".ai" / "config" / "mcp_registry.yaml",
        "mcps:\n  a:\n    type: stido\n    command: x\n  b:\n    command: y\n    timeout: -1\n"
        "  c:\n    command: z\n    idle_timeout: 0\n",
    )
    assert kiwi(["validate", str(registry), "--json"]) == 1
    found = json.loads(capsys.readouterr().out)["items"][0]["problems"]
    assert [p["message"] for p in found if p["severity"] == "error"] == [
        "mcps.a.type: Input should be 'stdio', 'streamable-http' or 'sse'; did you mean stdio?",
        "mcps.b.timeout: Input should be greater than 0",
        "mcps.c.idle_timeout: Input should be greater than 0",
    ], found
    # Every mistake of one server at once, and a value that is no number said so in the file's terms (README
    # trial s35: `comand` hid `type: stdoi`, and `timeout: fast` read "unable to parse string as a number").
    write(registry, "mcps:\n  d:\n    type: stdoi\n    comand: x\n    timeout: fast\n    args: -v\n")
    assert kiwi(["validate", str(registry), "--json"]) == 1
    found = json.loads(capsys.readouterr().out)["items"][0]["problems"]
    assert [p["message"].split(";")[0] for p in found if p["severity"] == "error"] == [
        "mcps.d.comand: unknown key",
        "mcps.d.args: expected a list",
        "mcps.d.type: Input should be 'stdio', 'streamable-http' or 'sse'",
        "mcps.d.timeout: 'fast' is no number of seconds: give one, e.g. timeout: 30",
    ], found


def test_keys_list_says_which_trusted_keys_yaml_to_edit(project, capsys):
    """README trial s34: sign's warning said `kiwi keys list` shows where trusted_keys.yaml is, and it did not."""
    user = Path(os.environ["AI_USER_SPACE"]) / "config" / "trusted_keys.yaml"
    assert kiwi(["keys", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("root ") and out[-2] == f"trusted in: {user}", out
    ours = write(project / ".ai" / "config" / "trusted_keys.yaml", "keys: {}\n")
    assert kiwi(["keys", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trusted_in"] == [str(user), str(ours)]


async def test_attack_a_directive_hidden_from_the_rendered_file_is_refused(runs, project, temporal_env):
    """Hostile review s36: an agent created, over MCP, a directive whose ```xml block, granting `write **` and
    every program, sat inside an HTML comment (hidden by every Markdown viewer), beside a visible block opened
    with "```xml directive" granting `read notes/**` alone, which Kiwi took for no fence. The human reviewed the
    visible block and signed; the run got the hidden grants. Now a <directive> in a comment is refused, and an
    info string's first word is the block's language, as a viewer reads it."""
    from mcp.client import Client

    from mcp_frontend.server import build_server
    from tests.helpers import execute

    def block(permissions: str) -> str:
        return "\n".join(directive_md(SORT, name="tidy_notes", permissions=permissions).splitlines()[4:-1])

    hidden = block(
        '<read resource="filesystem" path="**"/><write resource="filesystem" path="**"/>'
        '<execute resource="shell" commands="*"/>'
    )
    visible = block('<read resource="filesystem" path="notes/**"/>').replace("```xml", "```xml directive", 1)
    assert visible.startswith("```xml directive\n<directive") and hidden.startswith("```xml\n<directive")
    decoy = "\n".join("    " + line for line in visible.replace("```xml directive", "```xml").splitlines())
    hiding = {  # (each a way a Markdown viewer hides the block Kiwi would have run, or shows a decoy it does not)
        "comment": f"<!--\n{hidden.replace('```', '~~~')}\n~~~\n-->\n\n{visible}\n```\n",
        "script": f"{decoy}\n    ```\n\n<script>\n{hidden}\n```\n</script>\n",  # (review s36, second round)
        "details": f"<details>\n{hidden}\n```\n</details>\n\n{visible}\n```\n",
        # (README trial s36, second round: with a blank line the fence is Markdown, inside a folded section.)
        "details-folded": f"<details><summary>spec</summary>\n\n{hidden}\n```\n\n</details>\n",
    }
    server = build_server(temporal_env.client, project, task_queue=runs.task_queue)
    async with Client(server) as client:
        for way, body in hiding.items():
            made = await execute(
                client,
                {
                    "item_type": "directive",
                    "action": "create",
                    "item_id": "tidy_notes",
                    "parameters": {"content": f"# tidy_notes\n\n{body}"},
                },
            )
            assert made["error"] == "ItemInvalid", (way, made)
            if way == "details-folded":  # (HTML other than a comment is refused wherever it is: review s37)
                assert "HTML in a directive file (<details><summary>spec</summary>)" in made["message"], made
            else:
                assert "a <directive> inside " in made["message"] and "(lines 3-" in made["message"], (
                    way,
                    made,
                )
            assert not list((project / ".ai" / "directives").rglob("tidy_notes.md")), way
    # Without the hidden block, the visible one is the directive, with the grants it shows.
    write(project / ".ai" / "directives" / "tidy_notes.md", f"# tidy_notes\n\n{visible}\n```\n")
    grants = runs.store.load_directive("tidy_notes")[0].grants()
    assert (grants.fs_read, grants.fs_write, grants.shell) == (["notes/**"], [], []), grants


def test_validate_show_and_sign_print_the_grants_a_signature_gives(project, capsys):
    """Hostile review s36: a human signed grants that `kiwi validate`, `kiwi show` and `kiwi sign` never showed
    (the file held others than the ones they had read). Each prints the <permissions> as the file writes them."""
    grants = '<read resource="filesystem" path="**"/><execute resource="shell" commands="sort"/>'
    path = write(
        project / ".ai" / "directives" / "fine.md", directive_md(SORT, name="fine", permissions=grants)
    )
    shown = '<read resource="filesystem" path="**"/> <execute resource="shell" commands="sort"/>'
    assert kiwi(["validate", str(path)]) == 0
    assert f"     grants: {shown}\n" in capsys.readouterr().out
    assert kiwi(["show", "fine"]) == 0
    assert f"  grants: {shown}\n" in capsys.readouterr().out
    assert kiwi(["sign", str(path)]) == 0
    assert f"signed {path} as " in (out := capsys.readouterr().out) and f"  grants: {shown}\n" in out, out


def test_a_key_given_twice_in_a_settings_file_is_an_error_naming_both_lines(project, capsys):
    """README trial s36: the refusal's hint said to add `internal_tools: {filesystem: {write: [...]}}`; added below
    the file's own `internal_tools:` block, YAML kept only the second, validate said ok, and the base policy's
    reads and tools were gone. A key given twice is an error naming both lines, and runs refuse the file."""
    harness = project / ".ai" / "config" / "agent_harness.yaml"
    text = harness.read_text() + 'internal_tools: {filesystem: {write: ["notes/**"]}}\n'
    second = len(text.splitlines())
    first = next(n for n, line in enumerate(text.splitlines(), 1) if line.startswith("internal_tools:"))
    write(harness, text)
    assert kiwi(["validate", str(harness)]) == 1
    out = capsys.readouterr().out
    assert (
        f"agent_harness.yaml:{second}:1: refused YAML: the key 'internal_tools' is given twice (lines {first} and {second})"
        in out
    ), out
    from kiwi.errors import ItemInvalid
    from kiwi.harness import load_harness
    from kiwi.items.store import user_space

    with pytest.raises(ItemInvalid, match="given twice"):
        load_harness(project, user_space())


def test_a_misspelt_attribute_or_element_outside_permissions_is_named_with_the_one_meant(project, capsys):
    """README trial s36: `<step conditon=...>` (a step that then always runs), `<approvals timout=...>` (the default
    wait), `<input requried=...>`, `<approval>` and `<parm>` validated with nothing said, or without the name
    meant. Each is named with the one meant; since README trial s38 an error (as written, the directive does less
    than it says, and `kiwi sign` signed it), as is a <param> with no name (`<param key="command">`, dropped)."""
    body = (
        '<step name="sorted" conditon="inputs.unique"><tool_call tool="shell.run">'
        '<param name="command">sort notes.txt</param><parm name="cwd">.</parm><param key="stdin">x</param>'
        "</tool_call></step>"
    )
    path = write(
        project / ".ai" / "directives" / "typos.md",
        directive_md(
            body,
            name="typos",
            permissions='<read resource="filesystem" path="**"/><execute resource="shell" commands="sort"/>',
            inputs='<input name="unique" type="boolean" requried="true"/>',
            extra_meta='<approvals timout="600"><tool>shell.run</tool></approvals>',
        ),
    )
    assert kiwi(["validate", str(path), "--json"]) == 1
    errors = said(capsys, "error")
    for expected in (
        "<step> has no attribute 'conditon', which is ignored; did you mean condition=\"...\"?",
        "<input> has no attribute 'requried', which is ignored; did you mean required=\"...\"?",
        "<approvals> has no attribute 'timout', which is ignored; did you mean timeout=\"...\"?",
        "unknown element <parm> in <tool_call> ignored; did you mean <param>?",
        '<param> needs a name attribute: <param name="...">value</param> (it has key="stdin")',
    ):
        assert expected in errors, errors
    # An attribute like none Kiwi reads is still only a warning (a note for people, an extension).
    write(path, path.read_text().replace('conditon="inputs.unique"', 'reviewed-by="ana"').replace(
        '<parm name="cwd">.</parm><param key="stdin">x</param>', "").replace(' requried="true"', "").replace(
        ' timout="600"', ""))  # fmt: skip
    assert kiwi(["validate", str(path), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["items"][0]["problems"]
    assert [p["severity"] for p in found if "reviewed-by" in p["message"]] == ["warning"], found


@pytest.mark.parametrize(
    "meta, expected",
    [
        (
            "<approval><tool>filesystem.delete</tool></approval>",
            "unknown metadata element <approval> kept as-is; did you mean <approvals>?: as written, no call waits "
            "for a human's approval",
        ),
        (
            "<approvals><tol>filesystem.delete</tol><tool>shell.run</tool></approvals>",
            "<approvals> takes <tool> elements only, not <tol>: a tool it does not name runs with nobody asked",
        ),
    ],
)
def test_a_misspelt_approvals_is_an_error_and_is_not_signed(project, capsys, meta, expected):
    """README trial s37: `<approval>` (and a `<tol>` inside `<approvals>`) was a warning, or nothing; `kiwi sign`
    signed it, and the run deleted with nobody asked. A gate lost to a typo is an error, which sign refuses."""
    body = '<step name="rm"><tool_call tool="filesystem.delete"><param name="path">notes/a</param></tool_call></step>'
    path = write(
        project / ".ai" / "directives" / "gated.md",
        directive_md(
            body, name="gated", permissions='<write resource="filesystem" path="notes/**"/>', extra_meta=meta
        ),
    )
    assert kiwi(["validate", str(path), "--json"]) == 1
    errors = said(capsys, "error")
    assert any(expected in m for m in errors), errors
    assert kiwi(["sign", str(path)]) == 1
    assert "kiwi:signed" not in path.read_text()


def test_a_grant_of_a_tool_that_is_none_is_a_warning_naming_the_one_meant(project, capsys):
    """README trial s36: `<execute resource="tool" id="word_cont"/>` went unremarked; the step's refusal only asked
    to add word_count. The grant itself is named, with the tool meant."""
    body = '<step name="count"><tool_call tool="word_count"><param name="text">a b</param></tool_call></step>'
    path = write(
        project / ".ai" / "directives" / "counter.md",
        directive_md(body, name="counter", permissions='<execute resource="tool" id="word_cont"/>'),
    )
    assert kiwi(["validate", str(path), "--json"]) == 1
    found = json.loads(capsys.readouterr().out)["items"][0]["problems"]
    line = directive_md(
        body, name="counter", permissions='<execute resource="tool" id="word_cont"/>'
    ).splitlines()
    where = next(n for n, text in enumerate(line, 1) if 'id="word_cont"' in text)
    assert {
        "severity": "warning",
        "message": "<execute resource=\"tool\">: 'word_cont' is no tool here: did you mean word_count?",
        "line": where,
    }.items() <= next(p for p in found if "word_cont" in p["message"]).items(), found


def test_the_one_key_trusted_for_a_role_is_the_default_among_several(project, capsys):
    """README trial s36: with a second key made to approve, `kiwi sign` (and, with one made to sign, `kiwi
    approve`) said "you have several keys" though only one could: the one key trusted for the role is taken."""
    from kiwi.errors import InputInvalid
    from kiwi.items.store import user_space
    from kiwi.keys import create_key, default_key, own_keys, trust_key
    from tests.helpers import approver

    (mine,) = own_keys()  # (kiwi init's, trusted to sign and approve)
    approver("alice")  # (trusted to approve only)
    assert default_key(role="sign", project_root=project) == mine
    path = project / ".ai" / "directives" / "hello_kiwi.md"
    assert kiwi(["sign", str(path)]) == 0 and f"as {mine}" in capsys.readouterr().out
    with pytest.raises(InputInvalid, match=rf"several keys trusted to approve \(alice, {mine}\)"):
        default_key(option="--as", role="approve", project_root=project)
    _, public = create_key("zed")  # (trusted for nothing here)
    with pytest.raises(InputInvalid, match="several keys"):
        default_key()
    assert default_key(role="sign", project_root=project) == mine
    trust_key(user_space(), "zed", public, ["sign"])
    with pytest.raises(InputInvalid, match=rf"several keys trusted to sign \({mine}, zed\)"):
        default_key(role="sign", project_root=project)


def test_a_templated_command_is_checked_for_its_program_not_for_a_cwd_its_words_may_not_read(project, capsys):
    """README trial s36: the README's own `ls -l {paths}` (an array input) failed validate, "the command's cwd '.'
    may not be read by this run": the words the run fills in were taken as none. Its program is what validate
    can check; a program not granted is still an error."""
    body = '<step name="ls"><tool_call tool="shell.run"><param name="command">ls -l {paths}</param></tool_call></step>'
    inputs = '<input name="paths" type="array" required="true"/>'
    path = write(
        project / ".ai" / "directives" / "lister.md",
        directive_md(
            body,
            name="lister",
            inputs=inputs,
            permissions='<read resource="filesystem" path="notes/**"/><execute resource="shell" commands="ls"/>',
        ),
    )
    assert kiwi(["validate", str(path)]) == 0, capsys.readouterr().out
    write(
        path,
        directive_md(
            body, name="lister", inputs=inputs, permissions='<read resource="filesystem" path="notes/**"/>'
        ),
    )
    assert kiwi(["validate", str(path)]) == 1
    assert "shell command 'ls' is not in the allowlist" in capsys.readouterr().out


def test_validate_says_which_steps_calls_wait_for_a_humans_approval(project, capsys):
    """README trial s37: a step whose delete waits for a human (the directive's <approvals>) and one whose
    rollback does (the harness's approvals.tools, git.rollback by default) were printed as "runs by itself"."""
    body = (
        '<step name="rm"><tool_call tool="filesystem.delete"><param name="path">notes/a</param></tool_call></step>'
        '<step name="undo"><tool_call tool="git.rollback"/></step>'
        '<step name="w"><tool_call tool="filesystem.write"><param name="path">notes/b</param>'
        '<param name="content">x</param></tool_call></step>'
    )
    path = write(
        project / ".ai" / "directives" / "gated.md",
        directive_md(
            body,
            name="gated",
            permissions='<write resource="filesystem" path="notes/**"/><execute resource="tool" id="git.rollback"/>',
            extra_meta="<approvals><tool>filesystem.delete</tool></approvals>",
        ),
    )
    assert kiwi(["sign", str(path)]) == 0
    capsys.readouterr()
    assert kiwi(["validate", str(path), "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["items"][0]["steps"]
    assert [(s["step"], s["approval"]) for s in steps] == [
        ("rm", ["filesystem.delete"]),
        ("undo", ["git.rollback"]),
        ("w", []),
    ], steps
    assert kiwi(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "step rm: runs by itself (all tool calls are bound to tools Kiwi can call); its filesystem.delete call "
        "waits for a human's approval first" in out
    ), out
    assert "step w: runs by itself (all tool calls are bound to tools Kiwi can call)\n" in out, out


def test_a_misspelt_name_attribute_is_named(project, capsys):
    """README trial s37: `<step nmae="list_notes">` was "<step> needs a name attribute", and the step was left out
    of the plan with no word of why; so `<input nmae=...>` and `<mcp naem=...>`."""
    path = write(
        project / ".ai" / "directives" / "named.md",
        directive_md(
            '<step nmae="list_notes"><action>list them</action></step>',
            name="named",
            inputs='<input nmae="who"/>',
            tools='<tools><mcp naem="clock"/></tools>',
        ),
    )
    assert kiwi(["validate", str(path), "--json"]) == 1
    errors = said(capsys)
    for expected in (
        '<step> needs a name attribute (it has nmae="list_notes": did you mean name=?)',
        '<input> needs a name attribute (it has nmae="who": did you mean name=?)',
        '<mcp> needs a name attribute naming a server in mcp_registry.yaml (it has naem="clock": did you mean name=?)',
    ):
        assert expected in errors, errors


def test_validate_warns_of_a_server_command_not_on_the_path(project, capsys):
    """README trial s37: `kiwi validate .ai` passed a registry whose server's command was on no PATH; `kiwi doctor`
    and the run found it. A warning names it (the worker's PATH may differ: not an error)."""
    import sys

    write(
        project / ".ai" / "config" / "mcp_registry.yaml",
        f"mcps:\n  clock:\n    command: {sys.executable}\n    args: ['-m', 'mcp_server_time']\n"
        "  gone:\n    command: no-such-mcp-server-xyz\n",
    )
    assert kiwi(["validate", str(project / ".ai" / "config" / "mcp_registry.yaml")]) == 0
    out = capsys.readouterr().out
    assert "warning: mcps.gone.command: 'no-such-mcp-server-xyz' is not found on this PATH" in out, out
    assert "mcps.clock" not in out, out
    # (README trial s38: with a mistake in another server, the missing program was said only once that was mended.)
    write(
        project / ".ai" / "config" / "mcp_registry.yaml",
        "mcps:\n  git:\n    comand: mcp-server-git\n  gone:\n    command: no-such-mcp-server-xyz\n",
    )
    assert kiwi(["validate", str(project / ".ai" / "config" / "mcp_registry.yaml")]) == 1
    out = capsys.readouterr().out
    assert "did you mean command" in out and "'no-such-mcp-server-xyz' is not found on this PATH" in out, out


async def test_a_pipe_written_in_a_steps_command_is_refused_before_any_run_starts(runs, project, capsys):
    """README trial s38: `grep -rn {marker} src | wc -l` in a step validated and signed, and the run failed at the
    step with "read not allowed on '|'" (the `|` taken as a file). A step's command with shell syntax the
    directive wrote is now an error in validate and show, and refuses the run's start, saying why (a placeholder
    is not read as syntax: the same step without the pipe validates)."""
    path = write(
        project / ".ai" / "directives" / "piped.md",
        directive_md(
            '<step name="count"><tool_call tool="shell.run"><param name="command">grep -rn {marker} src | wc -l'
            "</param></tool_call></step>",
            name="piped",
            permissions='<read resource="filesystem" path="**"/><execute resource="shell" commands="grep,wc"/>',
            inputs='<input name="marker" type="string" default="TODO"/>',
        ),
    )
    capsys.readouterr()
    assert kiwi(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "shell syntax '|' is refused: commands run without a shell; a step runs one program" in out, out
    assert "step count: no run starts, as its command is shell syntax (above)" in out, out
    assert "approvals: git.rollback (such a call waits for a human's signed approval)" in out, out
    assert kiwi(["show", "piped"]) == 0
    out = capsys.readouterr().out
    assert "step count: no run starts, as its command is shell syntax (above)" in out, out
    assert 'input marker (string, default "TODO")' in out, out
    with pytest.raises(
        InputInvalid, match=r"directive 'piped' runs a shell command: step \"count\": shell syntax"
    ):
        await runs.start("piped", {})
    write(path, path.read_text().replace(" | wc -l", ""))
    assert kiwi(["validate", str(path)]) == 0, capsys.readouterr().out


def test_a_templated_step_of_a_program_kiwi_does_not_model_is_checked_for_its_cwd(project, capsys):
    """README trial s39: `sleep {secs}` under a grant of `sleep` alone validated as "runs by itself", and the run
    failed at once: a program Kiwi does not model reads its cwd, whatever its words, and the run may not read all
    of it. validate says so, and names the grant that works (the run's refusal named `read .`, then `read **`)."""
    body = '<step name="nap"><tool_call tool="shell.run"><param name="command">sleep {secs}</param></tool_call></step>'
    inputs = '<input name="secs" type="string" required="true"/>'
    path = write(
        project / ".ai" / "directives" / "slow.md",
        directive_md(
            body, name="slow", inputs=inputs, permissions='<execute resource="shell" commands="sleep"/>'
        ),
    )
    assert kiwi(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "the command's cwd '.' may not be read by this run" in out, out
    assert 'add <read resource="filesystem" path="**"/> to <permissions>' in out, out
    granted = '<execute resource="shell" commands="sleep"/><read resource="filesystem" path="**"/>'
    write(path, directive_md(body, name="slow", inputs=inputs, permissions=granted))
    assert kiwi(["validate", str(path)]) == 0, capsys.readouterr().out


@pytest.mark.parametrize(
    "meta, body, expected",
    [
        (
            '<approvals><tool>git.commit</tool><tool nmae="filesystem.delete"/></approvals>',
            "",
            "<tool> in <approvals> names no tool: a tool it does not name runs with nobody asked; write "
            '<tool>NAME</tool> or <tool name="NAME"/> (it has nmae="filesystem.delete")',
        ),
        (
            '<approvals><tool>git.commit</tool><tool value="filesystem.delete"/></approvals>',
            "",
            "<tool> in <approvals> names no tool",
        ),
        (
            '<approvals><tool nme="x" name="filesystem.delete"/></approvals>',
            "",
            "<tool> has no attribute 'nme', which is ignored; did you mean name=\"...\"?",
        ),
        (
            "",
            '<tool_calls><call tool="filesystem.write"><param name="path">notes/x</param>'
            '<param name="content">c</param><param key="overwrite">false</param></call></tool_calls>',
            '<param> needs a name attribute: <param name="...">value</param> (it has key="overwrite")',
        ),
        (
            "",
            '<tool_calls><call tool="filesystem.write"><param name="path">notes/x</param>'
            '<param name="content">c</param><parm name="x">1</parm></call></tool_calls>',
            "unknown element <parm> in <call> ignored; did you mean <param>?",
        ),
    ],
)
def test_attack_a_lost_approval_or_parameter_is_an_error_kiwi_sign_refuses(
    project, capsys, meta, body, expected
):
    """Hostile review s39: `<tool nmae="filesystem.delete"/>` in <approvals> named no tool, validated and signed,
    and the run deleted with nobody asked; the <tool_calls><call> form dropped `<param key=...>` and `<parm>`
    silently where <tool_call> refused them. Each is an error, and kiwi sign signs nothing."""
    step = f'<step name="s">{body or "<action>Work.</action>"}</step>'
    path = write(
        project / ".ai" / "directives" / "gate.md",
        directive_md(
            step, name="gate", permissions='<write resource="filesystem" path="notes/**"/>', extra_meta=meta
        ),
    )
    assert kiwi(["validate", str(path), "--json"]) == 1
    errors = said(capsys, "error")
    assert any(expected in e for e in errors), errors
    before = path.read_text()
    assert kiwi(["sign", str(path)]) == 1
    assert path.read_text() == before


@pytest.mark.parametrize(
    "step, expected",
    [
        ('<step name="s" if="inputs.go"><action>Go.</action></step>', 'did you mean condition="..."?'),
        ('<step name="s" only-if="inputs.go"><action>Go.</action></step>', 'did you mean condition="..."?'),
        (
            '<step name="s"><condition>inputs.go</condition><action>Go.</action></step>',
            "<condition> in step 's' is no condition Kiwi reads, and the step would always run: write it as "
            '<step name="s" condition="...">',
        ),
    ],
)
def test_attack_a_condition_written_another_way_is_an_error(project, capsys, step, expected):
    """Hostile review s39: `<step if=...>`, `when=`, `only_if=` and a <condition> element validated and signed with
    a warning, and the step, meant to run only on a condition, always ran. Each is an error naming the form."""
    errors = problems(project, capsys, "cond", step, "")
    assert any(expected in e for e in errors), errors


def test_a_tool_no_call_could_run_as_written_is_invalid_with_every_problem_named(project, capsys):
    """README trial s39: a tool whose entrypoint is missing, with a parameter of type `strng` (taken as a string), a
    default outside its enum, a name given twice and an input_schema requiring what it does not define validated,
    signed and published; every call then failed or took what the author did not mean."""
    folder = project / ".ai" / "tools" / "demo" / "broken"
    write(
        folder / "tool.yaml",
        "tool_id: broken\ntool_type: python\nversion: 1.0.0\ncategory: demo\ndescription: Broken\n"
        "executor: {type: python, entrypoint: missing.py}\nparameters:\n"
        "  - {name: text, type: strng}\n  - {name: mode, type: string, enum: [x, y], default: z}\n"
        "  - {name: text, type: integer}\n",
    )
    assert kiwi(["validate", str(folder / "tool.yaml"), "--json"]) == 1
    errors = said(capsys)
    for expected in (
        "executor.entrypoint 'missing.py' is no file of the tool's folder (broken/)",
        "parameter 'text' has type 'strng', which is no JSON type (did you mean string?)",
        "parameter 'mode' defaults to 'z', which is none of its enum",
        "parameter 'text' is declared twice",
    ):
        assert any(expected in e for e in errors), (expected, errors)
    write(folder / "main.py", "def main(**kw):\n    return kw\n")
    write(
        folder / "tool.yaml",
        "tool_id: broken\ntool_type: python\nversion: 1.0.0\ncategory: demo\ndescription: Broken\n"
        "executor: {type: python, entrypoint: main.py}\n"
        "input_schema: {type: object, properties: {a: {type: strin}}, required: [b]}\n",
    )
    assert kiwi(["validate", str(folder / "tool.yaml"), "--json"]) == 1
    errors = said(capsys)
    assert "input_schema requires 'b', which its properties do not define" in errors, errors
    assert (
        "input_schema property 'a' has type 'strin', which is no JSON type (did you mean string?)" in errors
    )


@pytest.mark.parametrize(
    "body, meta, inputs, expected",
    [
        (
            "",
            "<approvals><tool>filesystem.delete</tool></approvals></metadata><metadata><category>x</category>",
            "",
            "<directive> has a second <metadata>, which would replace the first and all it says",
        ),
        (
            "",
            "<approvals><tool>filesystem.delete</tool></approvals><approvals><tool>filesystem.move</tool></approvals>",
            "",
            "<metadata> has a second <approvals>, which would replace the first and all it says",
        ),
        (
            '<step name="backup"><action>Back up.</action></step></process><process>'
            '<step name="del"><action>Delete.</action></step>',
            "",
            "",
            "<directive> has a second <process>, which would replace the first and all it says",
        ),
        (
            "",
            "",
            '<input name="who" type="string" required="on"/>',
            '<input name="who" required="on"> is no yes or no: write required="true"',
        ),
        (
            '<step name="s" condition=""><action>Go.</action></step>',
            "",
            "",
            '<step name="s" condition=""> is empty: write the condition, or leave it out',
        ),
    ],
)
def test_attack_a_second_section_or_a_blank_gate_is_an_error(project, capsys, body, meta, inputs, expected):
    """Hostile review s39, third round: a second <metadata> or <approvals> dropped the first's approvals, a second
    <process> its steps, `required="on"` made an input optional, `condition=""` a step that always runs; each
    validated and signed, and the live run deleted with nobody asked. Each is an error now."""
    step = body or '<step name="s"><action>Work.</action></step>'
    errors = problems(project, capsys, "twice", step, "", inputs=inputs, extra_meta=meta)
    assert any(expected in e for e in errors), errors


@pytest.mark.parametrize(
    "where, expected",
    [
        ("meta", "<APPROVALS><tool>filesystem.delete</tool></APPROVALS>"),
        ("meta", '<k:approvals xmlns:k="urn:x"><k:tool>filesystem.delete</k:tool></k:approvals>'),
        ("step", "<approvals><tool>filesystem.delete</tool></approvals>"),
        ("meta", '<approvals><tool name="git.commit">filesystem.delete</tool></approvals>'),
    ],
)
def test_attack_an_approval_written_where_or_as_kiwi_does_not_read_it_is_an_error(
    project, capsys, where, expected
):
    """Hostile review s39, third round: <approvals> in a <step> (or at the top level, or in <tools>), upper-case or
    namespaced, was a warning, and `<tool name="git.commit">filesystem.delete</tool>` gated git.commit alone; each
    signed, and no call of the delete waited for a human. Each is an error now."""
    step = '<step name="s"><action>Work.</action></step>'
    if where == "step":
        step = f'<step name="s"><action>Work.</action>{expected}</step>'
    errors = problems(project, capsys, "gate2", step, "", extra_meta=expected if where == "meta" else "")
    assert any("approval" in e or "names two tools" in e for e in errors), errors


def test_a_tool_version_that_is_no_semver_is_an_error_before_publish(project, capsys):
    """README trial s39: a tool's `version: banana` validated and signed; only publish said it is not
    MAJOR.MINOR.PATCH."""
    folder = project / ".ai" / "tools" / "demo" / "ver"
    write(folder / "main.py", "def main():\n    return 1\n")
    write(
        folder / "tool.yaml",
        "tool_id: ver\ntool_type: python\nversion: banana\ncategory: demo\nexecutor: {type: python, entrypoint: main.py}\n",
    )
    assert kiwi(["validate", str(folder / "tool.yaml"), "--json"]) == 1
    errors = said(capsys)
    assert "version 'banana' is not semver (MAJOR.MINOR.PATCH, e.g. 1.0.0)" in errors, errors


def test_an_unknown_tool_type_names_the_ones_that_run_and_the_one_meant():
    """README trial s39: `tool_type: pyhton` was told the types include mcp, which is always refused, and not the
    one meant."""
    from kiwi.errors import ItemInvalid
    from kiwi.items.tools import parse_manifest

    with pytest.raises(ItemInvalid) as refused:
        parse_manifest("tool_id: x\ntool_type: pyhton\n", "tool.yaml")
    assert refused.value.problems[0].message == (
        "tool_type 'pyhton' is unknown; expected one of python, bash, api, docker; did you mean python?"
    )
