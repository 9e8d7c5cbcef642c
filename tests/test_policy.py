"""The permission model: globs that mean what they say, shell parsing, intersection and escalation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiwi.globs import first_match, glob_covered, glob_match, glob_reaches_below
from kiwi.policy import PermissionEntry, PermissionSet


def grants(*entries: tuple[str, dict[str, str]]) -> PermissionSet:
    return PermissionSet.from_entries([PermissionEntry(tag=t, attrs=a) for t, a in entries])


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("src/*.ts", "src/a.ts", True),
        ("src/*.ts", "src/a/b.ts", False),  # the seed's fnmatch bug
        ("src/**", "src/a/b.ts", True),
        ("src/**", "src", True),
        ("src/**", "srcx/a", False),
        ("**/*.md", "a.md", True),
        ("**/*.md", "x/y/a.md", True),
        ("tests/unit/*.py", "tests/unit/test_a.py", True),
        ("tests/unit/*.py", "tests/test_a.py", False),
        ("a/**/b", "a/b", True),
        ("a/**/b", "a/x/y/b", True),
        ("**/**", "src/src", True),
    ],
)
def test_glob_semantics(pattern, path, expected):
    assert glob_match(pattern, path) is expected


@pytest.mark.parametrize(
    ("args", "allowed", "reason"),
    [
        ({"path": "src/app.py"}, True, ""),
        ({"path": "src/../../etc/passwd"}, False, "leaves the project root"),
        ({"path": "../secret"}, False, "leaves the project root"),
        ({"path": "/etc/passwd"}, False, "absolute path"),
        ({"path": "config/secrets.yaml"}, False, "read not allowed on 'config/secrets.yaml'"),
        ({}, False, "non-empty 'path'"),
    ],
)
def test_filesystem_reads(args, allowed, reason):
    decision = grants(("read", {"resource": "filesystem", "path": "src/**"})).check("filesystem.read", args)
    assert decision.allowed is allowed
    assert reason in decision.reason
    if not allowed and "not allowed" in reason:
        assert decision.hint == 'add <read resource="filesystem" path="config/**"/> to <permissions>'


@pytest.mark.parametrize(
    ("command", "allowed", "reason"),
    [
        ("git status", True, ""),
        ("git status; rm -rf /", False, "';'"),
        ("echo $(whoami)", False, "'$'"),
        ("echo `whoami`", False, "'`'"),
        ("git add . && git commit", False, "'&'"),
        ("git log > out.txt", False, "'>'"),
        ("npm install", False, "not in the allowlist"),
        ("/usr/bin/git status", False, "by name"),
        ("git 'unbalanced", False, "cannot be parsed"),
        ("sudo git status", False, "blocked by the harness"),
    ],
)
def test_shell_commands(command, allowed, reason):
    # git reads the whole repository, so it needs read on the whole project (kiwi.shellpolicy).
    g = grants(
        ("execute", {"resource": "shell", "commands": "git,sudo"}),
        ("read", {"resource": "filesystem", "path": "**"}),
    )
    decision = g.check("shell.run", {"command": command}, blocked_commands=["sudo", "rm -rf"])
    assert decision.allowed is allowed, decision
    assert reason in decision.reason


def test_mcp_tool_allowlists_both_syntaxes_and_denials_win():
    g = grants(
        ("execute", {"resource": "mcp", "name": "supabase", "actions": "query,list"}),
        ("execute", {"resource": "github", "action": "*"}),
        ("deny", {"resource": "github", "action": "delete_repo"}),
    )
    assert g.check("supabase.query", {}).allowed
    assert not g.check("supabase.drop", {}).allowed
    assert g.check("github.create_pull_request", {}).allowed
    denied = g.check("github.delete_repo", {})
    assert not denied.allowed and "explicitly denied" in denied.reason
    assert not g.check("word_count", {}).allowed


def test_child_exceeding_parent_is_reported_and_intersection_narrows():
    parent = grants(
        ("read", {"resource": "filesystem", "path": "src/**"}),
        ("write", {"resource": "filesystem", "path": "tests/**"}),
        ("execute", {"resource": "shell", "commands": "git"}),
    )
    child = grants(
        ("read", {"resource": "filesystem", "path": "**/*"}),
        ("write", {"resource": "filesystem", "path": "src/**"}),
        ("execute", {"resource": "shell", "commands": "git,npm"}),
    )
    assert child.exceeds(parent) == ["read **/*", "write src/**", "shell npm"]
    effective = parent.intersect(child)
    assert effective.check("filesystem.read", {"path": "src/a.py"}).allowed
    assert not effective.check("filesystem.read", {"path": "docs/a.md"}).allowed
    assert not effective.check("filesystem.write", {"path": "src/a.py"}).allowed
    assert not effective.check("shell.run", {"command": "npm test"}).allowed
    subset = grants(("read", {"resource": "filesystem", "path": "src/utils/**"}))
    assert subset.exceeds(parent) == []


SEGMENTS = st.sampled_from(["src", "a", "b", "x.py", "y.ts", "*", "**", "*.py", "a*", "?"])
PATTERNS = st.lists(SEGMENTS, min_size=1, max_size=4).map("/".join)
PATHS = st.lists(st.sampled_from(["src", "a", "b", "x.py", "y.ts", "ab", "z"]), min_size=1, max_size=5).map(
    "/".join
)


@settings(max_examples=400, deadline=None)
@given(PATTERNS, PATTERNS, PATHS)
def test_glob_covered_is_sound(inner, outer, path):
    if glob_covered(inner, outer) and glob_match(inner, path):
        assert glob_match(outer, path)


@settings(max_examples=600, deadline=None)
@given(PATTERNS, PATHS, PATHS)
def test_glob_reaches_below_is_sound_and_exact_for_a_path_below(pattern, folder, rest):
    """A folder read (grep -r FOLDER) is refused when a denied pattern reaches below the folder: never
    missing a path below it that the pattern matches."""
    if glob_match(pattern, f"{folder}/{rest}"):
        assert glob_reaches_below(pattern, folder)
        assert glob_reaches_below(pattern, ".")


def test_glob_reaches_below_leaves_folders_the_pattern_cannot_reach():
    assert not glob_reaches_below("secrets/**", "src")
    assert not glob_reaches_below("*.env", "src")  # (* stays in the root folder)
    assert not glob_reaches_below("src/*/key.pem", "src/a/b")
    assert not glob_reaches_below("src/key.pem", "src/key.pem")
    assert glob_reaches_below("**/*.pem", "docs") and glob_reaches_below("secrets/**", "secrets")


@settings(max_examples=300, deadline=None)
@given(st.lists(PATTERNS | st.sampled_from(["/src/**", "./a/*.py", "."]), max_size=6), PATHS)
def test_first_match_agrees_with_trying_every_pattern_in_order(patterns, path):
    # first_match only tries patterns that can match the path's first segment; it must find the same one.
    assert first_match(patterns, path) == next((p for p in patterns if glob_match(p, path)), None)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(PATTERNS, max_size=3),
    st.lists(PATTERNS, max_size=3),
    PATHS,
    st.lists(st.sampled_from(["git", "npm", "ls", "*"]), max_size=3),
    st.lists(st.sampled_from(["git", "npm", "ls", "*"]), max_size=3),
    st.sampled_from(["git", "npm", "ls"]),
)
def test_intersection_never_grants_more_than_either_side(p_read, c_read, path, p_shell, c_shell, command):
    parent = PermissionSet(fs_read=p_read, shell=p_shell)
    child = PermissionSet(fs_read=c_read, shell=c_shell)
    both = parent.intersect(child)
    for mode_check in (
        lambda g: g.check_path("read", path).allowed,
        lambda g: g.check_shell({"argv": [command]}, []).allowed,
    ):
        if mode_check(both):
            assert mode_check(parent) and mode_check(child)
    if not child.exceeds(parent):
        # A child within its parent keeps everything it declared.
        assert child.check_path("read", path).allowed <= both.check_path("read", path).allowed


@pytest.mark.parametrize(
    ("host", "port", "scheme", "allowed"),
    [
        ("api.example.com", 443, "https", True),
        ("api.example.com", 80, "http", True),
        ("api.example.com", 8443, "https", False),  # no port in the grant: the scheme's own only
        ("API.Example.com.", 443, "https", True),
        ("evil.com", 443, "https", False),
        ("api.example.com.evil.com", 443, "https", False),
        ("127.0.0.1", 8080, "http", True),
        ("127.0.0.1", 8081, "http", False),
        ("deep.sub.example.org", 443, "https", True),
        ("example.org", 443, "https", False),  # *.example.org is its subdomains only
        ("xexample.org", 443, "https", False),
        ("::1", 9000, "http", True),
        ("api.example.com", 443, "ftp", False),
    ],
)
def test_network_grants_name_hosts_and_ports(host, port, scheme, allowed):
    granted = grants(
        (
            "execute",
            {"resource": "network", "hosts": "api.example.com, 127.0.0.1:8080,*.example.org,[::1]:9000"},
        )
    )
    assert granted.check_host(host, port, scheme).allowed is allowed


def test_network_denial_wins_and_a_child_gets_only_hosts_its_parent_has():
    parent = grants(("execute", {"resource": "network", "hosts": "a.example.com,b.example.com"}))
    child = grants(("execute", {"resource": "network", "hosts": "b.example.com,c.example.com"}))
    assert child.exceeds(parent) == ["network c.example.com"]
    assert parent.intersect(child).network_hosts == ["b.example.com"]
    denied = grants(
        ("execute", {"resource": "network", "hosts": "a.example.com"}), ("deny", {"resource": "network"})
    )
    assert not denied.check_host("a.example.com", 443, "https").allowed
    assert not PermissionSet().check_host("a.example.com", 443, "https").allowed


@pytest.mark.parametrize(
    ("attrs", "says"),
    [
        ({"hosts": ""}, 'needs hosts="HOST[:PORT],..."'),
        ({"hosts": "*"}, "network host '*' is not HOST or HOST:PORT"),
        ({"hosts": "https://api.example.com/v1"}, "without scheme or path"),
        ({"host": "api.example.com"}, "has no attribute 'host'"),
    ],
)
def test_a_network_grant_that_names_no_host_is_an_error(attrs, says):
    from kiwi.policy import entry_problems

    problems = entry_problems(PermissionEntry(tag="execute", attrs={"resource": "network", **attrs}))
    assert any(says in p for p in problems), problems


@pytest.mark.parametrize("word", ['we"ird', "a&b<c", "plain"])
def test_a_refusals_hint_is_xml_whatever_the_name_it_holds(word):
    """README trial s38: a hint built from a name holding `"` was no XML, so the grant an author copied from it broke
    the directive. Each hint's element parses, and its attribute is the name refused."""
    import xml.etree.ElementTree as ET

    grants = PermissionSet(shell=["ls"])
    hints = {
        "commands": grants.check_shell({"argv": [word, "x"]}, []).hint,
        "name": grants.check_tool_id(f"{word}.tool").hint,
        "id": grants.check_tool_id(word).hint,
        "path": grants.check_path("read", f"{word}.txt").hint,
    }
    for attribute, hint in hints.items():
        element = ET.fromstring(hint.removeprefix("add ").partition(" to <permissions>")[0])
        assert word in element.get(attribute), (attribute, hint)
