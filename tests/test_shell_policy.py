"""The shell grant, decided in pure code (kiwi.shellpolicy): an allowed program cannot be turned into
another one, reach outside the grants through its arguments, or dodge a blocked command by spelling."""

from __future__ import annotations

import os
import posixpath
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activities.process import GIT_FORCED_CONFIG, child_env
from kiwi.globs import first_match
from kiwi.items.directive import parse_directive
from kiwi.policy import PermissionEntry, PermissionSet
from kiwi.protected import granted
from kiwi.shellpolicy import (
    GIT_REFUSED_OPTIONS,
    GIT_SUBCOMMANDS,
    LATER_REFUSED,
    REFUSED_PROGRAMS,
    SPECS,
    blocked_by,
    check_argv,
    path_arguments,
)
from tests.helpers import directive_md

EVERYTHING = {"read_grants": ["**"], "write_grants": ["**"]}


def check(argv, *, allowed=("*",), blocked=("sudo", "rm -rf"), **grants):
    return check_argv(argv, allowed=list(allowed), blocked=list(blocked), **{**EVERYTHING, **grants})


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["git", "-c", "alias.x=!touch PWNED", "x"], "'-c'"),
        (["git", "-calias.x=!touch PWNED", "x"], "'-c'"),
        (["git", "-C", "/tmp", "status"], "'-C'"),
        # (Session 38: the whole index, a human's staged work included.)
        (["git", "commit", "-m", "msg"], "what a human staged included"),
        (["git", "--git-dir=/tmp/x/.git", "status"], "--git-dir"),
        (["git", "--exec-path=/tmp", "status"], "--exec-path"),
        (["git", "x"], "'git x'"),
        (["git", "config", "core.fsmonitor", "touch PWNED"], "'git config'"),
        (["git", "push"], "'git push'"),
        (["git", "rebase", "-x", "touch PWNED", "HEAD~1"], "'git rebase'"),
        (["git", "diff", "--ext-diff"], "'--ext-diff'"),
        (["git", "diff", "--ext"], "'--ext-diff'"),
        (["git", "grep", "-O", "x"], "'-O'"),
        (["git", "grep", "--open-files-in-pager=touch PWNED", "x"], "--open-files-in-pager"),
        (["git", "init", "--template=evil"], "'--template'"),
        (["git", "status", "--help"], "'--help'"),
        (["git", "add", "-p"], "git add -p"),
        (["git", "diff", "/etc/passwd", "/dev/null"], "'/etc/passwd'"),
        (["git", "diff", "--no-index", "a.txt", "b.txt"], "'git diff --no-index' is refused"),
        (["git", "log", "--output=/tmp/out"], "'/tmp/out'"),
        (["git", "add", ".git/config"], "'.git'"),
        (["find", ".", "-exec", "touch", "PWNED", ";"], "'-exec'"),
        (["find", ".", "-name", "x", "-execdir", "sh", "{}", "+"], "'-execdir'"),
        (["find", ".", "-okdir", "rm", "{}", ";"], "'-okdir'"),
        (["find", "src", "-delete"], "'-delete'"),
        (["find", ".", "-fprint", "out.txt"], "'-fprint'"),
        (["find", "-L", "."], "'-L'"),
        (["rg", "--pre=touch", "x"], "'--pre'"),
        (["rg", "--pre-glob", "*", "x"], "'--pre-glob'"),
        (["rg", "-z", "x"], "'-z'"),
        (["rg", "-iz", "x"], "'-z'"),
        (["sort", "--compress-program=sh", "x"], "'--compress-program'"),
        (["sort", "--compress-prog=sh", "x"], "'--compress-program'"),
        (["tar", "--to-command=sh", "-xf", "a.tar"], "'--to-command'"),
        (["tar", "-I", "sh", "-cf", "a.tar", "src"], "'-I'"),
        (["tar", "--checkpoint-action=exec=sh", "-cf", "a.tar", "src"], "'--checkpoint-action'"),
        (["tar", "-F", "x.sh", "-cf", "a.tar", "src"], "'-F'"),
        (["tar", "-xf", "a.tar"], "'.git'"),
        (["zip", "-TT", "touch PWNED", "-T", "a.zip", "x"], "'-TT'"),
        (["zip", "--unzip-command", "sh", "a.zip", "x"], "'--unzip-command'"),
        (["ls", "/etc"], "'/etc'"),
        (["ls", "~"], "'~'"),
        (["cat", "src/../../x"], "'src/../../x'"),
        (["cp", "src/a", "/tmp/b"], "'/tmp/b'"),
        (["ln", "-s", "/etc/passwd", "x"], "'/etc/passwd'"),
        (["touch", ".ai/logs/x"], "'.ai/logs'"),
        (["rm", "-r", "."], "'.git'"),
        (
            ["dd", "if=/etc/passwd", "of=x"],
            "'dd'",
        ),  # (not a program Kiwi knows: commands="*" does not cover it)
        (["prlimit", "bash", "-c", "touch PWNED"], "'prlimit'"),
        (["chrt", "0", "bash"], "'chrt'"),
        (["setpriv", "--reuid=0", "bash"], "'setpriv'"),
        (["sqlite3", ":memory:", ".shell touch PWNED"], "'sqlite3'"),
        (["dc", "-e", "!touch PWNED"], "'dc'"),
        (["m4"], "'m4'"),
        (["ip", "netns", "exec", "x", "bash"], "'ip'"),
        (["tmux", "new", "touch PWNED"], "'tmux'"),
        (["openssl", "req", "-engine", "./evil.so"], "'openssl'"),
        # (s19 review: curl posted a workflow start to the local Temporal's HTTP API)
        (["curl", "--data-binary", "@notes/body.json", "http://127.0.0.1:8233/api/v1/x"], "'curl'"),
        (["wget", "-qO-", "http://127.0.0.1:7243"], "'wget'"),
        (["frob", "--config=/etc/shadow"], "'frob'"),
        (["env", "touch", "PWNED"], "'env'"),
        (["python3.11", "-c", "print(1)"], "'python3.11'"),
        (["bash", "-c", "id"], "'bash'"),
        (["xargs", "touch"], "'xargs'"),
        (["awk", 'BEGIN{system("id")}'], "'awk'"),
        (["npm", "test"], "'npm'"),
        (["ssh", "host"], "'ssh'"),
        (["vim", "-c", ":!id"], "'vim'"),
    ],
)
def test_each_way_to_run_or_reach_something_else_is_refused_by_name(argv, named):
    decision = check(argv)
    assert not decision.allowed, argv
    assert named in decision.reason, decision.reason
    assert decision.hint or "blocked" in decision.reason or "leaves" in decision.reason


