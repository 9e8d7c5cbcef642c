"""Attacks from the hostile reviews of session 39, each sent through the real stack."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from tests.helpers import loopback_http, swap_after_check, wait_for, write
from tests.test_attack_shell import agent_run
from tests.test_mcp_servers import mcp_directive, registry, waiting
from tests.test_review_attacks_s38 import failed
from tests.test_secret_forms import _fragments
from tests.test_tool_types import audited_calls

TOKEN = "ghp_Q8w7E6r5T4y3U2i1O0pAsDfGhJkL9z8X7c6V"
NOTES = '<read resource="filesystem" path="notes/**"/><write resource="filesystem" path="notes/**"/>'


def _exchange(a, b) -> None:
    """Swap two names (a racer's rename, in three steps here: the worker waits meanwhile)."""
    a.rename(a.with_name(a.name + ".swap"))
    b.rename(a)
    a.with_name(a.name + ".swap").rename(b)


@pytest.fixture
def reflecting() -> Iterator[int]:
    """An HTTP server on 127.0.0.1 answering every POST 200 `application/json` with a body that is no JSON and
    holds the request's X-Api-Key header at both ends, as a proxy reflecting the request into a broken answer
    would; its port."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            key = self.headers.get("X-Api-Key", "")
            raw = ("{" + key + " not json " + "P" * 200 + " tail " + key).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    with loopback_http(Handler) as port:
        yield port


async def test_an_http_servers_malformed_answer_shows_no_part_of_a_reflected_secret(
    runs, project, reflecting, monkeypatch
):
    """Hostile review s39: an HTTP MCP server's answer that is no JSON failed the SDK's parse, whose message
    quotes the body cut to its head and tail; the header's token reflected at both ends of the body was no
    longer whole where it was scrubbed, and head and tail together rebuilt it in the agent's answer, the audit
    trail, the worker's log and the run's history. What pydantic quotes is no longer shown."""
    monkeypatch.setenv("KIWI_S39_KEY", TOKEN)
    registry(
        project,
        "mcps:\n  webbad:\n    type: streamable-http\n"
        f"    url: http://127.0.0.1:{reflecting}/mcp\n    headers: {{X-Api-Key: '${{KIWI_S39_KEY}}'}}\n",
    )
    mcp_directive(
        project,
        "probe",
        tools='<mcp name="webbad"><tool>x</tool></mcp>',
        permissions='<execute resource="mcp" name="webbad" actions="x"/>',
        body='<step name="work"><action>Call it.</action></step>',
    )
    run_id = await runs.start("probe", {})
    await wait_for(lambda: waiting(runs, run_id), what="the agent step")

    failed = await runs.call_tool(run_id, "webbad.x", {})

    assert failed.status == "error" and "MCP server 'webbad' is unavailable" in failed.reason, failed
    await runs.cancel(run_id, "done")
    audit = await audited_calls(project, run_id, 1)
    history = await runs.handle(run_id).fetch_history()
    for where, text in {
        "history": "\n".join(str(event) for event in history.events),
        "audit": json.dumps(audit),
        "answer": failed.model_dump_json(),
    }.items():
        seen = [piece for piece in _fragments(TOKEN) if piece in text]
        assert not seen, f"part of the secret reached the {where}: {seen}"
    assert "Invalid JSON" in failed.reason and "input_value not shown" in failed.reason, failed.reason


async def test_attack_a_folder_swapped_in_after_a_moves_check_is_not_moved(runs, project, monkeypatch):
    """Hostile review s39: filesystem.move checked the folder it opened, then renamed by name; another program
    exchanging a folder holding a link out of the project into that name between the check and the rename
    (renameat2 RENAME_EXCHANGE in a loop, from outside the worker) had the unchecked folder moved, and the link
    landed. The swap is made here at that moment: what moved must be what was checked, else nothing moves."""
    deep = project / "notes" / "deep"
    write(deep / "a" / "f.txt", "clean\n")
    write(deep / "evil" / "g.txt", "evil\n")
    outside = project.parent / f"outside-{project.name}"
    outside.mkdir()
    (deep / "evil" / "L").symlink_to("../../../" + outside.name)
    swapped = swap_after_check(monkeypatch, "notes/deep/a", lambda: _exchange(deep / "a", deep / "evil"))
    run_id = await agent_run(runs, project, "mover", NOTES)

    moved = await runs.call_tool(
        run_id, "filesystem.move", {"source": "notes/deep/a", "destination": "notes/a"}
    )

    assert swapped and moved.status == "denied", moved
    assert "was replaced by another program while Kiwi moved it" in moved.reason, moved.reason
    assert not (project / "notes" / "a").exists()
    assert (deep / "a" / "L").is_symlink() and (deep / "evil" / "f.txt").is_file()  # (as the racer left them)
    await runs.cancel(run_id)


async def test_attack_a_secret_the_agent_sends_is_scrubbed_from_the_runs_status(runs, project, monkeypatch):
    """Hostile review s39: a secret the worker knows (an MCP server's token), sent by the agent in a path, was
    `[secret NAME]` in the audit trail and raw in the run's status (`kiwi status`, execute(run, status), the run's
    MCP resource: the refusal's reason quotes the path). The status query scrubs it as the audit trail does."""
    from kiwi.upstream import pool

    monkeypatch.setattr(pool, "KNOWN_SECRETS", {"LEAK_TOKEN": "sk-LEAKsecretValue1234567890abcdefXYZ"})
    run_id = await agent_run(runs, project, "reader", '<read resource="filesystem" path="notes/**"/>')

    refused = await runs.call_tool(
        run_id, "filesystem.read", {"path": "/etc/sk-LEAKsecretValue1234567890abcdefXYZ"}
    )

    assert refused.status == "denied", refused
    shown = (await runs.status(run_id)).model_dump_json()
    assert "sk-LEAK" not in shown and "[secret LEAK_TOKEN]" in shown, shown
    await runs.cancel(run_id)


async def test_attack_a_folder_swapped_in_below_a_moved_folder_is_checked_where_it_lands(
    runs, project, monkeypatch
):
    """Hostile review s39, second round: the moved folder's identity was checked, but a folder swapped in below
    it after the check (renameat2 exchange of notes/src/sub with notes/a/b/c/sub, whose link leads out from
    notes/dst/sub) moved along unchecked and landed. The landed tree is checked again through the folder that
    moved, and the move put back when it fails."""
    write(project / "notes" / "src" / "sub" / "f.txt", "clean\n")
    deep = project / "notes" / "a" / "b" / "c" / "sub"
    deep.mkdir(parents=True)
    (deep / "L").symlink_to("../../../../outside39")  # (inside the project from there: notes/outside39)
    swapped = swap_after_check(
        monkeypatch, "notes/src", lambda: _exchange(project / "notes" / "src" / "sub", deep)
    )
    run_id = await agent_run(runs, project, "mover", NOTES)

    moved = await runs.call_tool(
        run_id, "filesystem.move", {"source": "notes/src", "destination": "notes/dst"}
    )

    assert swapped and moved.status == "denied" and "symbolic link" in moved.reason, moved
    assert not (project / "notes" / "dst").exists()
    assert (project / "notes" / "src" / "sub" / "L").is_symlink()  # (put back as the racer left it)
    await runs.cancel(run_id)


async def test_attack_a_folder_swapped_in_below_a_deleted_folder_is_not_emptied(runs, project, monkeypatch):
    """Hostile review s39, second round: filesystem.delete checked the folder's tree, then emptied it reopening
    each folder below by name; another program exchanging notes/t/sub with keep/important (outside the grant) after
    the check had keep's files deleted. Only what the check saw is deleted: the rest is kept, and the delete
    refused."""
    for i in range(3):
        write(project / "notes" / "t" / "sub" / f"f{i}.txt", "mine\n")
        write(project / "keep" / "important" / f"imp{i}.txt", "IMPORTANT\n")
    swapped = swap_after_check(
        monkeypatch,
        "notes/t",
        lambda: _exchange(project / "notes" / "t" / "sub", project / "keep" / "important"),
    )
    run_id = await agent_run(runs, project, "cleaner", NOTES)

    deleted = await runs.call_tool(run_id, "filesystem.delete", {"path": "notes/t"})

    assert swapped and deleted.status == "denied" and "changed while Kiwi deleted it" in deleted.reason, (
        deleted
    )
    important = sorted(p.name for p in project.rglob("imp*.txt") if p.read_text() == "IMPORTANT\n")
    assert important == ["imp0.txt", "imp1.txt", "imp2.txt"], important
    await runs.cancel(run_id)


async def test_git_outside_a_repository_names_the_fix(runs, project):
    """README trial s39: git.commit in a project that is no repository answered only "not a git repository: git
    tools are unavailable here"; the answer's hint now names what a human does."""

    run_id = await agent_run(
        runs,
        project,
        "gitless",
        '<read resource="filesystem" path="**"/><execute resource="tool" id="git.status"/>',
    )
    answer = await runs.call_tool(run_id, "git.status", {})
    assert answer.error_type == "GitUnavailable" and "`git init`" in answer.hint, answer
    await runs.cancel(run_id)


async def test_an_unsigned_directives_refused_step_says_to_sign_it(runs, project):
    """README trial s39: an unsigned directive's run, refused a program its <permissions> grant, was told to add
    that very grant. With the base policy's grants alone, the fix its error names is a human's signature."""
    from tests.helpers import directive_md

    body = '<step name="sorted"><tool_call tool="shell.run"><param name="command">sort notes.txt</param></tool_call></step>'
    grants = '<read resource="filesystem" path="**"/><execute resource="shell" commands="sort"/>'
    write(project / ".ai" / "directives" / "sorter.md", directive_md(body, name="sorter", permissions=grants))
    write(project / "notes.txt", "b\na\n")
    run_id = await runs.start("sorter", {})
    status = await wait_for(lambda: failed(runs, run_id), what="the run to fail at its step")
    assert "step 'sorted': shell.run denied" in status.error, status.error
    assert "the directive is not signed: its run has only the grants its <permissions> share" in status.error
    assert 'add <execute resource="shell"' not in status.error, status.error


async def test_attack_a_move_put_back_never_overwrites_and_says_where_it_left_what_it_moved(
    runs, project, monkeypatch
):
    """Hostile review s39, third round: the put-back after a swapped source was a blind rename by name: it moved
    back whatever was at the destination (a link another program put there), overwrote a file saved under the
    source's name since, and when it failed the error still said nothing was moved. It now puts back only what it
    moved, never over anything, and says where it left it when it cannot."""
    from activities import filesystem

    write(project / "notes" / "src" / "f.txt", "clean\n")
    write(project / "notes" / "evil" / "g.txt", "evil\n")
    swapped = swap_after_check(
        monkeypatch, "notes/src", lambda: _exchange(project / "notes" / "src", project / "notes" / "evil")
    )
    lstat = filesystem._lstat
    looks, saved = [], []

    def lstat_after_a_save(parent, name):
        looks.append(name)
        if swapped and looks.count("dst") == 2 and not saved:  # (after the rename: an editor saves just then)
            write(project / "notes" / "src", "the human's new save\n")
            saved.append(name)
        return lstat(parent, name)

    monkeypatch.setattr(filesystem, "_lstat", lstat_after_a_save)
    run_id = await agent_run(runs, project, "mover", NOTES)

    moved = await runs.call_tool(
        run_id, "filesystem.move", {"source": "notes/src", "destination": "notes/dst"}
    )

    assert saved and moved.status == "denied", moved
    assert "could not be put back safely: it is at 'notes/dst', unchecked" in moved.reason, moved.reason
    assert (project / "notes" / "src").read_text() == "the human's new save\n"  # (never overwritten)
    assert (project / "notes" / "dst" / "g.txt").read_text() == "evil\n"  # (where the answer says)
    await runs.cancel(run_id)
