"""Programs Kiwi does not model (a signed directive names them: Kiwi reads their words as reads and knows no
option of theirs that writes or starts a program) run only inside the kernel's wall. On a worker that confines
no command (no Landlock, KIWI_CONFINE=off), the worker refuses them; the programs Kiwi models run as before.
Against the real stack (a Temporal server, Kiwi's worker, real programs)."""

from __future__ import annotations

import pytest

from activities import confinement
from tests.test_attack_shell import agent_run, audited_denial, shell


def _grants(commands: str) -> str:
    """Read the project, write nothing, run ``commands``."""
    return f'<read resource="filesystem" path="**"/><execute resource="shell" commands="{commands}"/>'


async def test_an_unconfined_worker_refuses_a_program_it_does_not_model(runs, project, monkeypatch):
    """Kiwi reads dd's words only for the paths they name, as reads: `of=PWNED` passed a run that may read the
    project and write nothing. Behind the kernel's wall dd could write nothing there; on a worker with no wall
    (here KIWI_CONFINE=off), it made the file. The worker now refuses dd there, naming why and what to do;
    `ls`, which Kiwi models, still runs."""
    monkeypatch.setenv("KIWI_CONFINE", "off")
    (project / "notes.txt").write_text("one\n")
    run_id = await agent_run(runs, project, "copier", _grants("dd,ls"))

    result = await shell(runs, run_id, "dd", "if=notes.txt", "of=PWNED")

    assert result.status == "denied", result
    assert "'dd' is not a program Kiwi models" in result.reason, result.reason
    assert "confines no command (KIWI_CONFINE=off)" in result.reason and "Landlock" in result.reason
    assert not (project / "PWNED").exists()
    await audited_denial(project, run_id, result.reason)
    listed = await shell(runs, run_id, "ls")
    assert listed.status == "ok" and "notes.txt" in listed.result["stdout"], listed


@pytest.mark.skipif(confinement.landlock.abi_version() == 0, reason="this kernel has no Landlock")
async def test_a_confined_worker_runs_it_inside_the_wall(runs, project, monkeypatch):
    """Where the kernel confines commands, dd runs, and writes nothing the run may not."""
    monkeypatch.setenv("KIWI_CONFINE", "auto")
    (project / "notes.txt").write_text("one\n")
    run_id = await agent_run(runs, project, "copier", _grants("dd"))

    printed = await shell(runs, run_id, "dd", "if=notes.txt", "status=none")
    written = await shell(runs, run_id, "dd", "if=notes.txt", "of=PWNED")

    assert printed.status == "ok" and printed.result["stdout"] == "one\n", printed
    assert written.status == "ok" and written.result["exit_code"] != 0, written
    assert "Permission denied" in written.result["stderr"], written.result
    assert not (project / "PWNED").exists()


def test_kiwi_doctor_says_such_programs_are_refused_where_nothing_is_confined(monkeypatch):
    monkeypatch.setenv("KIWI_CONFINE", "off")
    note = confinement.platform_note()
    assert note.startswith("shell commands are not confined")
    assert note.endswith("programs Kiwi does not model are refused"), note