@pytest.mark.parametrize(
    "argv",
    [
        ["git", "status"],
        ["git", "log", "-p", "HEAD~1"],
        ["git", "diff", "HEAD~1", "--", "src"],
        ["git", "show", "HEAD:src/a.py"],
        ["git", "--no-pager", "log", "-n", "3"],
        ["git", "commit", "-m", "msg", "--", "src/a.py"],
        ["git", "add", "src/a.py"],
        ["git", "blame", "-L", "1,2", "src/a.py"],
        ["git", "grep", "-e", "x"],
        ["find", ".", "-name", "*.py", "-type", "f"],
        ["find", "src", "-newer", "src/a.py"],
        ["ls", "-la", "src"],
        ["cat", "src/a.py"],
        ["head", "-n", "5", "src/a.py"],
        ["grep", "-rn", "a/b", "src"],
        ["rg", "--files"],
        ["rg", "-e", "x", "src"],
        ["sort", "-o", "out/s.txt", "src/a.py"],
        ["tar", "-czf", "out/a.tgz", "src"],
        ["cp", "-r", "src", "out/copy"],
        ["rm", "-r", "out/copy"],
        ["echo", "/etc/passwd"],
        ["printenv"],
        ["mkdir", "-p", "out/x"],
        ["ln", "-s", "../src/a.py", "out/link"],
    ],
)
def test_ordinary_uses_stay_allowed(argv):
    decision = check(argv)
    assert decision.allowed, decision


def test_star_covers_only_programs_kiwi_knows_and_a_named_one_still_has_its_paths_checked():
    # A program Kiwi has no model of (which files it writes, whether an option runs something) is not
    # covered by commands="*": a human names it.
    unknown = check(["jq", ".a", "src/a.json"])
    assert not unknown.allowed and "not a program Kiwi knows" in unknown.reason
    assert 'commands="jq"' in unknown.hint
    assert check(["jq", ".a", "src/a.json"], allowed=("jq",)).allowed
    escaped = check(["dd", "if=/etc/passwd", "of=x"], allowed=("dd",))
    assert not escaped.allowed and "'/etc/passwd'" in escaped.reason
    shadow = check(["frob", "--config=/etc/shadow"], allowed=("frob",))
    assert not shadow.allowed and "'/etc/shadow'" in shadow.reason
    # Naming one that starts other programs does not make it run.
    named = check(["prlimit", "bash"], allowed=("prlimit", "bash"))
    assert not named.allowed and "'prlimit' is refused" in named.reason


def test_a_directive_naming_a_refused_or_unknown_program_is_warned_at_validation(tmp_path):
    text = directive_md(
        '<step name="a"><description>a</description></step>',
        permissions='<execute resource="shell" commands="ls,prlimit,jq,*"/>',
    )
    _, problems = parse_directive(text, str(tmp_path / "d.md"))
    warnings = [p.message for p in problems if p.severity == "warning"]
    assert any("'prlimit' is refused even when granted" in w for w in warnings), warnings
    assert any(
        "does not know shell command 'jq'" in w and "kernel confines commands" in w for w in warnings
    ), warnings
    assert not any("'ls'" in w or "'*'" in w for w in warnings), warnings


def test_the_cwd_must_be_a_folder_the_run_reads_inside_the_project():
    assert not check(["ls"], read_grants=["src/**"]).allowed
    assert check(["ls"], read_grants=["src/**"], cwd="src").allowed
    outside = check(["ls"], cwd="../other")
    assert not outside.allowed and "leaves the project" in outside.reason
    assert "cwd" in check(["ls"], read_grants=["src/**"]).reason


def test_paths_resolve_against_the_cwd_and_grants_decide_read_and_write():
    assert check(["cat", "a.py"], read_grants=["src/**"], cwd="src").allowed
    assert not check(["cat", "../b.py"], read_grants=["src/**"], cwd="src").allowed
    assert not check(["rm", "src/a.py"], read_grants=["**"], write_grants=["out/**"]).allowed
    assert check(["rm", "out/a.py"], read_grants=["**"], write_grants=["out/**"]).allowed
    copied = check(["cp", "src/a.py", "src/b.py"], read_grants=["**"], write_grants=["out/**"])
    assert not copied.allowed and "write not allowed on 'src/b.py'" in copied.reason
    denied = check(["cat", "src/secret.txt"], deny_fs=["src/secret.txt"])
    assert not denied.allowed and "explicitly denied" in denied.reason


