"""The check of one argv (``check_argv``), the paths it names (``path_arguments``) and harness
``blocked_commands``."""

from __future__ import annotations

import dataclasses
import posixpath
import shlex
from collections.abc import Iterable, Mapping, Sequence

from kiwi.globs import first_match, glob_reaches_below
from kiwi.protected import (
    DEV_CONFIG,
    DIRECTIVES,
    GIT_DIR,
    PROPOSALS,
    PROTECTED_ROOTS,
    protected_root,
    rule_in_force,
    rules_assumed,
)
from kiwi.shellpolicy.archives import _archive_shape, _tar_old_style
from kiwi.shellpolicy.find import _find
from kiwi.shellpolicy.folders import (
    _SAME_AS,
    _cwd_unread,
    _find_starts,
    denied_inside,
    folder_uses,
    names_from_a_list,
    ungranted_below,
)
from kiwi.shellpolicy.git import _git, git_reads_everything
from kiwi.shellpolicy.options import _chmod_mode_first, _options_for, _parse, _tree_cluster, down_and_up
from kiwi.shellpolicy.paths import _check_path, _Grants, _operands, _path_like, lexical_path, tree_granted
from kiwi.shellpolicy.programs import (
    known_program,
    later_refused,
    modeled_program,
    program_name,
    refused_program,
)
from kiwi.shellpolicy.results import _LOCAL_HINT, PathArgument, ShellVerdict, _no, xml_attr
from kiwi.shellpolicy.rules import (
    ARCHIVE_OPTIONS,
    CWD_UNREAD,
    CWD_WHOLE,
    DENY_INSIDE,
    EXACT_NAMES,
    FIND_STARTS,
    GIT_OBJECT_PATHS,
    KNOWN_OPTIONS,
    LIST_FILES,
    SHELL_KNOWN_ONLY,
    SHELL_OPTIONS,
    SHELL_PATHS_WHOLE,
    TREE_GRANTED,
)
from kiwi.shellpolicy.specs import SPECS, Spec

_SHORT_ALIASES: dict[str, dict[str, str]] = {
    "*": {
        "--recursive": "-r",
        "-R": "-r",
        "--force": "-f",
        "--verbose": "-v",
        "--interactive": "-i",
        "--dir": "-d",
        "--no-preserve-root": "--no-preserve-root",
    },
    "git": {"--force": "-f", "--force-with-lease": "-f", "--delete": "-d", "--all": "--all", "-D": "-D"},
}


def _normal_options(program: str, words: Sequence[str]) -> tuple[set[str], list[str]]:
    aliases = {**_SHORT_ALIASES["*"], **_SHORT_ALIASES.get(program, {})}
    spec = SPECS.get(program)
    if spec:
        aliases.update(spec.aliases)
    opts: set[str] = set()
    operands: list[str] = []
    for index, word in enumerate(words):
        if word == "--":
            operands.extend(words[index + 1 :])
            break
        if word.startswith("--"):
            name = word.partition("=")[0]
            longs = [k for k in aliases if k.startswith("--")]
            full = [k for k in longs if k.startswith(name) and len(name) > 2]
            name = name if name in aliases or len(full) != 1 else full[0]
            opts.add(aliases.get(name, name))
        elif word.startswith("-") and len(word) > 1:
            for c in word[1:]:
                opt = f"-{c}"
                opts.add(aliases.get(opt, opt))
        else:
            operands.append(word)
    return opts, operands


def blocked_by(pattern: str, argv: Sequence[str]) -> bool:
    """Whether ``argv`` is what the blocked ``pattern`` means, however its options are spelled."""
    try:
        words = shlex.split(pattern)
    except ValueError:
        words = pattern.split()
    if not words or not argv:
        return False
    if program_name(words[0]) != program_name(argv[0]):
        return False
    program = program_name(argv[0])
    want_opts, want_words = _normal_options(program, words[1:])
    have_opts, have_words = _normal_options(program, argv[1:])
    return want_opts <= have_opts and all(w in have_words or w in argv[1:] for w in want_words)


