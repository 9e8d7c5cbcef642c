"""The paths an argv names: resolved lexically against the cwd, checked against the run's grants,
and which operand of each program is read or written."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from kiwi.globs import first_match, glob_covered
from kiwi.protected import (
    DEV_CONFIG,
    DIRECTIVES,
    GIT_DIR,
    PROPOSALS,
    PROTECTED_ROOTS,
    protected_root,
    rule_in_force,
)
from kiwi.protected import granted as protected_granted
from kiwi.shellpolicy.options import _Parsed
from kiwi.shellpolicy.results import PathArgument, ShellVerdict, _no
from kiwi.shellpolicy.rules import SHELL_REVIEW_S28, TREE_GRANTED
from kiwi.shellpolicy.specs import SPECS, Spec


def lexical_path(cwd: str, raw: str) -> str | ShellVerdict:
    """``raw`` resolved against ``cwd`` (both project-relative), or why it cannot be used."""
    if "\x00" in raw:
        return _no("an argument contains a NUL byte")
    text = raw.replace("\\", "/")
    if text.startswith("~"):
        return _no(
            f"'{raw}' names a home folder; paths must stay inside the project",
            "give the path relative to the project root",
        )
    if text.startswith("/") or re.match(r"^[A-Za-z]:/", text):
        return _no(
            f"'{raw}' is an absolute path; paths must be relative to the project root",
            "give the path relative to the project root, e.g. 'src/app.py'",
        )
    rel = posixpath.normpath(posixpath.join(cwd, text))
    if rel == ".." or rel.startswith("../"):
        return _no(f"'{raw}' leaves the project root", "give a path inside the project")
    return rel


def _path_like(arg: str) -> bool:
    return "/" in arg or "\\" in arg or arg in (".", "..") or arg.startswith("~")


@dataclass(frozen=True)
class _Grants:
    read: tuple[str, ...]
    write: tuple[str, ...]
    deny: tuple[str, ...]


def _check_path(p: PathArgument, g: _Grants) -> ShellVerdict | None:
    patterns = g.read if p.mode == "read" else g.write
    denied = first_match(list(g.deny), p.rel)
    if denied is not None:
        return _no(f"'{p.raw}' ({p.rel}) is explicitly denied by '{denied}'")
    match = protected_granted(list(patterns), p.rel)
    if match is None:
        root = protected_root(p.rel)
        if root is not None and first_match(list(patterns), p.rel) is not None:
            return _no(
                f"'{p.raw}' is in the protected place '{root}', which only a grant naming it reaches",
                f'add <{p.mode} resource="filesystem" path="{root}/**"/> to <permissions> if the '
                "directive really must touch it (a human signs that directive)",
                patterns,
            )
        parent = posixpath.dirname(p.rel) or "."
        suggestion = f"{parent}/**" if parent != "." else p.rel
        return _no(
            f"{p.mode} not allowed on '{p.rel}' (argument '{p.raw}')",
            f'add <{p.mode} resource="filesystem" path="{suggestion}"/> to <permissions>',
            patterns,
        )
    if p.tree and p.mode == "write" and (root := protected_inside(p.rel, patterns)) is not None:
        return _no(
            f"'{p.raw}' contains the protected place '{root}', which only a grant naming it reaches",
            f"name a folder that does not contain '{root}'",
            patterns,
        )
    if p.tree and not tree_granted(p.rel, patterns) and rule_in_force(TREE_GRANTED):
        below = "the project" if p.rel == "." else f"'{p.rel}/'"
        return _no(
            f"'{p.raw}' is a folder the command {p.mode}s whole, and no {p.mode} grant covers everything below "
            f"it ('{match}' names the folder alone)",
            f'add <{p.mode} resource="filesystem" path="{"**" if p.rel == "." else p.rel + "/**"}"/> to '
            f"<permissions> if the directive may {p.mode} all of {below}, or name the files",
            patterns,
        )
    return None


def tree_granted(rel: str, patterns: Sequence[str]) -> bool:
    """Whether one of ``patterns`` covers everything below the folder ``rel``."""
    below = "**/*" if rel in ("", ".") else f"{rel}/**/*"
    return any(glob_covered(below, pattern) for pattern in patterns)


def protected_inside(rel: str, patterns: Sequence[str]) -> str | None:
    """The protected place at the project's root that the folder ``rel`` is or holds and no grant of
    ``patterns`` names (a whole-tree write there would write it), or None."""
    for root in (GIT_DIR, *PROTECTED_ROOTS, DIRECTIVES, DEV_CONFIG, PROPOSALS):
        if rel == "." or root.startswith(rel + "/"):
            inside = root if root == DEV_CONFIG else posixpath.join(root, "x") if rel == "." else root + "/x"
            if protected_granted(list(patterns), inside) is None:
                return root
    return None


def _operands(
    name: str,
    spec: Spec,
    parsed: _Parsed,
    cwd: str,
    archives: bool = True,
    options: bool = True,
    known: bool = False,
) -> list[tuple[str, str, bool]] | ShellVerdict:
    """(raw path, mode, whole tree) for each path a known program's operands and option values name.
    ``archives``: by the rules of ARCHIVE_OPTIONS; ``options``: by those of SHELL_OPTIONS (False: as runs
    from before them replay); ``known``: by those of KNOWN_OPTIONS."""
    found: list[tuple[str, str, bool]] = []
    recursive = "-r" in parsed.options
    if not recursive and name == "cp" and _reads_folders("cp", parsed) and rule_in_force(SHELL_REVIEW_S28):
        # cp -a copies folders whole as -r does (`cp -a stage/. .` made `.ai/config` and `.kiwi`, not made yet
        # so not held by the kernel, where only -r was read as recursion: review s28).
        recursive = True
    for option, kind, value in parsed.values:
        if kind in ("read", "write"):
            # cp -r and mv put whole folders into -t's folder, as into a last operand (`cp -r -t . stage/.`).
            whole = (
                kind == "write"
                and option in ("-t", "--target-directory")
                and (name == "mv" or name == "cp" and recursive)
                and rule_in_force(SHELL_REVIEW_S28)
            )
            found.append((value, kind, whole))
        elif kind == "unknown" and _path_like(value):
            found.append((value, "read", False))
    ops = parsed.operands
    how = spec.operands
    if options:
        if name == "uniq":
            # uniq's obsolete -N and +N (skip fields, skip characters) are options, not its input or output;
            # since KNOWN_OPTIONS only before `--`, and +N only while N fits its counter (`uniq -- -5 OUT`
            # and `uniq +99999999999999999999 IN OUT` wrote OUT unchecked).
            cut = len(ops) if parsed.plain is None or not known else parsed.plain
            ops = [
                o
                for index, o in enumerate(ops)
                if not (
                    index < cut
                    and re.fullmatch(r"[+-][0-9]+" if known else r"[+-]\d+", o)
                    and (not known or o.startswith("-") or int(o[1:]) < 2**64)
                )
            ]
        if name == "date" and any(not o.startswith("+") for o in ops):
            return _no(
                "date with an operand other than +FORMAT sets the system clock",
                "print the date with date or date +FORMAT",
            )
        if name == "file" and any(":" in v for o, _, v in parsed.values if o in ("-m", "--magic-file")):
            return _no(
                "file -m reads every magic file of a ':' list, which Kiwi does not check one by one",
                "give file -m one magic file",
            )
    if how == "link" and known and len(ops) == 1 and not any(k == "write" for _, k, _ in parsed.values):
        # `ln [-s] TARGET` makes ./NAME in the cwd, NAME being TARGET's last part (`ln -sf ../out/f` in
        # src replaced src/f, and only the target was checked): since KNOWN_OPTIONS.
        ops = [ops[0], posixpath.basename(ops[0].rstrip("/")) or ops[0]]
    if how in ("copy", "link") or name == "mv":
        found += _into_folder(parsed, ops, parents=known and "--parents" in parsed.options)
    if how == "none":
        return found
    if how == "read":
        return found + [(o, "read", False) for o in ops]
    if how == "write" and name == "rmdir" and known and {"-p", "--parents"} & set(parsed.options):
        # rmdir -p A/B/C removes A/B and A too (`rmdir -p gen/sub/x` removed gen): since KNOWN_OPTIONS.
        ops = [a for o in ops for a in _and_parents(o)]
    if how == "write":
        return found + [(o, "write", recursive or name == "mv") for o in ops]
    if how == "copy":
        target = any(k == "write" for _, k, _ in parsed.values)
        sources = ops if target else ops[:-1]
        dest = [] if target else ops[-1:]
        # cp -l (and -a's kin that link) makes hard links: the copy is the source under another name.
        linking = options and bool({"-l", "--link"} & set(parsed.options))
        source_mode = "write" if linking else "read"
        return (
            found
            + [(o, source_mode, recursive and linking) for o in sources]
            + [(o, "write", recursive) for o in dest]
        )
    if how == "link":
        target = any(k == "write" for _, k, _ in parsed.values)
        sources, link = (ops, None) if target else (ops[:-1], ops[-1] if ops else None)
        linked = [(link, "write", False)] if link is not None else []
        if options and "-s" not in parsed.options:
            # A hard link is the source under another name: writing it writes the source.
            return found + linked + [(o, "write", False) for o in sources]
        if options and {"-r", "--relative"} & set(parsed.options):
            # ln -sr makes the link's text from a target named from the cwd (`ln -sr ../x a/b/L`).
            return found + linked + [(o, "read", False) for o in sources]
        if options and "-s" in parsed.options and target:
            # With -t DIR, a symbolic link's text is read from DIR, where the link is.
            folders = [v for _, k, v in parsed.values if k == "write"]
            return found + [
                (o if o.startswith(("/", "~")) else posixpath.join(folder, o), "read", False)
                for folder in folders[-1:]
                for o in sources
            ]
        if link is not None:
            found.append((link, "write", False))
            if "-s" in parsed.options:
                base = posixpath.dirname(link.replace("\\", "/"))
                # A symbolic link's target is relative to the link's folder, not to the cwd.
                return found + [
                    (s if s.startswith(("/", "~")) or not base else posixpath.join(base, s), "read", False)
                    for s in sources
                ]
        return found + [(o, "read", False) for o in sources]
    if how == "mode":
        reference = any(o == "--reference" for o in parsed.options)
        return found + [(o, "write", recursive) for o in (ops if reference else ops[1:])]
    if how == "in-out":
        return found + [(o, "read", False) for o in ops[:1]] + [(o, "write", False) for o in ops[1:2]]
    if how == "pattern":
        return found + [(o, "read", False) for o in _pattern_paths(parsed, ops)]
    if how == "tar":
        return _tar(parsed, found, cwd, archives)
    if how == "zip":
        if ("-r" in parsed.options or "-R" in parsed.options) and "-y" not in parsed.options:
            return _no(
                "zip -r follows symbolic links out of the project",
                "add -y (store links as links), e.g. zip -r -y out.zip src",
            )
        if archives:
            # -0 to -9 are compression levels to zip, not operands (_parse keeps -N as a number for head -5).
            ops = [o for o in ops if not re.fullmatch(r"-\d", o)]
        sources = "write" if archives and "-m" in parsed.options else "read"  # (-m deletes them)
        whole = sources == "write" and "-r" in parsed.options  # (-r -m deletes folders whole)
        if archives:
            # zip writes NAME.zip for an archive named without an extension.
            found += [(o + ".zip", "write", False) for o in ops[:1] if "." not in posixpath.basename(o)]
        return found + [(o, "write", False) for o in ops[:1]] + [(o, sources, whole) for o in ops[1:]]
    if how == "unzip":
        into = [v for _, k, v in parsed.values if k == "extract"] or ["."]
        listing = any(o in ("-l", "-t", "-p", "-c", "-v", "-z") for o in parsed.options)
        found += [(o, "read", False) for o in ops[:1]]
        if archives:
            # unzip opens NAME, else NAME.zip, else NAME.ZIP (a dotted NAME too: fifth review s23).
            found += [(o + x, "read", False) for o in ops[:1] for x in (".zip", ".ZIP")]
        return found if listing else found + [(into[-1], "write", True)]
    return found + [(o, "read", False) for o in ops]


def _and_parents(path: str) -> list[str]:
    """``path`` and each folder above it that it names (a/b/c: a/b/c, a/b, a)."""
    out = []
    while path.strip("/") not in ("", ".", ".."):
        out.append(path)
        path = posixpath.dirname(path.rstrip("/"))
    return out


def _into_folder(parsed: _Parsed, ops: Sequence[str], parents: bool = False) -> list[tuple[str, str, bool]]:
    """``cp``/``mv``/``ln`` into a folder write FOLDER/NAME for each source: each is a probe (``into``) that
    counts only where it is a protected place (``cp src/temporal-dev.yml .`` wrote the root's, the folder
    ``.`` being all that was checked). Whether the destination is a folder is not known here: a probe past
    a file's name is a path no grant names, and is dropped unless protected."""
    targets = [v for _, k, v in parsed.values if k == "write"]
    sources = list(ops) if targets else list(ops[:-1])
    folders = targets or list(ops[-1:])
    probes = [
        # (`cp --parents a/b/f DIR` writes DIR/a/b/f: since KNOWN_OPTIONS.)
        (
            posixpath.join(folder, source if parents else posixpath.basename(source.rstrip("/")) or source),
            "into",
            False,
        )
        for folder in folders
        for source in sources
        if source
    ]
    # A backup of what is replaced is written as NAME + suffix (-b, --backup; -S/--suffix, default "~"):
    # `cp -b -S l x temporal-dev.ym` wrote temporal-dev.yml.
    suffixes = [v for o, _, v in parsed.values if o in ("-S", "--suffix")]
    if suffixes or any(o in ("-b", "--backup") or o.startswith("--backup") for o in parsed.options):
        names = [*folders, *(p for p, _, _ in probes)]
        probes += [
            (name.rstrip("/") + suffix, "into", False) for name in names for suffix in suffixes or ["~"]
        ]
    return probes