@pytest.mark.parametrize(
    ("argv", "cwd", "allowed"),
    [
        (["grep", "-r", "KEY", "."], ".", False),
        (["grep", "-r", "KEY"], ".", False),  # (no path: grep -r reads the cwd)
        (["grep", "-r", "KEY", "src"], ".", True),
        (["grep", "KEY", "notes.txt", "src/a.py"], ".", True),  # (files, no recursion)
        (["grep", "-r", "KEY"], "src", True),
        (["rg", "KEY"], ".", False),
        (["rg", "KEY", "docs"], ".", True),
        (["tar", "-czf", "out/a.tgz", "."], ".", False),
        (["tar", "-czf", "out/a.tgz", "--no-recursion", "."], ".", True),
        (["tar", "-cf", "out/a.tar", "-C", ".", "."], ".", False),
        (["zip", "-r", "-y", "out/a.zip", "src"], ".", True),
        (["cp", "-a", ".", "out/all"], ".", False),
        (["cp", "src/a.py", "out/a.py"], ".", True),
        (["ls", "-R"], ".", False),
        (["ls", "-la"], ".", True),  # (names of the cwd only: not below it)
        (["find", "."], ".", False),
        (["du", "-sh", "src"], ".", True),
        # The review of the rule (s24): an option's file is no path operand; GNU's unique starts of long
        # options and of grep -d's action; grep and ls under their other names; diff's folders.
        (["grep", "-r", "KEY", "--exclude-from=-"], ".", False),
        (["grep", "-r", "-e", "KEY", "-f", "src/a.py"], ".", False),
        (["du", "-a", "-X", "-"], ".", False),
        (["grep", "--recur", "KEY"], ".", False),
        (["ls", "--recursiv", "."], ".", False),
        (["cp", "--arc", ".", "out/x"], ".", False),
        (["grep", "-d", "rec", "KEY", "."], ".", False),
        (["grep", "--directories=recu", "KEY", "."], ".", False),
        (["egrep", "-r", "KEY", "."], ".", False),
        (["rgrep", "KEY", "."], ".", False),
        (["dir", "-R", "."], ".", False),
        (["diff", "src/a.py", "src/b.py"], ".", True),
        (["mv", "data", "out/data"], ".", True),  # (nothing denied below data)
    ],
)
def test_a_folder_read_is_refused_when_the_run_denies_a_path_below_the_folder(argv, cwd, allowed):
    verdict = check_argv(
        argv,
        allowed=["*", "egrep", "rgrep", "dir"],
        read_grants=["**"],
        write_grants=["out/**", "data/**"],
        deny_fs=["secrets/**"],
        cwd=cwd,
    )
    assert verdict.allowed is allowed, verdict
    if not allowed:
        assert "which holds paths this run denies ('secrets/**')" in verdict.reason


def test_a_folder_moved_deleted_or_changed_whole_takes_no_denied_path_with_it():
    deny = {"read_grants": ["**"], "write_grants": ["**"], "deny_fs": ["data/secrets/**"]}
    for argv in (
        ["mv", "data", "out/data"],
        ["mv", "-t", "out", "data"],
        ["rm", "-r", "data"],
        ["chmod", "-R", "000", "data"],
        ["zip", "-r", "-y", "-m", "out/a.zip", "data"],
        ["tar", "-c", "-f", "out/a.tar", "--remove-files", "data"],
    ):
        verdict = check(argv, **deny)
        assert not verdict.allowed and "('data/secrets/**')" in verdict.reason, (argv, verdict)
    for argv in (
        ["mv", "notes.txt", "data"],
        ["rm", "data/a.txt"],
        ["chmod", "600", "data"],
        ["rm", "-r", "out"],
    ):
        assert check(argv, **deny).allowed, argv


@pytest.mark.parametrize(
    "argv",
    [
        ["sort", "--files0-from=out/list"],
        ["sort", "--files0", "out/list"],
        ["wc", "--files0-from=-"],
        ["du", "--files0-from=out/list"],
        ["find", "-files0-from", "out/list"],
        ["file", "-f", "out/list"],
        ["file", "--files-from=out/list"],
        ["sha256sum", "-c", "out/sums"],
        ["md5sum", "-wc", "out/sums"],
        ["b2sum", "--check", "out/sums"],
    ],
)
def test_a_list_of_file_names_is_refused_as_tar_t_is(argv):
    """s24 review: the names in such a list are never checked: `sort --files0-from=out/list` read a file
    outside the project (a denial or not)."""
    verdict = check(argv, read_grants=["**"], write_grants=["out/**"])
    assert not verdict.allowed and "reads the names of the files to work on from a list" in verdict.reason


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        # Second review s24: GNU takes these options' values only as --opt=VALUE; the next word is a file.
        (["uniq", "--group", "../../outside/secret.txt"], "leaves the project"),
        (["grep", "--color", "KEY", "../../outside/secret.txt"], "leaves the project"),
        (["grep", "--colour", "KEY", "../../outside/secret.txt"], "leaves the project"),
        (["diff", "--unified", "../../outside/secret.txt", "a.txt"], "leaves the project"),
        (["diff", "--unif", "../../outside/secret.txt", "a.txt"], "leaves the project"),
        (["diff", "--uni", "../../outside/secret.txt", "a.txt"], "abbreviates several of diff's options"),
        (["diff", "--context", "../../outside/secret.txt", "a.txt"], "leaves the project"),
        (["ls", "--color", "../../outside"], "leaves the project"),
        (["mkdir", "--context", "../../outside/made"], "leaves the project"),
        (["rg", "--hostname-bin=evil.sh", "--hyperlink-format=default", "x", "."], "runs the program"),
        (["file", "-C", "-m", "magic"], "compiled magic file"),
        (["cat", "a\\b\\c/../../../x"], "part of a name"),
        (["ln", "-sr", "../../outside/secret.txt", "a/b/c/d/link"], "leaves the project"),
    ],
)
def test_option_values_and_link_targets_are_read_as_the_program_reads_them(argv, named):
    verdict = check(argv, read_grants=["**"], write_grants=["**"], cwd="out")
    assert not verdict.allowed and named in verdict.reason, verdict


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        # Third review s24 (every program's options against the installed ones).
        (["uniq", "-5", "in.txt", "../../outside/made"], "leaves the project"),
        (["uniq", "+5", "in.txt", "../src/a.txt"], "write not allowed"),
        (["tree", "-Lo", "1", "../src/a.txt"], "which Kiwi does not read so"),
        (["mkdir", "-p", "../src/newdir/../../out/x"], "back up with '..'"),
        (["chmod", "-w,a+rwx", "../../outside/secret.txt"], "leaves the project"),
        (["chmod", "-r", "../src/secret.txt"], "explicitly denied"),
        (["date", "010100002030"], "sets the system clock"),
        (["grep", "--binary", "KEY", "../../outside/secret.txt"], "leaves the project"),
        (["rg", "--ignore", "KEY", "../src/secret.txt"], "is not an option of rg that Kiwi knows"),
        (["rg", "-f=../src/secret.txt", "o.txt"], "explicitly denied"),
        (["diff", "-Dx", "../../outside/secret.txt", "../src/a.txt"], "leaves the project"),
        (["file", "-m", "x:../../outside/secret.txt", "f"], "does not check one by one"),
        (["file", "-z", "f"], "decompression programs"),
        (["find", "--", "../../outside"], "leaves the project"),
        (["find", "-O10", "../../outside"], "leaves the project"),
        (["find", "-", "../../outside"], "leaves the project"),
        (["du", "-a", "--time", "../../outside"], "leaves the project"),
        (["md5sum", "--c", "sums"], "from a list"),
        (["wc", "--f=list"], "from a list"),
    ],
)
def test_each_program_is_read_as_it_reads_its_own_options(argv, named):
    verdict = check(argv, read_grants=["**"], write_grants=["out/**"], deny_fs=["src/secret.txt"], cwd="out")
    assert not verdict.allowed and named in verdict.reason, verdict