def path_arguments(
    argv: Sequence[str],
    *,
    cwd: str = ".",
    options_granted: Mapping[str, Iterable[str]] | Iterable[str] | None = None,
    probes: bool = False,
) -> list[PathArgument] | ShellVerdict:
    """The paths ``argv`` names (project-relative), or why its program or options are refused.

    Used by ``check_argv`` and by the worker, which re-checks them on disk with symlinks resolved; with
    ``probes`` (the worker) each FOLDER/NAME that cp, mv or ln write into a folder is a path too.
    """
    if probes and not _in_workflow():
        return _path_arguments(argv, cwd, options_granted, archives=True, probes=True)
    return _read(argv, cwd, options_granted)[0]


def _in_workflow() -> bool:
    from temporalio import workflow

    return workflow.in_workflow()


def _read(
    argv: Sequence[str], cwd: str, options_granted: Mapping[str, Iterable[str]] | Iterable[str] | None
) -> tuple[list[PathArgument] | ShellVerdict, bool]:
    """path_arguments, and whether it read the options by KNOWN_OPTIONS (folder_uses reads them alike)."""
    if not argv or not _in_workflow():
        # (Outside a run, the worker's check, the rules apply always.)
        return _path_arguments(argv, cwd, options_granted, archives=True), True
    # In a run, each later rule is asked only where it changes the answer, newest first.
    name = program_name(argv[0])
    known = True
    if name in SPECS:
        # The reading by KNOWN_OPTIONS is made first with every rule taken as in force, asking none (a run
        # keeps the first answer to each patch: asked where the code before never asked, a replay could
        # answer False and keep it for a later command), then compared with the reading before it, made as
        # the code before made it; only where they differ is KNOWN_OPTIONS asked, and the reading made again
        # asking what it asks.
        with rules_assumed():
            tentative = _path_arguments(argv, cwd, options_granted, archives=True)
        found = _path_arguments(argv, cwd, options_granted, archives=True, known=False)
        if tentative != found:
            if rule_in_force(KNOWN_OPTIONS):
                found = _path_arguments(argv, cwd, options_granted, archives=True)
            else:
                known = False
    else:
        found = _path_arguments(argv, cwd, options_granted, archives=True)
    if name in _OPTIONS_REWRITTEN or any("\\" in a for a in (*argv[1:], cwd or "")):
        before = _path_arguments(argv, cwd, options_granted, archives=True, options=False, known=known)
        if before != found and not rule_in_force(SHELL_OPTIONS):
            return before, known
    if name in _SPECS_BEFORE_ARCHIVES:
        before = _path_arguments(argv, cwd, options_granted, archives=False, known=known)
        if before != found and not rule_in_force(ARCHIVE_OPTIONS):
            return before, known
    return found, known


