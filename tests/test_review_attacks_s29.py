"""Review s29: hostile reviews of the MCP front end's grants and of shell.run, as an agent would attack them,
against the real stack (a Temporal server, Kiwi's worker, real programs). Each test's docstring says the attack
and the safe outcome."""

from __future__ import annotations

import pytest

from tests.test_attack_shell import agent_run, shell


def _grants(commands: str, read: str = "**", write: str = "**") -> str:
    return (
        f'<read resource="filesystem" path="{read}"/><write resource="filesystem" path="{write}"/>'
        f'<execute resource="shell" commands="{commands}"/>'
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["split", "--filter=touch PWNED-split", "notes/a.md"], "'--filter=touch PWNED-split' is refused"),
        (["split", "-l", "1", "--fil", "touch PWNED-split", "notes/a.md"], "'--fil' is refused"),
        (["sdiff", "--diff-program=./run-me", "notes/a.md", "notes/b.md"], "with it sdiff starts"),
        (["diff3", "--diff-prog=./run-me", "notes/a.md", "notes/b.md", "notes/a.md"], "with it diff3 starts"),
        (["install", "-s", "--strip-program=./run-me", "notes/a.md", "out"], "with it install starts"),
        (["groff", "-U", "notes/a.md"], "'groff' is refused: it starts other programs"),
    ],
)
async def test_a_granted_program_starts_no_program_an_option_names(runs, project, argv, said):
    """Attack (review s29): `split --filter=CMD` runs CMD through /bin/sh, and `sdiff`/`diff3 --diff-program`,
    `install -s --strip-program` run the program named; the checks let each pass, so one grant of split gave an
    unconfined worker every program (the approver's key read, the agent's own call approved). The worker now
    refuses them (abbreviations too), and programs that start their helpers (groff) whole; nothing runs."""
    (project / "notes").mkdir()
    (project / "notes" / "a.md").write_text("a\nb\n")
    (project / "notes" / "b.md").write_text("a\nc\n")
    (project / "run-me").write_text("#!/bin/sh\ntouch PWNED-program\n")
    (project / "run-me").chmod(0o755)
    run_id = await agent_run(runs, project, "starter", _grants(argv[0]))
    result = await shell(runs, run_id, *argv)
    assert result.status == "denied" and said in result.reason, result
    assert not list(project.rglob("PWNED*"))
    if argv[0] == "split":  # (what split is for runs)
        plain = await shell(runs, run_id, "split", "-l", "1", "notes/a.md", "notes/part-")
        assert plain.status == "ok" and (project / "notes" / "part-ab").read_text() == "b\n", plain