@pytest.mark.parametrize(
    ("argv", "cwd", "named"),
    [
        # Fourth review s24.
        (["git", "checkout", "evil", "--"], ".", "write not allowed on '.'"),
        (["git", "checkout", "-b", "x2", "evil", "--"], ".", "write not allowed on '.'"),
        (["git", "annotate", "-S../outside/secret", "src/a.txt"], ".", "leaves the project"),
        (["git", "blame", "--contents", "../outside/secret", "../src/a.txt"], "out", "leaves the project"),
        (["git", "grep", "--untracked", "-f", "../outside/secret"], "out", "leaves the project"),
        (["git", "ls-files", "-X", "../outside/secret"], "out", "leaves the project"),
        (["ln", "src/a.txt", "out/h"], ".", "write not allowed on 'src/a.txt'"),
        (["cp", "-l", "src/a.txt", "out/h"], ".", "write not allowed on 'src/a.txt'"),
        (["cp", "-al", "src", "out/x"], ".", "write not allowed on 'src'"),
        (["chmod", "-w", "--", "../src/a.txt"], "out", "write not allowed on 'src/a.txt'"),
    ],
)
def test_git_files_from_the_repository_root_and_hard_links_as_writes(argv, cwd, named):
    verdict = check(argv, read_grants=["**"], write_grants=["out/**"], cwd=cwd)
    assert not verdict.allowed and named in verdict.reason, verdict


def test_git_options_are_read_as_git_reads_them():
    # git reset takes --har for --hard; restore's -S is --staged (no value); init's --shared takes no next word.
    for argv in (
        ["git", "reset", "--har"],
        ["git", "restore", "-W", "-S", "../src/a.txt"],
        ["git", "init", "--shared", "../src/newrepo"],
        # A whole working tree rewrite is the repository's, wherever the cwd is (checked as out/ before).
        ["git", "reset", "--hard"],
        ["git", "checkout", "HEAD~1"],
        ["git", "stash"],
        # Fifth review s24: a new branch with -f resets every tracked file to HEAD, which the agent can
        # point at any tree (`git reset HEAD:out -- src/a.txt`, commit): src/a.txt and .ai/config rewritten.
        ["git", "checkout", "-f", "-b", "evil"],
        ["git", "checkout", "-fb", "evil"],
        ["git", "checkout", "--force", "-B", "evil"],
    ):
        verdict = check(argv, read_grants=["**"], write_grants=["out/**"], cwd="out")
        assert not verdict.allowed and "write not allowed" in verdict.reason, (argv, verdict)
    assert check(["git", "log", "-S", "needle", "-n", "3"], read_grants=["**"]).allowed
    assert check(
        ["git", "checkout", "-q", "-b", "topic"], read_grants=["**"], write_grants=["out/**"]
    ).allowed
    for sub in ("restore", "checkout", "reset", "stash"):
        # -p picks hunks anywhere in the tree, with no path named for Kiwi to check.
        verdict = check(["git", sub, "-p"], read_grants=["**"], write_grants=["**"])
        assert not verdict.allowed and "interactively" in verdict.reason, (sub, verdict)


def test_a_link_made_with_t_has_its_target_read_from_that_folder():
    # ln -s -t DIR TARGET writes DIR/NAME -> TARGET: TARGET is read from DIR, not from the cwd (s24 review).
    argv = ["ln", "-s", "-t", "../../../..", "../../../outside/secret.txt"]
    verdict = check(argv, read_grants=["**"], write_grants=["**"], cwd="out/a/b/c/d/e")
    assert not verdict.allowed and "leaves the project" in verdict.reason, verdict
    assert check(["ln", "-s", "-t", "out", "../src/a.txt"], read_grants=["**"], write_grants=["**"]).allowed


def test_optional_values_given_with_equals_stay_allowed():
    for argv in (
        ["grep", "--color=always", "KEY", "a.txt"],
        ["diff", "--unified=3", "a.txt", "b.txt"],
        ["diff", "-U", "3", "a.txt", "b.txt"],
        ["ls", "--color=never", "src"],
        ["date", "-Iseconds"],
        ["ln", "-sr", "src/a.txt", "out/link"],
    ):
        assert check(argv, read_grants=["**"], write_grants=["**"]).allowed, argv


def test_a_symbolic_link_target_is_checked_from_the_links_folder():
    # From the cwd "../../x" stays inside (a/b/../../x is x), from the link's folder it leaves.
    assert not check(["ln", "-s", "../../x", "../../link"], cwd="a/b").allowed


def test_git_needs_read_on_the_whole_project_because_it_prints_any_file():
    narrow = check(["git", "status"], read_grants=["src/**"])
    assert not narrow.allowed and 'path="**"' in narrow.hint
    denied = check(["git", "status"], deny_fs=["secrets/**"])
    assert not denied.allowed and "secrets/**" in denied.reason