def _path_arguments(
    argv: Sequence[str],
    cwd: str,
    options_granted: Mapping[str, Iterable[str]] | Iterable[str] | None,
    *,
    archives: bool,
    options: bool = True,
    known: bool = True,
    probes: bool = False,
) -> list[PathArgument] | ShellVerdict:
    if not argv:
        return _no("empty command")
    why = refused_program(argv[0])
    if why:
        given = posixpath.basename(argv[0])
        return _no(
            f"'{given}' is refused: it {why}, so a grant for it would grant every program", _LOCAL_HINT
        )
    if options and "\\" in (cwd or ""):
        return _BACKSLASH
    base = lexical_path(".", cwd or ".")
    if isinstance(base, ShellVerdict):
        return _no(f"cwd {base.reason}", base.hint)
    name = program_name(argv[0])
    args = list(argv[1:])
    spec = SPECS.get(name) if archives else _SPECS_BEFORE_ARCHIVES.get(name, SPECS.get(name))
    if not options and name in _OPTIONS_REWRITTEN:
        spec = _OPTIONS_REWRITTEN[name]
    allow = _options_for(name, options_granted)
    raw: list[tuple[str, str, bool]] | ShellVerdict
    if name == "tar" and archives:
        # `tar xIf PROG a.tar`: the letters were read as flags, and I, F, h, P went unchecked (PROG ran).
        args = _tar_old_style(args)
    if name == "tar" and known and options and any(a.startswith("--exclude-vcs-ignores") for a in args):
        return _no(
            "tar's option '--exclude-vcs-ignores' is refused: it reads a .gitignore file in every folder, "
            "through links Kiwi does not check",
            "name what to leave out with --exclude",
        )
    if options and name == "tree" and (cluster := _tree_cluster(args)):
        return _no(
            f"tree's '{cluster}' gives each option in it the next word, in order, which Kiwi does not read so",
            "give tree's options one word each (tree -L 2 -o out/t.txt)",
        )
    if options and name == "chmod":
        args = _chmod_mode_first(args)
    if name == "git":
        raw = _git(args, options, known and options)
    elif name == "find":
        raw = _find(args, allow, options)
    elif spec is not None:
        # (rg's parser takes no abbreviation, and `-f=FILE` is FILE: since SHELL_OPTIONS.)
        clap = options and name == "rg"
        parsed = _parse(
            args,
            spec,
            allow,
            abbreviations=not clap,
            equals_sign=clap,
            program=name if known and options else "",
        )
        if not isinstance(parsed, ShellVerdict) and archives and name in _SPECS_BEFORE_ARCHIVES:
            # (After the parse: an option refused by name says why; any other form not read as the program
            # reads it is refused here.)
            parsed = _archive_shape(name, argv[1:]) or parsed
        raw = (
            parsed
            if isinstance(parsed, ShellVerdict)
            else _operands(name, spec, parsed, base, archives, options, known and options)
        )
    else:
        raw = _unknown(args)
    if isinstance(raw, ShellVerdict):
        return raw
    if options and any("\\" in text for text, _, _ in raw):
        return _BACKSLASH
    # (The words as given: a link's target joined to its folder, `out/../src/a.py`, is Kiwi's own reading.)
    if (
        options
        and (back := next((a for a in args if down_and_up(a) or down_and_up(a.partition("=")[2])), None))
        is not None
    ):
        return _no(
            f"'{back}' goes down into a folder and back up with '..': on disk '..' leaves where a link in it "
            "leads, and `mkdir -p` makes the folders it passes",
            "name the path without going down and back up (a/../b is b)",
        )
    out = [PathArgument(".", base, "read")]
    stricter: list[bool] = []  # (asked once, and only where the stricter rules change the answer)

    def strict() -> bool:
        if not stricter:
            stricter.append(rule_in_force(SHELL_PATHS_WHOLE))
        return stricter[0]

    for text, mode, tree in raw:
        if mode == "root*":
            out.append(PathArgument(text, ".", "write", strict(), in_repository=True))
            continue
        if mode.endswith("@root"):
            rel = lexical_path(".", text)
            if isinstance(rel, ShellVerdict):
                return rel
            out.append(PathArgument(text, rel, mode.removesuffix("@root"), False, in_repository=True))
            continue
        if mode == "object":
            if not rule_in_force(GIT_OBJECT_PATHS):
                continue
            mode = "read"
            if not text.startswith(("./", "../")):
                rel = lexical_path(".", text)  # (REV:PATH is from the repository's root)
                if isinstance(rel, ShellVerdict):
                    return rel
                out.append(PathArgument(text, rel, mode, False, in_repository=True))
                continue
        if mode == "index":
            return _no(
                "git commit with no path commits whatever the index holds, what a human staged included",
                "name the paths it commits, each checked as a write: git commit -m MSG -- PATH... (or the "
                "git.commit tool)",
            )
        if mode == "magic":
            if strict():
                return _no(
                    f"'{text}': git reads it as a pattern (pathspec magic, a glob or a file of paths), and "
                    "paths git rewrites are checked as names",
                    "name each path as it is, after --",
                )
            mode = "write"
        rel = lexical_path(base, text)
        if isinstance(rel, ShellVerdict):
            if mode == "into":
                continue  # (a probe past the destination: the destination itself is checked)
            return rel
        if mode == "into":
            # (The worker checks each on disk: `cp f out` wrote through out/f, a link moved there whose
            # text led out of the project, and over a denied config/f with `cp f config`.)
            if not probes and (protected_root(rel) is None or not strict()):
                continue
            out.append(PathArgument(text, rel, "write", tree, probe=probes))
            continue
        elif mode == "write*":
            tree = _contains_protected(rel) and strict()
            out.append(PathArgument(text, rel, "write", tree, pathspec=probes))
            continue
        out.append(PathArgument(text, rel, mode, tree))
    return out


