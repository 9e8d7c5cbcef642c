"""tar, zip and unzip: the forms Kiwi reads, and unpacking staged by the worker."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kiwi.shellpolicy.options import _parse, _resolve_long
from kiwi.shellpolicy.paths import lexical_path
from kiwi.shellpolicy.programs import program_name
from kiwi.shellpolicy.results import ShellVerdict, _no
from kiwi.shellpolicy.specs import SPECS

# tar's letters that take a value: in the old style (``tar xfC A DIR``) each takes the next word, in order.
_TAR_LETTERS_WITH_VALUE = frozenset("bCfFgHIKLNTVX")
_TAR_KEEP = ("--keep-old-files", "--skip-old-files", "--keep-newer-files")
_UNZIP_LISTING = frozenset({"-l", "-t", "-p", "-c", "-v", "-z", "-Z"})


@dataclass(frozen=True)
class Unpacking:
    """A command that unpacks an archive into the project (``tar -x``, ``unzip``), to be run into a folder of
    the worker's own instead: an archive can hold a link (``sub/x -> /home/you``), and a second archive a file
    below it (``sub/x/.bashrc``), which the program writes through the link, out of the project. The worker
    copies what was unpacked into ``target`` (project-relative) itself, never following a link, each path
    checked against the run's grants, and links not at all (activities/staging.py). ``keep``: files already
    there are left as they are (tar -k and its kin; unzip unless -o)."""

    program: str
    args: tuple[str, ...]
    target: str
    keep: bool

    @property
    def folder_options(self) -> frozenset[str]:
        """The options that name the folder to unpack into."""
        return frozenset({"-C", "--directory"}) if self.program == "tar" else frozenset({"-d"})

    def argv(self, into: str) -> list[str]:
        """The command, unpacking into ``into`` (an absolute folder) and nowhere else."""
        spec = SPECS[self.program]
        out: list[str] = []
        args = list(self.args)
        i = 0
        while i < len(args):
            arg = args[i]
            i += 1
            if arg == "--":
                out += args[i - 1 :]
                break
            if arg.startswith("--"):
                raw, eq, _ = arg.partition("=")
                name = _resolve_long(raw, spec)
                if name in self.folder_options:
                    out += [f"{raw}={into}"] if eq else [raw, into]
                    i += 0 if eq else 1
                elif name in spec.values and not eq and i < len(args):
                    out += [arg, args[i]]
                    i += 1
                else:
                    out.append(arg)
                continue
            if arg.startswith("-") and len(arg) > 1 and arg not in spec.values:
                for index, char in enumerate(arg[1:], start=1):
                    option = f"-{char}"
                    if option not in spec.values:
                        continue
                    taken = index == len(arg) - 1  # (its value is the next word, not the rest of this one)
                    if option in self.folder_options:
                        if self.program == "tar":
                            out += [arg[: index + 1], into]
                        elif index > 1:
                            out.append(arg[:index])  # (unzip -qd DIR: -q kept, -d DIR dropped)
                    else:
                        out.append(arg)
                        if taken and i < len(args):
                            out.append(args[i])
                    i += 1 if taken else 0
                    break
                else:
                    out.append(arg)
                continue
            if arg in spec.values and arg in self.folder_options:
                # (tar: rewritten in place, as -C applies from where it stands; unzip: dropped, its folder is
                # the private one given first, and a second -d after the zipfile would be a member name.)
                out += [arg, into] if self.program == "tar" else []
                i += 1
                continue
            if arg in spec.values and i < len(args):
                out += [arg, args[i]]
                i += 1
                continue
            out.append(arg)
        if self.program == "tar":
            # First, whether or not a -C was replaced: tar's -C applies to the names after it, and members
            # named before a later -C went to the command's own folder, the project (second review s23 F1).
            return ["tar", "-C", into, *out]
        # unzip takes the first -d it meets, inside an -x list too (`-x -d ../elsewhere`): the private
        # folder's comes first (review s23, third).
        return ["unzip", "-d", into, *out]


# The forms of tar, zip and unzip Kiwi reads (since ARCHIVE_OPTIONS, after three reviews found options each
# program reads differently from Kiwi's parser: value letters taken as flags, `=` values, multi-letter zip
# options, unzip words after the zipfile). Anything else is refused, naming what is allowed.
_TAR_SHORT = frozenset("xctruzjJvkOpmCfTX")
_TAR_SHORT_VALUE = frozenset("fCTX")
_TAR_LONG_FLAGS = frozenset(
    [
        "--extract",
        "--get",
        "--create",
        "--list",
        "--gzip",
        "--gunzip",
        "--bzip2",
        "--xz",
        "--zstd",
        "--verbose",
        "--keep-old-files",
        "--skip-old-files",
        "--to-stdout",
        "--wildcards",
        "--no-wildcards",
        "--anchored",
        "--no-anchored",
        "--numeric-owner",
        "--no-same-owner",
        "--no-same-permissions",
        "--same-permissions",
        "--preserve-permissions",
        "--touch",
        "--totals",
        "--exclude-vcs",
        "--exclude-vcs-ignores",
        "--ignore-failed-read",
        "--no-recursion",
        "--recursion",
        "--checkpoint",
        "--remove-files",
        "--one-file-system",
        "--sparse",
        "--append",
        "--update",
        "--delete",
    ]
)
_TAR_LONG_VALUES = frozenset(
    [
        "--file",
        "--directory",
        "--files-from",
        "--exclude",
        "--exclude-from",
        "--transform",
        "--xform",
        "--strip-components",
        "--owner",
        "--group",
        "--mode",
        "--sort",
        "--format",
        "--mtime",
        "--newer",
        "--after-date",
        "--newer-mtime",
    ]
)
_UNZIP_SHORT = frozenset("onqjltvpuf")
# (Not -u or -f: they update the archive's entries from the files their names give, which an archive
# brought in can set anywhere, `../../x`, and with -m delete: fifth review s23.)
_ZIP_SHORT = frozenset("ryqvjmDX0123456789")
_ZIP_LONG = {"--recurse-paths", "--symlinks", "--quiet", "--junk-paths", "--move", "--exclude", "--include"}


def _archive_shape(name: str, args: Sequence[str]) -> ShellVerdict | None:
    """Why ``args`` are not a form of tar, zip or unzip Kiwi reads the way the program does (None: they are)."""

    def no(word: str, allowed: str) -> ShellVerdict:
        return _no(
            f"{name}: '{word}' is not a form Kiwi reads as {name} does, so it is refused",
            f"use {allowed}",
        )

    if name == "tar":
        if args and not args[0].startswith("-") and not set(args[0]) <= _TAR_SHORT:
            return no(
                args[0], "letters from " + "".join(sorted(_TAR_SHORT)) + " in tar's old style, or dashes"
            )
        # Checked in the form tar reads (old-style letters spread into options with their words), and no
        # option's value may look like an option: tar reads `--after-date --` as a date, Kiwi's parser read
        # the `--` as the end of options (review s23, fourth).
        words = _tar_old_style(args)
        skip = 0
        for index, word in enumerate(words):
            value = words[index + 1] if index + 1 < len(words) else ""
            if skip:
                skip -= 1
                continue
            if word == "--":
                return no(word, "names that do not start with '-' (./-name for one that does)")
            if word.startswith("--"):
                option, eq, given = word.partition("=")
                if option in _TAR_LONG_FLAGS and not eq:
                    continue
                if option in _TAR_LONG_VALUES:
                    taken = given if eq else value
                    if not eq and (not value or value.startswith("-")):
                        return no(f"{word} {value}".strip(), f"a value for {option} that is not an option")
                    if option in ("--mtime", "--newer", "--after-date", "--newer-mtime") and taken.startswith(
                        ("/", ".")
                    ):
                        return no(word, "a date for it (a file's time reads the file)")
                    skip = 0 if eq else 1
                    continue
                return no(
                    word, "tar's common options (--file, --directory, --exclude, --strip-components, ...)"
                )
            if word.startswith("-") and len(word) > 1:
                for position, letter in enumerate(word[1:], start=1):
                    if letter not in _TAR_SHORT:
                        return no(word, "-x, -c, -t, -r, -u with -z/-j/-J, -v, -f FILE, -C DIR, -k, -O")
                    if letter in _TAR_SHORT_VALUE:
                        if position == len(word) - 1:
                            if not value or (value.startswith("-") and value != "-"):  # (-f -: stdin, stdout)
                                return no(
                                    f"{word} {value}".strip(), f"a value for -{letter} that is not an option"
                                )
                            skip = 1
                        elif word[position + 1] == "-":
                            return no(word, f"a value for -{letter} that is not an option")
                        break
        return None
    if name == "unzip":
        zipfile = None
        skip = 0
        for word in args:
            if skip:
                skip -= 1
                continue
            if word.startswith("-d") or (word == "-P" and zipfile is None):
                skip = 1 if word in ("-d", "-P") else 0
                continue
            if (
                word.startswith("-")
                and len(word) > 2
                and word.endswith("d")
                and set(word[1:-1]) <= _UNZIP_SHORT
            ):
                skip = 1  # (-qd DIR)
                continue
            if word == "--":
                return no(word, "names that do not start with '-'")
            if zipfile is None:
                if word.startswith("-") and len(word) > 1:
                    if not set(word[1:]) <= _UNZIP_SHORT:
                        return no(
                            word,
                            "-o, -n, -q, -j, -l, -t, -v, -p, -u, -f before the zipfile, -x and -d after it",
                        )
                    continue
                if any(c in word for c in "*?["):
                    return no(word, "the zipfile's own name (unzip expands patterns in it)")
                zipfile = word
                continue
            if word.startswith("-") and word != "-x":
                return no(word, "member names after the zipfile, then -x NAMES and -d FOLDER")
        return None
    # zip
    in_list = False
    archive = False
    for word in args:
        if word == "--":
            return no(word, "names that do not start with '-'")
        if word.startswith("-") and len(word) > 1:
            in_list = False
            if word in ("-x", "-i", "--exclude", "--include"):
                if not archive:
                    # (zip's list runs to the next option: before the archive's name, it took the name.)
                    return no(word, "-x NAMES and -i NAMES after the archive's name and the files")
                in_list = True
                continue
            if word.startswith("--"):
                if word not in _ZIP_LONG:
                    return no(word, "zip's common options (-r -y, -q, -j, -m, -x NAMES, -i NAMES)")
                continue
            if "=" in word or not set(word[1:]) <= _ZIP_SHORT:
                return no(
                    word,
                    "-r -y, -q, -v, -j, -m, -D, -X, -0 to -9, -x NAMES, -i NAMES, each on its own",
                )
            continue
        if in_list and word.startswith("@"):
            return no(word, "the names themselves (a list in a file is not read by Kiwi)")
        archive = archive or not in_list
    return None


def _tar_old_style(args: Sequence[str]) -> list[str]:
    """tar's old-style first word (``tar xzf A``, ``tar xIf PROG A``) as the dashed options tar reads it as:
    each letter an option, and each letter that takes a value the next word, in order."""
    if not args or args[0].startswith("-") or not re.fullmatch(r"[A-Za-z]+", args[0]):
        return list(args)
    rest = list(args[1:])
    out: list[str] = []
    for letter in args[0]:
        out.append(f"-{letter}")
        if letter in _TAR_LETTERS_WITH_VALUE and rest:
            out.append(rest.pop(0))
    return out + rest


def unpacking(argv: Sequence[str], cwd: str = ".") -> Unpacking | ShellVerdict | None:
    """How ``argv`` unpacks an archive into the project (see :class:`Unpacking`), or None when it does not
    (any other program, ``tar -t``/``-c``/``-O``, ``unzip -l``/``-p``...). ``cwd``: project-relative."""
    if not argv:
        return None
    name = program_name(argv[0])
    if name not in ("tar", "unzip"):
        return None
    spec = SPECS[name]
    if (shape := _archive_shape(name, argv[1:])) is not None:
        return shape
    args = _tar_old_style(argv[1:]) if name == "tar" else list(argv[1:])
    parsed = _parse(args, spec, set())
    if isinstance(parsed, ShellVerdict):
        return parsed
    options = set(parsed.options)
    if name == "tar":
        if not options & {"-x", "--extract", "--get"} or options & {"-O", "--to-stdout"}:
            return None
        folders = [value for _, kind, value in parsed.values if kind == "cwd"]
        keep = "-k" in options or any(
            o.startswith("--") and any(k.startswith(o) for k in _TAR_KEEP) for o in options
        )
    else:
        if options & _UNZIP_LISTING:
            return None
        folders = [value for _, kind, value in parsed.values if kind == "extract"]
        # (Run without a terminal, unzip keeps what is there unless told -o: it asks, reads nothing, skips.)
        keep = "-o" not in options
    if len(folders) > 1:
        return _no(
            f"{name} is given the folder to unpack into {len(folders)} times",
            f"give it once ({'-C' if name == 'tar' else '-d'} FOLDER)",
        )
    target = lexical_path(cwd, folders[0]) if folders else lexical_path(".", cwd)
    if isinstance(target, ShellVerdict):
        return target
    return Unpacking(name, tuple(args), target, keep)