def test_grantable_options_need_the_grant_that_names_them():
    assert not check(["find", "out", "-delete"]).allowed
    assert check(["find", "out", "-delete"], options_granted={"find": ["-delete"]}).allowed
    assert not check(["find", "out", "-delete"], options_granted={"tar": ["-delete"]}).allowed
    assert not check(
        ["find", "out", "-delete"], options_granted={"find": ["-delete"]}, write_grants=[]
    ).allowed


def test_the_permission_set_uses_the_shell_policy():
    grants = PermissionSet.from_entries(
        [
            PermissionEntry(tag="execute", attrs={"resource": "shell", "commands": "git,ls,rm"}),
            PermissionEntry(tag="read", attrs={"resource": "filesystem", "path": "**"}),
            PermissionEntry(tag="write", attrs={"resource": "filesystem", "path": "out/**"}),
        ]
    )
    assert grants.check("shell.run", {"command": "ls src"}).allowed
    assert not grants.check("shell.run", {"command": "ls /etc"}).allowed
    assert not grants.check("shell.run", {"argv": ["ls", "src"], "cwd": "/tmp"}).allowed
    assert not grants.check("shell.run", {"command": "git -c alias.x=!id x"}).allowed
    blocked = grants.check("shell.run", {"command": "rm -fr out"}, blocked_commands=["rm -rf"])
    assert not blocked.allowed and "blocked by the harness policy ('rm -rf')" in blocked.reason
    assert not grants.check("shell.run", {"command": "ls; id"}).allowed


def test_blocked_patterns_match_argv_not_text():
    for argv in (
        ["rm", "-fr", "x"],
        ["rm", "-r", "-f", "x"],
        ["rm", "--recursive", "--force", "x"],
        ["rm", "-Rf", "x"],
        ["rm", "-f", "x", "-r"],
        ["rm", "--rec", "--forc", "x"],
        ["rm", "-rfv", "x"],
    ):
        assert blocked_by("rm -rf", argv), argv
    assert not blocked_by("rm -rf", ["rm", "-r", "x"]) and not blocked_by("rm -rf", ["rm", "--", "-rf"])
    assert blocked_by("git push --force", ["git", "push", "-f", "origin"])
    assert not blocked_by("git push --force", ["git", "status", "-f"])
    assert blocked_by("sudo", ["sudo", "ls"])


# ------------------------------------------------------------------------------------------- properties

PATHS = st.sampled_from(
    [
        "src/a.py",
        "src",
        "out/x",
        "./src/a.py",
        "../x",
        "/etc/passwd",
        "~/x",
        "src/../../x",
        "a/../src/a.py",
        ".git/config",
        ".ai/logs/x",
        ".",
        "..",
        "notes/n.md",
        "out/../src/b",
        "x=/etc/passwd",
        "~root",
    ]
)
OPTIONS = st.sampled_from(["-r", "-f", "-l", "-a", "-v", "--force", "--", "-n"])
PROGRAMS = st.sampled_from(
    ["cat", "ls", "rm", "touch", "mkdir", "wc", "tee", "cp", "mv", "frob", "stat", "du"]
)
GLOBS = st.lists(
    st.sampled_from(["**", "src/**", "out/**", "notes/*", ".", "src/*.py", ".git/**"]), max_size=3
)
WRITERS = {"rm", "touch", "mkdir", "tee", "mv"}


@settings(max_examples=400, deadline=None)
@given(
    program=PROGRAMS,
    words=st.lists(st.one_of(PATHS, OPTIONS), max_size=6),
    read=GLOBS,
    write=GLOBS,
    deny=st.lists(st.sampled_from(["src/a.py", "notes/**", "out/x"]), max_size=1),
    cwd=st.sampled_from([".", "src", "out"]),
)
def test_an_allowed_command_names_only_granted_paths_inside_the_project(
    program, words, read, write, deny, cwd
):
    argv = [program, *words]
    decision = check_argv(
        argv, allowed=["*", "frob"], read_grants=read + write, write_grants=write, deny_fs=deny, cwd=cwd
    )
    if not decision.allowed:
        return
    # The cwd: never denied; read-granted where the program reads it (ls and du given no path, and frob,
    # which Kiwi does not model). (`--` ends the options: the words after it are paths.)
    operands = [w for i, w in enumerate(words) if not w.startswith("-") or "--" in words[:i]]
    assert first_match(deny, cwd) is None, argv
    if program == "frob" or program in ("ls", "du") and not operands:
        assert granted(read + write, cwd) is not None, argv
    ended = False
    previous = ""
    for word in words:
        ended = ended or word == "--"
        read_only = program == "touch" and previous == "-r" and not ended  # touch -r FILE: a reference, read
        previous = word
        if word == "--" or (word.startswith("-") and not ended):
            continue
        value = word.partition("=")[2] if program == "frob" and "=" in word else word
        if program == "frob" and not ("/" in value or value in (".", "..") or value.startswith("~")):
            continue
        assert not value.startswith(("/", "~")), argv
        rel = posixpath.normpath(posixpath.join(cwd, value))
        assert rel != ".." and not rel.startswith("../"), argv
        grants = write if program in WRITERS and not read_only else read + write
        assert granted(grants, rel) is not None or (program == "cp" and granted(write, rel)), argv
        assert first_match(deny, rel) is None, argv