def _tar(
    parsed: _Parsed, found: list[tuple[str, str, bool]], cwd: str, archives: bool = True
) -> list[tuple[str, str, bool]] | ShellVerdict:
    opts = set(parsed.options)
    ops = list(parsed.operands)
    # Old-style "tar cf out.tar src": the first operand is a cluster of letters. (Since ARCHIVE_OPTIONS,
    # _tar_old_style has read it already: a file named in letters after --create is a file.)
    if (
        not archives
        and ops
        and not (opts & {"-c", "-x", "-t", "-r", "-u", "-A", "-d"})
        and re.fullmatch(r"[A-Za-z]+", ops[0])
    ):
        letters = ops.pop(0)
        opts |= {f"-{c}" for c in letters}
        if "f" in letters and ops:
            parsed.values.append(("-f", "archive", ops.pop(0)))
    creating = bool(
        opts
        & {
            "-c",
            "--create",
            "-r",
            "--append",
            "-u",
            "--update",
            "-A",
            "--concatenate",
            "--catenate",
            "--delete",
        }
    )
    extracting = bool(opts & {"-x", "--extract", "--get"}) and not (opts & {"-O", "--to-stdout"})
    where = cwd
    for _, kind, value in parsed.values:
        if kind == "archive" and value != "-":
            found.append((value, "write" if creating else "read", False))
        if kind == "cwd":
            found.append((value, "read", False))
            where = value
    if extracting:
        found.append((where if where != cwd else ".", "write", True))
    if not archives:
        return found + [(o, "read", False) for o in ops]
    listing_names = extracting or bool(opts & {"-x", "--extract", "--get", "-t", "--list"})
    if not listing_names and any(
        kind == "read" and o in ("-T", "--files-from") for o, kind, _ in parsed.values
    ):
        return _no(
            "tar -T names the files to put in the archive in a list, whose names Kiwi does not check",
            "name the files on the command line (tar -c -f out.tar src docs)",
        )
    # Names read from disk (not members of an archive) are relative to the -C before them: checked against
    # each folder -C names, and each chain of them (-C a -C b is a/b), as well as the command's own.
    folders = [value for _, kind, value in parsed.values if kind == "cwd"]
    chains = {posixpath.join(*folders[: k + 1]) for k in range(len(folders))} | set(folders)
    mode = "write" if "--remove-files" in opts else "read"  # (it deletes them, folders whole)
    tree = mode == "write" and "--no-recursion" not in opts
    names = [] if listing_names else [posixpath.join(d, o) for d in sorted(chains) for o in ops]
    return (
        found
        + [(o, "read" if listing_names else mode, tree and not listing_names) for o in ops]
        + [(n, mode, tree) for n in names]
    )