def _before(spec: Spec, values: Iterable[str] = (), forbidden: Iterable[str] = (), aliases: Iterable[str] = (),
            flags: Iterable[str] = ()) -> Spec:  # fmt: skip
    """``spec`` without what ARCHIVE_OPTIONS added to it."""
    return dataclasses.replace(
        spec,
        values={k: v for k, v in spec.values.items() if k not in set(values)},
        forbidden={k: v for k, v in spec.forbidden.items() if k not in set(forbidden)},
        aliases={k: v for k, v in spec.aliases.items() if k not in set(aliases)},
        flags=spec.flags - set(flags),
    )


_SPECS_BEFORE_ARCHIVES = {
    "tar": _before(
        SPECS["tar"],
        values=("--add-file", "--owner-map", "--group-map", "--sort", "--after-date", "--newer-mtime"),
        forbidden=(
            "--index-file",
            "--volno-file",
            "-g",
            "--listed-incremental",
            "--one-top-level",
            "--no-verbatim-files-from",
            "--no-force-local",
            "--no-null",
        ),
        flags=("--checkpoint", "--remove-files", "--overwrite", "--no-overwrite-dir"),
    ),  # fmt: skip
    "zip": _before(
        SPECS["zip"],
        forbidden=("-T", "--test"),
        aliases=("--recurse-paths", "--recurse-patterns", "--symlinks", "--move"),
    ),
    "unzip": _before(SPECS["unzip"], forbidden=("-:", "-^")),
}
_BACKSLASH = _no(
    "a path with '\\' is refused: on this system it is part of a name, not a folder separator",
    "separate folders with '/'",
)


def _optional_as_before(
    spec: Spec, forbidden: Iterable[str] = (), values: Iterable[str] = (), flags: Iterable[str] = ()
) -> Spec:
    """``spec`` as it was before SHELL_OPTIONS: optional values read as required ones, without the options it
    added (``values``, ``flags``) and refusals (``forbidden``)."""
    older = _before(spec, values=values, forbidden=forbidden, flags=flags)
    return dataclasses.replace(
        older, values={k: "value" if v == "optional" else v for k, v in older.values.items()}
    )


_OPTIONS_REWRITTEN = {
    "ls": _optional_as_before(SPECS["ls"]),
    "grep": _optional_as_before(SPECS["grep"], flags=("--binary",)),
    "diff": _optional_as_before(SPECS["diff"], values=("-D", "--ifdef")),
    "uniq": _optional_as_before(SPECS["uniq"]),
    "mkdir": _optional_as_before(SPECS["mkdir"]),
    "date": _optional_as_before(SPECS["date"]),
    "du": _optional_as_before(SPECS["du"], values=("--time",)),
    "rg": _optional_as_before(SPECS["rg"], forbidden=("--hostname-bin",)),
    "file": _optional_as_before(
        SPECS["file"], forbidden=("-C", "--compile", "-z", "--uncompress", "-Z", "--uncompress-noreport")
    ),
    "tree": _optional_as_before(
        SPECS["tree"], values=("-H", "-T", "--hintro", "--houtro", "--gitfile", "--infofile")
    ),
    # (Read by rules of their own since SHELL_OPTIONS: see _path_arguments, _operands, _find, _git.)
    "ln": SPECS["ln"],
    "cp": _optional_as_before(SPECS["cp"], flags=("--link",)),
    "chmod": SPECS["chmod"],
    "find": SPECS["find"],
    "git": SPECS["git"],
}