RM_FLAGS = st.lists(
    st.sampled_from(
        [
            "-r",
            "-R",
            "-f",
            "--recursive",
            "--force",
            "-rf",
            "-fr",
            "-Rf",
            "-fR",
            "-v",
            "-i",
            "-d",
            "--verbose",
            "-rv",
            "-fv",
            "--rec",
            "--for",
        ]
    ),
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(flags=RM_FLAGS, target=st.sampled_from(["x", "out/x", "."]), shuffle=st.randoms(use_true_random=False))
def test_every_spelling_of_rm_with_r_and_f_is_blocked_by_rm_rf(flags, target, shuffle):
    argv = ["rm", *flags, target]
    shuffle.shuffle(argv[1:])
    letters = "".join(
        f.lstrip("-")
        if not f.startswith("--")
        else {"--recursive": "r", "--force": "f", "--rec": "r", "--for": "f"}.get(f, "")
        for f in flags
    )
    has_r = "r" in letters or "R" in letters
    decision = check(["rm", *flags, target])
    if has_r and "f" in letters:
        assert not decision.allowed and "blocked by the harness policy" in decision.reason


@settings(max_examples=300, deadline=None)
@given(
    program=st.sampled_from(sorted({*REFUSED_PROGRAMS, *LATER_REFUSED})),
    version=st.sampled_from(["", "3", "3.11", "-5.2", "18"]),
    words=st.lists(st.sampled_from(["-c", "x", "src/a", "--", "-e", "id", "."]), max_size=4),
)
def test_no_argv_makes_a_refused_program_allowed(program, version, words):
    decision = check([program + version, *words])
    assert not decision.allowed
    if not (version and any(c.isdigit() for c in program)):  # (aria2c3: not read as a versioned name)
        assert "is refused" in decision.reason or "blocked by the harness" in decision.reason


BENIGN_GIT = st.lists(
    st.sampled_from(["HEAD", "src/a.py", "-q", "--stat", "main", "HEAD~1", "--cached"]), max_size=4
)


@settings(max_examples=400, deadline=None)
@given(
    sub=st.sampled_from(sorted(GIT_SUBCOMMANDS)),
    before=BENIGN_GIT,
    after=BENIGN_GIT,
    bad=st.sampled_from(sorted(GIT_REFUSED_OPTIONS)),
    value=st.sampled_from(["", "=x", "=touch PWNED"]),
    tail=st.lists(st.sampled_from(["src/a.py", "src"]), max_size=2),
)
def test_git_with_a_refused_option_anywhere_before_the_double_dash_is_refused(
    sub, before, after, bad, value, tail
):
    option = bad + (value if bad.startswith("--") else "")
    argv = ["git", sub, *before, option, *after, "--", *tail]
    decision = check(argv)
    assert not decision.allowed and bad in decision.reason, (argv, decision)


@settings(max_examples=100, deadline=None)
@given(
    option=st.sampled_from(
        [
            "-c",
            "-C",
            "--git-dir=x",
            "--work-tree=x",
            "--exec-path=x",
            "-p",
            "--paginate",
            "--namespace=x",
            "--config-env=a=b",
        ]
    ),
    sub=st.sampled_from(sorted(GIT_SUBCOMMANDS)),
)
def test_git_options_that_repoint_or_reconfigure_git_are_refused_before_the_subcommand(option, sub):
    assert not check(["git", option, "core.pager=x", sub]).allowed


def test_path_arguments_give_the_worker_what_to_recheck():
    paths = path_arguments(["cp", "src/a", "out/b"], cwd="src")
    assert [(p.rel, p.mode) for p in paths] == [
        ("src", "read"),
        ("src/src/a", "read"),
        ("src/out/b", "write"),
    ]


# ------------------------------------------------------------------------------------ the environment


def test_children_get_an_allow_listed_environment_and_git_hardening(monkeypatch):
    monkeypatch.setenv("KIWI_TEST_SECRET", "s3cret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.setenv("GIT_DIR", "/tmp/elsewhere")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    env = child_env({"GIT_CONFIG_COUNT": "0", "MINE": "1"})
    assert "KIWI_TEST_SECRET" not in env and "OPENAI_API_KEY" not in env and "GIT_DIR" not in env
    assert env["MINE"] == "1" and env["LC_ALL"] == "C.UTF-8"
    # (The worker's PATH, each entry as the folder it leads to, none relative or of a Kiwi project.)
    assert env["PATH"].split(os.pathsep) == list(
        dict.fromkeys(os.path.realpath(e) for e in os.environ["PATH"].split(os.pathsep) if os.path.isabs(e))
    )
    assert env["GIT_CONFIG_NOSYSTEM"] == "1" and env["GIT_CONFIG_GLOBAL"] == "/dev/null"
    assert int(env["GIT_CONFIG_COUNT"]) == len(GIT_FORCED_CONFIG)


def test_each_forced_git_setting_wins_over_the_repositorys_own_config(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for key, _ in GIT_FORCED_CONFIG:
        subprocess.run(["git", "config", "--local", key, "touch PWNED"], cwd=tmp_path, check=True)
    for key, value in GIT_FORCED_CONFIG:
        shown = subprocess.run(
            ["git", "config", "--get", key], cwd=tmp_path, env=child_env(), capture_output=True, text=True
        )
        assert shown.stdout.rstrip("\n") == value, key
    status = subprocess.run(["git", "status"], cwd=tmp_path, env=child_env(), capture_output=True, text=True)
    assert status.returncode == 0 and not (tmp_path / "PWNED").exists()


INTO = "/worker/own/folder"


@pytest.mark.parametrize(
    ("argv", "cwd", "expected", "target", "keep"),
    [
        (["tar", "-xzf", "a.tgz"], ".", ["tar", "-C", INTO, "-xzf", "a.tgz"], ".", False),
        (["tar", "xzf", "a.tgz"], ".", ["tar", "-C", INTO, "-x", "-z", "-f", "a.tgz"], ".", False),
        (["tar", "-xf", "a.tar", "-C", "out"], ".", ["tar", "-C", INTO, "-xf", "a.tar", "-C", INTO], "out", False),
        (["tar", "-x", "--directory=out", "-f", "a.tar"], ".", ["tar", "-C", INTO, "-x", f"--directory={INTO}", "-f", "a.tar"],
         "out", False),
        (["tar", "-xCout", "-f", "a.tar"], ".", ["tar", "-C", INTO, "-xC", INTO, "-f", "a.tar"], "out", False),
        (["tar", "xfC", "a.tar", "out"], ".", ["tar", "-C", INTO, "-x", "-f", "a.tar", "-C", INTO], "out", False),
        (["tar", "-x", "-f", "a.tar", "*", "-C", "out", "ok.txt"], ".", ["tar", "-C", INTO, "-x", "-f", "a.tar", "*", "-C", INTO, "ok.txt"], "out", False),
        (["tar", "-xf", "a.tar", "-C", "../out", "member"], "sub", ["tar", "-C", INTO, "-xf", "a.tar", "-C", INTO, "member"],
         "out", False),
        (["tar", "-xkf", "a.tar"], "sub", ["tar", "-C", INTO, "-xkf", "a.tar"], "sub", True),
        (["unzip", "a.zip"], ".", ["unzip", "-d", INTO, "a.zip"], ".", True),
        (["unzip", "-o", "a.zip", "-d", "out"], ".", ["unzip", "-d", INTO, "-o", "a.zip"], "out", False),
        (["unzip", "-qd", "out", "a.zip"], ".", ["unzip", "-d", INTO, "-q", "a.zip"], "out", True),
        (["unzip", "a.zip", "-dout"], ".", ["unzip", "-d", INTO, "a.zip"], "out", True),
        (["unzip", "-n", "a.zip", "-x", "skip.txt"], ".", ["unzip", "-d", INTO, "-n", "a.zip", "-x", "skip.txt"],
         ".", True),
    ],
)  # fmt: skip
def test_an_unpacking_is_sent_into_the_workers_own_folder(argv, cwd, expected, target, keep):
    from kiwi.shellpolicy import Unpacking, unpacking

    plan = unpacking(argv, cwd)
    assert isinstance(plan, Unpacking), plan
    assert plan.argv(INTO) == expected
    assert (plan.target, plan.keep) == (target, keep)


@pytest.mark.parametrize(
    "argv",
    [["tar", "-tf", "a.tar"], ["tar", "-xOf", "a.tar"], ["tar", "-cf", "a.tar", "src"], ["tar", "tf", "a.tar"],
     ["unzip", "-l", "a.zip"], ["unzip", "-p", "a.zip", "x"], ["cat", "a.tar"]],
)  # fmt: skip
def test_what_unpacks_nothing_into_the_project_runs_as_it_is(argv):
    from kiwi.shellpolicy import unpacking

    assert unpacking(argv) is None


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["tar", "-x", "-C", "a", "-C", "b", "-f", "x.tar"], "2 times"),
        (["unzip", "a.zip", "-d", "a", "-d", "b"], "2 times"),
        # (Long options by their whole names only: GNU tar's abbreviations are refused.)
        (["tar", "-x", "--dir", "out", "-f", "a.tar"], "not a form Kiwi reads"),
        (["tar", "-x", "--skip-old", "-f", "a.tar"], "not a form Kiwi reads"),
    ],
)
def test_an_unpacking_kiwi_cannot_send_elsewhere_is_refused_with_the_fix(argv, named):
    from kiwi.shellpolicy import ShellVerdict, unpacking

    verdict = unpacking(argv)
    assert isinstance(verdict, ShellVerdict) and not verdict.allowed
    assert named in verdict.reason and verdict.hint, verdict


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # (Fourth review s23: -9 was an operand, so zip's archive was checked as a source; a file named in
        # letters after --create was taken for old-style options and not checked at all.)
        (["zip", "-9", "out.zip", "a.txt"], [("out.zip", "write"), ("a.txt", "read")]),
        (["tar", "--create", "-f", "out.tar", "secrets"], [("out.tar", "write"), ("secrets", "read")]),
        (["tar", "-czf", "-", "src"], [("src", "read")]),
        # (unzip opens NAME.zip and NAME.ZIP when NAME is missing, a dotted NAME too: fifth review s23.)
        (
            ["unzip", "-p", "creds.env"],
            [("creds.env", "read"), ("creds.env.zip", "read"), ("creds.env.ZIP", "read")],
        ),
    ],
)
def test_archive_programs_name_what_they_read_and_write(argv, expected):
    from kiwi.shellpolicy import path_arguments

    found = path_arguments(argv)
    assert not hasattr(found, "reason"), found
    assert [(p.rel, p.mode) for p in found if p.rel != "."] == expected