# Programs that read every file below a folder they are given (or below the cwd, given no path), with the
# options that make them do it (None: always). A folder below which the run denies a path is then refused, as
# git is (git_reads_everything): `grep -r KEY .` read secrets/ under `<deny path="secrets/**"/>`. diff reads
# the files directly inside a folder it is given (`diff out/key.txt secrets` compared secrets/key.txt).
_READS_FOLDERS: dict[str, frozenset[str] | None] = {
    "rg": None,
    "du": None,
    "tree": None,
    "find": None,
    "diff": None,
    "grep": frozenset({"-r", "--recursive", "--dereference-recursive"}),
    "cp": frozenset({"-r", "-a", "--archive", "--recursive"}),
    "ls": frozenset({"-R", "--recursive"}),
    "zip": frozenset({"-r", "-R", "--recurse-paths", "--recurse-patterns"}),
    "tar": frozenset({"-c", "--create", "-r", "--append", "-u", "--update"}),
}
# Long options that turn recursion on, as GNU getopt takes them: any unique start (`grep --recur`).
_RECURSING_LONG = {
    "grep": ("--recursive", "--dereference-recursive"),
    "ls": ("--recursive",),
    "cp": ("--recursive", "--archive"),
    "zip": ("--recurse-paths", "--recurse-patterns"),
}


