"""Item store and search: project over user space, relevance, incremental index, CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kiwi.cli import main as kiwi
from kiwi.errors import ItemNotFound
from kiwi.items.store import ItemStore
from tests.helpers import COMPAT, directive_md, write


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert kiwi(["init"]) == 0
    return tmp_path


def make_directive(root: Path, name: str, description: str, category: str = "tests") -> Path:
    text = (
        directive_md('<step name="s"><action>x</action></step>', name=name)
        .replace(f"Demo directive {name}", description)
        .replace("<category>tests", f"<category>{category}")
    )
    return write(root / "directives" / category / f"{name}.md", text)


def test_search_ranks_by_relevance_and_filters(project):
    ai = project / ".ai"
    make_directive(ai, "deploy_database", "Deploy the database schema to production", "deployment")
    make_directive(ai, "deploy_docs", "Publish the documentation site", "deployment")
    make_directive(ai, "clean_cache", "Remove stale cache files", "maintenance")
    store = ItemStore(project)
    results = store.search("deploy database")
    assert [r.item_id for r in results][:1] == ["deploy_database"]
    assert all(r.item_type == "directive" for r in store.search("deploy", item_type="directive"))
    assert [r.item_id for r in store.search("deploy", category="maintenance")] == []
    assert {r.item_id for r in store.search("deploy", category="deployment")} == {
        "deploy_database",
        "deploy_docs",
    }
    words = store.search("words", item_type="tool")
    assert words and words[0].item_id == "word_count" and words[0].snippet


def test_project_wins_over_user_and_duplicates_are_reported(project, monkeypatch, tmp_path_factory):
    user = tmp_path_factory.mktemp("user")
    make_directive(user, "shared_one", "user copy")
    make_directive(project / ".ai", "shared_one", "project copy")
    store = ItemStore(project, user=user)
    found = store.find("directive", "shared_one")
    assert found.source == "project" and found.description == "project copy"
    assert len(found.shadows) == 1 and found.shadows[0].startswith("user: ")
    assert store.find("directive", "shared_one", source="user").description == "user copy"
    with pytest.raises(ItemNotFound) as info:
        store.find("directive", "shared_onee")
    assert "shared_one" in info.value.hint


def test_index_updates_incrementally(project):
    ai = project / ".ai"
    store = ItemStore(project)
    first = store.refresh()
    assert first["added"] >= 3
    assert store.refresh() == {"added": 0, "updated": 0, "removed": 0, "unchanged": first["added"]}
    path = make_directive(ai, "fresh_item", "A brand new zebra directive")
    assert store.refresh()["added"] == 1
    assert [r.item_id for r in store.search("zebra")] == ["fresh_item"]
    path.write_text(path.read_text().replace("zebra", "giraffe"))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    assert store.refresh()["updated"] == 1
    assert store.search("zebra") == [] and store.search("giraffe")[0].item_id == "fresh_item"
    path.unlink()
    assert store.refresh()["removed"] == 1
    # A second store over the same project reuses the persistent index.
    assert ItemStore(project).refresh()["added"] == 0


def test_compat_items_load_through_the_store(project):
    ai = project / ".ai"
    shutil.copy(COMPAT / "directives" / "agent.AGENTS.md", ai / "directives" / "agent.AGENTS.md")
    for name in ("001-email-deliverability.from-API.md", "quality-curve.from-GSD_MIGRATION_PLAN.md"):
        shutil.copy(COMPAT / "knowledge" / name, ai / "knowledge" / name)
    shutil.copy(
        COMPAT / "tools" / "context7_resolve_library.from-MCP_DISCOVERY_WORKFLOW.yaml",
        ai / "tools" / "c7.yaml",
    )
    store = ItemStore(project)
    assert store.load_directive("agent")[0].version == "1.1.0"
    assert store.load("knowledge", "quality-curve").parsed.category == "patterns/context-engineering"
    tool = store.load("tool", "context7_resolve_library").parsed
    assert tool.tool_type == "mcp" and tool.json_schema()["required"] == ["libraryName", "query"]
    assert store.search("context window quality")[0].item_id == "quality-curve"


def test_cli_validate_exit_codes_and_json(project, capsys):
    assert kiwi(["validate", ".ai"]) == 0
    out = capsys.readouterr().out
    assert "step write_greeting: runs by itself" in out and "step confirm: waits for the agent" in out
    bad = write(
        project / ".ai" / "directives" / "bad.md",
        directive_md('<step name="a"/><step name="a"/>', name="bad"),
    )
    assert kiwi(["validate", str(bad), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False
    assert any('step name "a" is used twice' in p["message"] for p in report["items"][0]["problems"])


def test_cli_sign_refuses_invalid_and_signs_valid(project, capsys):
    good = project / ".ai" / "directives" / "hello_kiwi.md"
    assert kiwi(["sign", str(good)]) == 0
    assert good.read_text().startswith("<!-- kiwi:signed:")
    assert kiwi(["validate", str(good)]) == 0
    assert "signature valid" in capsys.readouterr().out
    good.write_text(good.read_text().replace("Hello", "Howdy"))
    kiwi(["validate", str(good)])
    assert "modified after signing" in capsys.readouterr().out
    bad = write(project / "junk.md", "\x89PNG\r\n\x1a\n")
    before = bad.read_bytes()
    assert kiwi(["sign", str(bad)]) == 1
    assert bad.read_bytes() == before


def test_cli_search_and_show(project, capsys):
    assert kiwi(["search", "greeting", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert results[0]["item_id"] == "hello_kiwi"
    assert kiwi(["show", "hello_kiwi"]) == 0
    assert "step count_words: auto" in capsys.readouterr().out
    assert kiwi(["show", "zzqx"]) == 1
    err = capsys.readouterr().err
    # (Trial F27: it said "no knowledge", the last kind it looked for.)
    assert "kiwi: no item named 'zzqx' (directive, tool or knowledge)" in err
    assert "hint: run `kiwi search` to list items" in err
    assert kiwi(["show", "hello_kiwy"]) == 1
    assert "hint: did you mean: directive hello_kiwi?" in capsys.readouterr().err
    assert kiwi(["show", "--type", "tool", "hello_kiwy"]) == 1
    assert "kiwi: no tool 'hello_kiwy'" in capsys.readouterr().err


def test_a_search_of_no_words_lists_the_items_as_the_hints_say(project, capsys):
    """README trial s34: the hints `run 'kiwi search --type directive' to list them` and `run 'kiwi search' to list
    items` failed (a query was required), and `kiwi search '*'` matched nothing; the front end's search with no
    query answered nothing as well. No words list the items, by type and id (the registry's search did so)."""
    make_directive(project / ".ai", "deploy_docs", "Publish the documentation site", "deployment")
    with pytest.raises(ItemNotFound) as missing:
        ItemStore(project).find("directive", "zzqx")
    assert missing.value.hint == "run `kiwi search --type directive` to list them"
    assert kiwi(["search", "--type", "directive", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["results"]
    assert [(r["item_type"], r["item_id"]) for r in listed] == [
        ("directive", "deploy_docs"),
        ("directive", "hello_kiwi"),
    ]
    assert kiwi(["search", "*", "--json"]) == 0
    every = [(r["item_type"], r["item_id"]) for r in json.loads(capsys.readouterr().out)["results"]]
    assert every == [
        ("directive", "deploy_docs"),
        ("directive", "hello_kiwi"),
        ("knowledge", "kiwi-directives"),
        ("tool", "word_count"),
    ]
    # A listing cut at --limit says so (README trial s34: it stopped at the default 10 without a word).
    assert kiwi(["search", "--limit", "2"]) == 0
    cut = capsys.readouterr()
    assert len(cut.out.splitlines()) == 2 and "(the first 2; --limit N shows more)" in cut.err, cut
    assert [r.item_id for r in ItemStore(project).search("", category="deployment")] == ["deploy_docs"]
    assert [r.item_id for r in ItemStore(project).search("", item_type="directive", limit=1)] == [
        "deploy_docs"
    ]


def test_console_script_help_lists_every_command():
    out = subprocess.run(
        [sys.executable, "-m", "kiwi", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in ("init", "validate", "sign", "search", "show"):
        assert command in out


def test_init_says_which_of_several_keys_signed(tmp_path, monkeypatch, capsys):
    """Trial F23: with several signing keys, init signed with the first one without a word."""
    monkeypatch.chdir(tmp_path)
    assert kiwi(["keys", "init", "--name", "alpha"]) == 0
    assert kiwi(["keys", "init", "--name", "beta"]) == 0
    capsys.readouterr()
    (tmp_path / "p").mkdir()
    assert kiwi(["init", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "you have 2 signing keys (alpha, beta); 'alpha' signs here" in out
    assert "signed .ai/directives/hello_kiwi.md with your key 'alpha'" in out


def test_an_item_asked_for_in_the_other_space_is_named_where_it_is(project):
    """README trial s39: load(source="user") of a project directive said "no directive 'hello_kiwi' in PROJECT,
    USER" and "did you mean: hello_kiwi?". It says which space has it, and how to ask for it."""
    from kiwi.errors import ItemNotFound
    from kiwi.items.store import ItemStore

    store = ItemStore(project)
    with pytest.raises(ItemNotFound) as missing:
        store.find("directive", "hello_kiwi", source="user")
    assert "no directive 'hello_kiwi' in the user space" in missing.value.message
    assert missing.value.message.endswith("it is in the project space"), missing.value.message
    assert "source='project'" in missing.value.hint and "did you mean" not in missing.value.hint