def test_every_long_tar_option_the_grammar_takes_a_value_for_is_one_the_parser_reads_a_value_for():
    """Fourth review s23: --after-date was a value option to the grammar and a flag to the parser, so the
    parser read its value `--` as the end of options, and tar read what followed as options. The two lists
    must agree."""
    from kiwi.shellpolicy import SPECS
    from kiwi.shellpolicy.archives import _TAR_LONG_FLAGS, _TAR_LONG_VALUES

    assert _TAR_LONG_VALUES.issubset(SPECS["tar"].values)
    assert not _TAR_LONG_FLAGS & set(SPECS["tar"].values)


CLOSED = sorted(name for name, spec in SPECS.items() if spec.known)


@pytest.mark.parametrize("program", CLOSED)
def test_every_option_of_a_program_is_one_kiwi_has_read(program):
    """Session 25: an option a program's spec did not name passed as a flag (`diff -l` ran pr). Each option a
    closed spec names is read as an option of the program; any other, and an abbreviation of several, is
    refused with what to do instead."""
    spec = SPECS[program]
    named = {*spec.known, *spec.values, *spec.later_values, *spec.aliases, *spec.flags}
    for option in sorted(named - {*spec.forbidden, *spec.later_forbidden, *spec.granted}):
        kind = {**spec.values, **spec.later_values}.get(option, "")
        argv = [program, f"{option}=x" if kind == "optional" else option]
        if kind and kind != "optional":
            argv.append("x")
        verdict = check(argv + ["--", "a.txt"], read_grants=["**"], write_grants=["**"])
        assert "that Kiwi knows" not in verdict.reason and "abbreviates" not in verdict.reason, (
            argv,
            verdict,
        )
    unknown = check([program, "--no-such-option", "a.txt"])
    assert not unknown.allowed and f"is not an option of {program} that Kiwi knows" in unknown.reason
    assert f"`{program} --help`" in unknown.hint
    longs = sorted(o for o in (*named, *spec.forbidden, *spec.later_forbidden) if o.startswith("--"))
    shared = [o[:3] for o in longs if sum(k.startswith(o[:3]) for k in longs) > 1 and o[:3] not in longs]
    if shared and program not in ("rg", "chmod"):  # (rg takes no abbreviation; `chmod --r` is a mode)
        ambiguous = check([program, shared[0], "a.txt"])
        assert not ambiguous.allowed, ambiguous
        assert f"abbreviates several of {program}'s options" in ambiguous.reason or "is refused: it" in (
            ambiguous.reason  # (one of them refused always: `file --c` may be --compile)
        )


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["diff", "-l", "a.txt", "b.txt"], "runs the program pr"),
        (["diff", "-yl", "a.txt", "b.txt"], "runs the program pr"),
        (["diff", "--pagin", "a.txt", "b.txt"], "runs the program pr"),
        (["ls", "--hyperlink-format=x", "."], "is not an option of ls that Kiwi knows"),
        (["cat", "-nj", "a.txt"], "option '-j' (in '-nj') is not an option of cat"),
        (["sort", "--comp", "x", "a.txt"], "runs the program it names"),
        (["rg", "--no-such", "KEY"], "is not an option of rg that Kiwi knows"),
    ],
)
def test_an_option_kiwi_has_not_read_is_refused(argv, named):
    verdict = check(argv)
    assert not verdict.allowed and named in verdict.reason, verdict