def _reads_folders(name: str, parsed: _Parsed) -> bool:
    options = _READS_FOLDERS[name]
    if options is None:
        return True
    if name == "tar" and "--no-recursion" in parsed.options:
        return False
    if options & set(parsed.options):
        return True
    if any(
        o.startswith("--") and len(o) > 3 and any(t.startswith(o) for t in _RECURSING_LONG.get(name, ()))
        for o in parsed.options
    ):
        return True
    # grep -d ACTION takes any unique start of read, recurse, skip (`-d rec`).
    return any(
        o in ("-d", "--directories") and len(v) >= 3 and "recurse".startswith(v) for o, _, v in parsed.values
    )


def _path_operands(name: str, parsed: _Parsed) -> list[str]:
    """The operands that name paths (grep's and rg's first is the pattern unless -e or -f gives it)."""
    if SPECS[name].operands == "pattern":
        return _pattern_paths(parsed, parsed.operands)
    return list(parsed.operands)


def _pattern_paths(parsed: _Parsed, ops: Sequence[str]) -> list[str]:
    """A grep-like program's operands that name paths: all but the first, the pattern, unless an option gives
    the pattern (-e, -f) or there is none (rg --files, --type-list)."""
    patterned = any(o in ("-e", "--regexp", "-f", "--file") for o in parsed.options) or (
        "--files" in parsed.options or "--type-list" in parsed.options
    )
    return list(ops if patterned else ops[1:])