def _contains_protected(rel: str) -> bool:
    """Whether the folder ``rel`` is, or holds, a protected place (as a whole-tree write checks it)."""
    if protected_root(rel) is not None:
        return True
    return any(
        rel == "." or root.startswith(rel + "/")
        for root in (GIT_DIR, *PROTECTED_ROOTS, DIRECTIVES, DEV_CONFIG, PROPOSALS)
    )


def _unknown(args: Sequence[str]) -> list[tuple[str, str, bool]]:
    """A program Kiwi does not know: anything that looks like a path is checked as a read."""
    found = []
    for arg in args:
        if arg.startswith("-") and len(arg) > 1:
            value = arg.partition("=")[2] if "=" in arg else (arg[2:] if not arg.startswith("--") else "")
        else:
            value = arg.partition("=")[2] if "=" in arg and not _path_like(arg.partition("=")[0]) else arg
        for candidate in {value, arg} if not arg.startswith("-") else {value}:
            if candidate and _path_like(candidate):
                found.append((candidate, "read", False))
    return found


def check_argv(
    argv: Sequence[str],
    *,
    allowed: Sequence[str],
    denied: Sequence[str] = (),
    blocked: Sequence[str] = (),
    read_grants: Sequence[str] = (),
    write_grants: Sequence[str] = (),
    deny_fs: Sequence[str] = (),
    cwd: str = ".",
    options_granted: Mapping[str, Iterable[str]] | Iterable[str] | None = None,
) -> ShellVerdict:
    """Decide one ``shell.run`` argv against the run's grants (see the module docstring)."""
    if not argv:
        return _no("empty command")
    program = posixpath.basename(argv[0])
    name = program_name(argv[0])
    for pattern in blocked:
        if blocked_by(pattern, argv):
            return _no(
                f"'{' '.join(argv)}' is blocked by the harness policy ('{pattern}')",
                "shell.blocked_commands in agent_harness.yaml refuses it in every run",
            )
    for entry in denied:
        if (
            entry == "*"
            or program_name(entry) == name
            and " " not in entry.strip()
            or (" " in entry.strip() and blocked_by(entry, argv))
        ):
            return _no(
                f"shell command '{program}' is explicitly denied" + (f" ('{entry}')" if entry != name else "")
            )
    named = any(a == program or a == argv[0] for a in allowed)
    if not named and "*" not in allowed:
        return _no(
            f"shell command '{program}' is not in the allowlist",
            f'add <execute resource="shell" commands="{xml_attr(program)}"/> to <permissions>',
            allowed,
        )
    why = later_refused(argv[0])
    if why and rule_in_force(SHELL_KNOWN_ONLY):
        return _no(f"'{program}' is refused: it {why}", _LOCAL_HINT)
    if (
        not named
        and not known_program(argv[0])
        and not refused_program(argv[0])
        and rule_in_force(SHELL_KNOWN_ONLY)
    ):
        return _no(
            f"'{program}' is not a program Kiwi knows, and commands=\"*\" covers only the programs whose "
            "options and written files Kiwi checks",
            f'name it in <execute resource="shell" commands="{xml_attr(program)}"/> if the directive really needs it '
            "(a human signs that directive; Kiwi then checks only the paths its arguments name, as reads), "
            "or " + _LOCAL_HINT,
            allowed,
        )
    if not named and known_program(argv[0]) and not modeled_program(argv[0]) and rule_in_force(EXACT_NAMES):
        return _no(
            f"'{program}' is not the name of a program Kiwi models ('{name}' is): another name, in another case "
            'or form, may be another program (Debian\'s HEAD is an HTTP client), and commands="*" covers a '
            "program by its exact name only",
            f"run it as '{name}', or name '{program}' in <execute resource=\"shell\" commands=...> if the "
            "directive really needs it (a human signs that directive)",
            allowed,
        )
    g = _Grants(tuple(read_grants), tuple(write_grants), tuple(deny_fs))
    if name == "git":
        problem = git_reads_everything(g)
        if problem:
            return problem
    paths, known = _read(argv, cwd or ".", options_granted)
    if isinstance(paths, ShellVerdict):
        return paths
    for p in paths:
        problem = _check_path(p, g)
        if (
            problem is None
            and p is paths[0]
            and not modeled_program(argv[0])
            and not tree_granted(p.rel, list(g.read))
            and rule_in_force(CWD_WHOLE)
        ):
            # A program Kiwi does not model reads any file of its cwd by a bare name or one it builds (`jq .
            # secret.json`, jq's `import`), which no check of its words sees, and the kernel's rule for a folder
            # is the whole folder: its cwd must be one the run reads whole (README trial s38: under `read .`, the
            # hint's grant, jq printed a root secret), and no denial may reach below it (see below).
            whole = "**" if p.rel == "." else f"{p.rel}/**"
            return _no(
                f"'{program}' is a program Kiwi does not model, which reads any file of its cwd '{p.rel}' by a bare "
                "name, and this run may not read everything there",
                'run it with the cwd set to a folder the run reads whole (cwd "data" under <read resource='
                f'"filesystem" path="data/**"/>), or add <read resource="filesystem" path="{whole}"/> to '
                "<permissions> if it may read all of it",
                g.read,
            )
        if problem:
            if p is paths[0]:
                if _cwd_unread(argv, p, g, options_granted, known) and rule_in_force(CWD_UNREAD):
                    continue
                # (A program Kiwi does not model needs its cwd read whole: README trial s39 was told to add `read .`,
                # then, with it, `read **`.)
                whole = first_match(list(g.deny), p.rel) is None and (
                    not modeled_program(argv[0])
                    or any(
                        u is p and depth is None
                        for u, _, depth in folder_uses(argv, paths, options_granted, known)
                    )
                )
                grant = f'<read resource="filesystem" path="{"**" if p.rel == "." else p.rel + "/**"}"/>'
                return _no(
                    f"the command's cwd '{p.rel}' may not be read by this run",
                    problem.hint
                    if not whole
                    else f"add {grant} to <permissions>, or give the program the paths it reads"
                    if modeled_program(argv[0])
                    else f"'{program}' is a program Kiwi does not model, which reads any file of its cwd: run it "
                    f"with the cwd set to a folder the run reads whole, or add {grant} to <permissions>",
                    problem.checked_against,
                )
            return problem
    problem = names_from_a_list(argv)
    if problem is not None and rule_in_force(LIST_FILES):
        return problem
    problem = denied_inside(argv, paths, g.deny, options_granted, known=known)
    if known and _in_workflow() and SPECS.get(_SAME_AS.get(name, name), Spec()).known:
        # (The folders read by the same options as the paths: an abbreviation can name another option.)
        older = denied_inside(argv, paths, g.deny, options_granted, known=False)
        if older != problem and not rule_in_force(KNOWN_OPTIONS):
            problem = older
    if problem is None and program_name(argv[0]) == "find" and _in_workflow() and _find_starts(argv[1:]):
        older = denied_inside(argv, paths, g.deny, options_granted, known=known, find_cwd=True)
        if older is not None and rule_in_force(DENY_INSIDE) and not rule_in_force(FIND_STARTS):
            return older
    if problem is not None and rule_in_force(DENY_INSIDE):
        return problem
    if (
        not modeled_program(argv[0])
        and name not in _SAME_AS  # (egrep, rgrep, dir: read as the program they run, folders and all)
        and (reaching := next((d for d in g.deny if glob_reaches_below(d, paths[0].rel)), None))
        and rule_in_force(CWD_WHOLE)
    ):
        # (Review s38, fourth round: under `read data/**` with data/secret.json denied, jq run in data/ printed it
        # by its bare name, and a denied data/secrets/ through jq's `import`.)
        return _no(
            f"'{program}' is a program Kiwi does not model, which reads any file of its cwd '{paths[0].rel}' by "
            f"a bare name, and the run's denial '{reaching}' may name a file there",
            "run it in a folder no denial reaches, or use a local tool a human signs, which reads what its code "
            "says",
            g.deny,
        )
    problem = ungranted_below(argv, paths, g.read, options_granted, known=known)
    if problem is not None and rule_in_force(TREE_GRANTED):
        return problem
    return ShellVerdict(True, checked_against=tuple(allowed))