def test_options_that_are_text_or_negations_stay_allowed():
    for argv in (
        ["rg", "--no-hidden", "--no-pre", "KEY", "."],
        ["echo", "--anything", "-x"],
        ["printf", "%s", "--x"],
        ["head", "-5", "a.txt"],
        ["ls", "--colo=auto", "-1", "."],
        ["grep", "--recur", "KEY", "."],
        ["nl", "-ba", "-w", "3", "a.txt"],
        ["tree", "--sort", "name", "-L", "2", "."],
    ):
        assert check(argv).allowed, argv


@pytest.mark.parametrize(
    ("argv", "cwd", "named"),
    [
        # Review s25: each wrote, deleted or replaced what the run may not write (proven on the real programs).
        (["git", "--icase-pathspecs", "rm", "-r", "-q", "--", "out"], ".", "makes every path a pattern"),
        (["git", "--glob-pathspecs", "rm", "-q", "--", "out/*"], ".", "makes every path a pattern"),
        (["git", "init"], "out", "protected place 'out/.git'"),
        (["git", "reflog", "expire", "--expire=now", "--all"], ".", "rewrites the repository's records"),
        (["git", "reflog", "delete", "HEAD@{1}"], ".", "rewrites the repository's records"),
        (["rmdir", "-p", "gen/sub/x"], ".", "write not allowed on 'gen'"),
        (["ln", "-s", "out/x"], ".", "write not allowed on 'x'"),
        (["ln", "-sf", "../out/b.txt"], "src", "write not allowed on 'src/b.txt'"),
        (["uniq", "--", "-5", "../src/a.txt"], "out", "write not allowed on 'src/a.txt'"),
        (["uniq", "+99999999999999999999999", "../src/a.txt"], "out", "write not allowed on 'src/a.txt'"),
        # (Reads: each swallowed the path it then read, a protected one here.)
        (["git", "show", "--pretty", "HEAD~1:.ai/config/x.yaml"], ".", "protected place '.ai/config'"),
        (["git", "blame", "-n", ".ai/config/x.yaml"], ".", "protected place '.ai/config'"),
        (["git", "blame", "temporal-dev.yml"], ".", "protected place 'temporal-dev.yml'"),
    ],
)
def test_what_a_command_writes_is_read_as_the_program_writes_it(argv, cwd, named):
    verdict = check(argv, read_grants=["**"], write_grants=["out/**", "gen/sub/**"], cwd=cwd)
    assert not verdict.allowed and named in verdict.reason, verdict


def test_what_such_commands_may_still_do():
    grants = {"read_grants": ["**"], "write_grants": ["out/**", "gen/sub/**"]}
    for argv, cwd in (
        (["rmdir", "gen/sub/x"], "."),
        (["git", "reflog"], "."),
        (["uniq", "-5", "in.txt", "o.txt"], "out"),
        (["ln", "-s", "../src/a.txt"], "out"),
        (["cp", "--parents", "src/a.txt", "out"], "."),
        (["git", "log", "-n", "3"], "."),
        (["git", "show", "--pretty=oneline", "HEAD"], "."),
        (["git", "blame", "HEAD", "--", "src/a.py"], "."),
    ):
        assert check(argv, cwd=cwd, **grants).allowed, argv


def test_sixth_review_s25_readings():
    """egrep/rgrep/dir (read as programs Kiwi does not know) keep the folder rule whatever options they get;
    uniq's +N is ASCII digits only (uniq takes `+٣` for a file); git's -S[KEYID] and a long option's value
    name no merge strategy; reflog drop rewrites the reflog as expire and delete do."""
    deny = {"read_grants": ["**"], "deny_fs": ["secrets/**"]}
    for argv in (
        ["egrep", "-r", "--foo", "KEY", "."],
        ["egrep", "-r", "-u", "KEY", "."],
        ["dir", "-R", "--x", "."],
    ):
        verdict = check(argv, allowed=(argv[0],), **deny)
        assert not verdict.allowed and "which holds paths this run denies" in verdict.reason, (argv, verdict)
    assert check(["egrep", "-r", "KEY", "src"], allowed=("egrep",), **deny).allowed
    uniq = check(["uniq", "+\u0663", "a.txt", "out/x"], read_grants=["**"], write_grants=["out/**"])
    assert not uniq.allowed and "write not allowed on 'a.txt'" in uniq.reason, uniq
    for argv in (["git", "merge", "-Sjsmith", "x"], ["git", "merge", "--message", "-sfoo", "x"]):
        assert "strategy" not in check(argv).reason, argv
    assert "rewrites the repository's records" in check(["git", "reflog", "drop"]).reason
