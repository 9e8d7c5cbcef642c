"""What a shell grant allows: the program, its options and the paths its arguments name.

A grant ``<execute resource="shell" commands="git,ls"/>`` allows running those programs as
themselves, never as a way to run another program or to reach outside the run's filesystem
grants. ``check_argv`` decides one argv:

- programs that run other programs or code (shells, launchers, interpreters, editors, builders,
  remote shells) are refused even when granted, ``commands="*"`` included;
- options that make a known program run something (``git -c``, ``find -exec``, ``rg --pre``,
  ``tar --to-command``...) are refused; a few that delete or write files (``find -delete``) need
  the grant's ``options`` attribute;
- every path an argument names is resolved against ``cwd`` and checked against the run's read
  grants, or write grants for what a program writes; absolute paths, ``~`` and ``..`` out of the
  project are refused; protected places need a grant that names them;
- harness ``blocked_commands`` match the parsed argv (``rm -fr x`` is ``rm -rf``).

Pure (no I/O, deterministic), so workflow code can import it. The worker re-checks the paths
with symlinks resolved (``path_arguments`` says which arguments are paths).
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kiwi.globs import first_match, glob_covered, glob_reaches_below, glob_segments
from kiwi.protected import (
    AI_PLACES,
    DEV_CONFIG,
    DIRECTIVES,
    GIT_DIR,
    PROPOSALS,
    PROTECTED_ROOTS,
    ROOT_PLACES,
    fold,
    protected_root,
    rule_in_force,
    rules_assumed,
)
from kiwi.protected import granted as protected_granted

# ---------------------------------------------------------------- programs that run other programs

_SHELLS = "sh bash dash zsh ksh mksh fish csh tcsh ash busybox toybox"
_LAUNCHERS = (
    "env xargs nice nohup timeout watch setsid stdbuf time ionice taskset flock chroot sudo su doas "
    "strace ltrace script parallel expect kiwi temporal exec command builtin eval nsenter unshare "
    "systemd-run runuser pkexec at batch crontab gdb docker podman firejail bwrap capsh xdg-open "
    "git-shell"
)
_INTERPRETERS = (
    "python pypy perl ruby node nodejs deno bun php lua luajit awk gawk mawk nawk sed tclsh wish R "
    "Rscript julia java jshell groovy scala osascript"
)
_EDITORS = "vi vim nvim view ex emacs nano pico less more most man info ed"
_BUILDERS = (
    "make gmake cmake ninja npm npx pnpm yarn pip pipx uv uvx poetry cargo rustc go gcc cc clang mvn gradle"
)
_REMOTE = "ssh scp sftp rsync nc ncat netcat socat telnet ftp"
REFUSED_PROGRAMS: dict[str, str] = {  # lower-case names; program_name lower-cases too
    **{p: "is a shell" for p in _SHELLS.split()},
    **{p: "starts other programs" for p in _LAUNCHERS.split()},
    **{p.lower(): "runs code it is given" for p in _INTERPRETERS.split()},
    **{p: "is an editor or pager that can run commands" for p in _EDITORS.split()},
    **{p: "runs build or package scripts" for p in _BUILDERS.split()},
    **{p: "is a remote or network shell" for p in _REMOTE.split()},
}
# python3.11, pip3, perl5.36, lua5.4, node18, ruby-3.2: the same program under a versioned name.
_VERSION_SUFFIX = re.compile(r"^(?P<base>[A-Za-z][A-Za-z_+-]*?)[-_.]?\d[\w.-]*$")


def program_name(arg0: str) -> str:
    """The program's name as Kiwi matches it: the basename, lower-cased, version suffix dropped."""
    base = posixpath.basename(arg0.replace("\\", "/")) or arg0
    name = base.lower()
    if name.endswith(".exe"):
        name = name[:-4]
    if name not in REFUSED_PROGRAMS:
        found = _VERSION_SUFFIX.match(name)
        if found and found.group("base") in REFUSED_PROGRAMS:
            return found.group("base")
    return name


def refused_program(arg0: str) -> str:
    """Why Kiwi never runs ``arg0`` (it would run other programs), or ''."""
    return REFUSED_PROGRAMS.get(program_name(arg0), "")


# Programs that run another program, or code, they are given, refused since session 19: in workflow code
# behind SHELL_KNOWN_ONLY (a run that ran one before replays as it ran); the worker refuses them always.
_LATER_LAUNCHERS = (
    "prlimit chrt setpriv valgrind tmux screen dtach unbuffer faketime fakeroot proot xvfb-run "
    "dbus-run-session sg newgrp numactl cpulimit catchsegv ssh-agent flatpak snap systemd-nspawn ip "
    "chpst daemonize start-stop-daemon lldb perf hyperfine entr watchexec openvt tini dumb-init gosu "
    "su-exec chronic ifne pee mispipe sem srun mpirun mpiexec sbatch qsub cgexec run-parts busctl "
    "machinectl kubectl ansible terraform"
)
_LATER_INTERPRETERS = (
    "dc m4 sqlite3 psql mysql gnuplot octave mail mailx nmap ssh-keygen openssl "
    "gpg gpg2 vipe rpm dpkg apt apt-get yum dnf zypper apk brew gem bundle composer pandoc fd fdfind "
    "ipython irb pwsh powershell nu xonsh tsx ts-node bunx conda mamba pixi hatch pdm pytest tox nox jest "
    "vitest mocha eslint prettier mypy pylint flake8 latex pdflatex xelatex lualatex tex "
    "pre-commit"
)
# Network clients: what they reach is no file a path grant covers, and the run's network grants (checked for
# api tools) do not see their URLs. The local Temporal server's HTTP API is one request away.
_LATER_NETWORK = "curl wget http https xh httpie aria2c lynx w3m links elinks tftp grpcurl websocat"
LATER_REFUSED: dict[str, str] = {
    **{
        p: "starts other programs, so a grant for it would grant every program"
        for p in _LATER_LAUNCHERS.split()
    },
    **{
        p: "reaches the network, which the run's network grants do not check for shell programs (an api "
        "tool's URLs are checked against them)"
        for p in _LATER_NETWORK.split()
    },
    **{
        p: "runs code or commands it is given (or loads a library it is named), so a grant for it would "
        "grant every program"
        for p in _LATER_INTERPRETERS.split()
    },
}


def later_refused(arg0: str) -> str:
    """Why Kiwi refuses ``arg0`` since session 19 (see _LATER_LAUNCHERS), or ''."""
    name = program_name(arg0)
    if name not in LATER_REFUSED:
        found = _VERSION_SUFFIX.match(name)
        name = found.group("base") if found else name
    return LATER_REFUSED.get(name, "")


# csplit writes files under names it makes from a prefix and a printf format, which no check of its words can
# follow (`csplit -f vendor/.gi -b 't/hooks/pre-commit%.0d'` wrote a nested repository's hook: review s28):
# the worker refuses it. split's names are PREFIX + letters or digits + its additional suffix: see _split_names.
NAMES_MADE = {
    "csplit": "writes files under names it makes from a prefix and a format, which Kiwi cannot check",
    "rename": "renames files by a pattern, to names Kiwi does not see",
    # (`patch -p0` with a diff on standard input made sub/.git and app/.ai/config: review s28.)
    **{
        p: "writes the files named inside what it reads (a diff, an archive), which Kiwi does not see"
        for p in [
            "patch",
            "ar",
            "cpio",
            "pax",
            "7z",
            "7za",
            "7zr",
            "unrar",
            "unar",
            "lha",
            "arj",
            "cabextract",
            "bsdtar",
            "bsdcpio",
            # (Session 30: names inside what they read, too.)
            "uudecode",
            "uudeview",
            "unsquashfs",
            "jar",
            "fastjar",
            "dpkg-deb",
            "munpack",
            "ripmime",
            "tnef",
            "zipnote",
            "gtar",
            "gnutar",
            "star",
            "dar",
            "xar",
            "afio",
            "ditto",
            "unzipsfx",
            "rpm2archive",
            "gpgtar",
        ]
    },
}
# Programs that start other programs (their helpers, a pager, an editor, a delegate, a program their input
# names), found by a hostile review in session 29 after `split --filter` (below): refused by the worker whatever
# the run decided (a run that granted one replays as it ran), and named by `kiwi validate`.
_STARTERS_S29 = (
    "groff nroff enscript a2ps bat batcat fzf convert magick mogrify gs ghostscript ack ld cpp meson javac "
    "nvi yq busybox toybox zless zmore zdiff zcmp zgrep zegrep zfgrep lesspipe tig lazygit mutt neomutt "
    "ranger mc nnn vifm micro hx helix kak joe jed mg vis ne sensible-editor sensible-pager editor pager "
    "systemctl service launchctl open prove pdb c++ g++ c99 c89 vimdiff gvim rvim rview rbash lesskey "
    "pydoc pygmentize cpan perldoc memusage sotruss setarch linux32 linux64 x86_64 i386 debconf "
    "pg_virtualenv sensible-browser vimtutor zipgrep xzless xzmore xzgrep xzegrep xzfgrep xzdiff xzcmp bzless "
    "bzmore bzgrep bzegrep bzfgrep bzdiff bzcmp zstdless zstdgrep lzless lzmore lzgrep lzegrep lzfgrep lzdiff "
    "lzcmp dpkg-architecture dpkg-buildpackage heaptrack mvndebug gdbtui corepack bashbug perlbug pg_buildext "
    "deb-systemd-invoke kernel-install gcore xdg-user-dir gzexe instmodsh docker-compose podman-compose node-gyp"
)
# Parts of a program's name that leave the program what it is: a target triplet's (x86_64-linux-gnu-gcc), a
# version (cpp-12, g++-12, python3.11, pdb3), a variant after a dot (vim.basic, ld.bfd, ld.gold).
_TRIPLET_PARTS = frozenset(
    [
        "linux",
        "gnu",
        "gnueabi",
        "gnueabihf",
        "gnux32",
        "musl",
        "mingw32",
        "w64",
        "pc",
        "apple",
        "darwin",
        "unknown",
        "elf",
        "none",
        "eabi",
        "eabihf",
    ]
)


def name_variants(name: str) -> list[str]:
    """``name`` and the names it is a variant of (see _TRIPLET_PARTS), for the worker's refusals (review s29:
    `cpp-12`, `x86_64-linux-gnu-gcc`, `vim.basic` and `ld.bfd` escaped the lists)."""
    found = [name]
    parts = name.split("-")
    marks = [i for i, part in enumerate(parts) if part in _TRIPLET_PARTS or part.startswith("darwin")]
    if marks and marks[-1] < len(parts) - 1:
        found.append("-".join(parts[marks[-1] + 1 :]))  # (x86_64-linux-gnu-gcc)
    if marks and marks[0] > 1:
        found.append("-".join(parts[: marks[0] - 1]))  # (cpan5.36-x86_64-linux-gnu)
    if len(parts) > 1 and not marks:
        found.append(parts[-1])  # (a wrapper named for what it wraps: c99-gcc)
    for each in list(found):
        if "." in each and each.split(".", 1)[1].isalnum():
            found.append(each.split(".", 1)[0])  # (vim.basic, vim.gtk3, ld.bfd)
    for each in list(found):
        bare = re.sub(r"[-_.]?\d[\d.]*$", "", each)
        if bare and bare != each:
            found.append(bare)
    return found


# Programs that change what Landlock has no rule for (a file's owner, group, attributes, ACL, label) wherever
# their user may: refused by the worker whatever the grant (review s30: `chattr +A` outside the grants).
ATTRIBUTE_CHANGERS = {
    p: "changes the owner, group or attributes of any file its user may, which no grant covers"
    # (install -d -m 777 . gave the project's root, and a denied folder, mode 777: review s30.)
    for p in [
        "chattr",
        "chown",
        "chgrp",
        "chcon",
        "setfacl",
        "setfattr",
        "attr",
        "setcap",
        "install",
        "chacl",
        "filecap",
        "restorecon",
        "setfiles",
        "chcat",
        "xattr",
    ]
}


def worker_refusal(arg0: str) -> str:
    """Why the worker refuses ``arg0`` whatever the run decided (any list, by any of name_variants), or ''."""
    for name in name_variants(program_name(arg0)):
        why = (
            REFUSED_PROGRAMS.get(name)
            or LATER_REFUSED.get(name)
            or STARTS_PROGRAMS.get(name)
            or ATTRIBUTE_CHANGERS.get(name)
        )
        if why:
            return why
    return ""


STARTS_PROGRAMS = {
    p: "starts other programs (its helpers, a pager or editor, a program it is told of), so a grant for it "
    "would grant every program"
    for p in (_STARTERS_S29 + " unshar atool aunpack dtrx").split()
}
# Options by which a program Kiwi does not model starts another (review s29: `split --filter='...'` ran a shell
# command, and `sdiff`/`diff3 --diff-program=P` ran P): by program, its long options (GNU getopt takes any
# unambiguous abbreviation, so every abbreviation is refused) and its short letters; and the short letters
# whose value is the rest of a cluster or the next word.
_STARTING_OPTIONS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "split": (("--filter",), "", "abClnt"),
    "sdiff": (("--diff-program",), "", "ow"),
    "diff3": (("--diff-program",), "", "L"),
    "install": (("--strip", "--strip-program"), "s", "gmotS"),
    "ag": (("--pager",), "", "ABCGgmpW"),
}


def starting_option(name: str, args: Sequence[str]) -> str:
    """The option of ``args`` by which the program ``name`` would start another (see _STARTING_OPTIONS), or
    ''."""
    longs, shorts, valued = _STARTING_OPTIONS.get(name, ((), "", ""))
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--":
            break
        if arg.startswith("--"):
            key = arg.partition("=")[0]
            if len(key) > 2 and any(option.startswith(key) for option in longs):
                return arg
        elif arg.startswith("-") and len(arg) > 1:
            for index, letter in enumerate(arg[1:], start=1):
                if letter in shorts:
                    return arg
                if letter in valued:
                    skip = index == len(arg) - 1  # (its value the next word, else the rest of this one)
                    break
    return ""


# Decompressors write NAME for NAME.gz (`gzip -d sub/.git.gz` made a nested .git file), or the name kept in
# the file with -N.
_DECOMPRESSORS = frozenset(
    [
        "gzip",
        "gunzip",
        "pigz",
        "unpigz",
        "xz",
        "unxz",
        "lzma",
        "unlzma",
        "bzip2",
        "bunzip2",
        "zstd",
        "unzstd",
        "lz4",
        "unlz4",
        "lzip",
        "brotli",
        "compress",
        "uncompress",
    ]
)
# The protected places' last segments (kiwi.protected), and those of .ai's below it.
_PROTECTED_NAMES = ROOT_PLACES
_PROTECTED_IN_AI = tuple(place.split("/")[1] for place in AI_PLACES)


def unchecked_names(argv: Sequence[str], cwd: str = ".", writes: Sequence[str] = ()) -> ShellVerdict | None:
    """The worker's refusal of a program that starts others (STARTS_PROGRAMS, or by an option of
    _STARTING_OPTIONS), and of a program Kiwi does not know (a grant names it) whose words name a protected
    place without looking like a path (`dd of=temporal-dev.yml`, `dd of=.git` run in sub/: review s28), of
    the programs of NAMES_MADE, and of split where its names could make one; None when none of these (or a
    write grant, ``writes``, names the place). Path-like words are checked as the run checked them."""
    name = program_name(argv[0])
    if why := worker_refusal(argv[0]):
        return _no(f"'{name}' is refused: it {why}", _LOCAL_HINT)
    if option := starting_option(name, argv[1:]):
        return _no(
            f"'{option}' is refused: with it {name} starts another program, so a grant for {name} would "
            "grant every program",
            f"run {name} without it",
        )
    if name in NAMES_MADE:
        return _no(f"'{name}' is refused: it {NAMES_MADE[name]}", "write each file by its name")
    if name in _DECOMPRESSORS and (made := _decompressed_names(name, argv[1:], cwd)):
        return _no(
            f"'{name}' is refused here: {made}",
            "decompress files whose names less their suffix are no protected place, with the options Kiwi reads",
        )
    if name == "split" and (made := _split_names(argv[1:], cwd)):
        return _no(
            f"'split' is refused here: its output names (a prefix, letters or digits, a suffix) could make the "
            f"protected place '{made}'",
            "give split a prefix and suffix that are no part of a protected place's name",
        )
    if modeled_program(argv[0]):
        return None
    for arg in argv[1:]:
        # (Each piece between `=` too: objcopy's --dump-section=.data=.git wrote .git, review s30. Not `:` or
        # `,`: `--exclude-dir=.git,node_modules` names it to leave it out; a `.git` made is set aside after.)
        pieces = [piece for piece in arg.split("=") if piece]
        for word in dict.fromkeys([*pieces, arg]):
            rel = lexical_path(cwd, word) if word else None
            stem = _stem(rel) if isinstance(rel, str) else None
            if (
                stem
                and (place := protected_root(stem)) is not None
                and protected_granted(list(writes), stem) is None
            ):
                return _no(
                    f"'{arg}' less its last suffix names the protected place '{place}', which a program Kiwi does "
                    "not know may write (a decompressor writes `sub/.git.lrz` as `sub/.git`)",
                    f"leave '{place}' out of the command's names",
                )
        # (Every tail of a cluster of short options: `-co.git` is -c and -o .git, review s30.)
        attached = (
            {arg[k:] for k in range(2, len(arg))}
            if arg.startswith("-") and not arg.startswith("--")
            else set()
        )
        for word in dict.fromkeys([*pieces, *sorted(attached, key=len), arg]):
            rel = lexical_path(cwd, word) if word else None
            place = protected_root(rel) if isinstance(rel, str) else None
            if place is not None and protected_granted(list(writes), rel) is None:
                return _no(
                    f"'{arg}' names the protected place '{place}', which a program Kiwi does not know may write",
                    f"leave '{place}' out of the command",
                )
    return None


def _stem(rel: str) -> str | None:
    """``rel`` without its last suffix (`sub/.git.lrz`: `sub/.git`), or None when its name has none."""
    folder, _, name = rel.rpartition("/")
    stem, dot, _ = name.rpartition(".")
    if not dot or not stem:
        return None
    return f"{folder}/{stem}" if folder else stem


def _split_names(args: Sequence[str], cwd: str) -> str:
    """A protected place split could write (PREFIX + letters or digits + SUFFIX: `split -a 1
    --additional-suffix=ml FILE temporal-dev.` made temporal-dev.yml), '' if none. Read without split's
    options: every word (an option's by its `=` value) is taken as the prefix and as the additional suffix,
    and a protected name that some prefix, one or more letters or digits and some suffix make (folded as a
    case-insensitive filesystem sees names) refuses it."""
    words = [w.partition("=")[2] if w.startswith("-") else w for w in args]
    in_ai = any(
        isinstance(rel := lexical_path(cwd, w), str)
        and ".ai" in (fold(rel), fold(posixpath.dirname(rel)))  # (`.ai/` is .ai itself: review s28)
        for w in words
        if w
    )
    names = _PROTECTED_NAMES + (_PROTECTED_IN_AI if in_ai else ())
    # (The prefix as it is: `sub/.` begins `.git`, and folded it was nothing: review s28.)
    prefixes = {""} | {posixpath.basename(w.replace("\\", "/")).casefold() for w in words}
    suffixes = {""} | {w.casefold().rstrip(" .") for w in words}
    # (The longest words first: the name the error gives is the one the command's own words make.)
    for prefix in sorted(prefixes, key=lambda w: (-len(w), w)):
        for suffix in sorted(suffixes, key=lambda w: (-len(w), w)):
            made = re.compile(re.escape(prefix) + "[a-z0-9]+" + re.escape(suffix))
            for protected in names:
                if made.fullmatch(protected):
                    return protected if protected in _PROTECTED_NAMES else f".ai/{protected}"
    return ""


# What Kiwi reads of a decompressor's options: any other (`-r`, which took every file of a folder, `-N` and
# its abbreviation `--na`, the name kept in the file, `-S`, a suffix of the agent's) is refused (review s28).
_DECOMPRESSOR_FLAGS = frozenset("cdfklnqtv123456789")
_DECOMPRESSOR_LONG = frozenset(
    [
        "--stdout",
        "--to-stdout",
        "--decompress",
        "--uncompress",
        "--force",
        "--keep",
        "--list",
        "--no-name",
        "--quiet",
        "--test",
        "--verbose",
        "--fast",
        "--best",
    ]
)
_COMPRESSED = (".gz", ".z", "-gz", "-z", "_z", ".xz", ".lzma", ".bz2", ".zst", ".lz4", ".lz", ".br", ".Z")
_ARCHIVES_COMPRESSED = {".tgz": ".tar", ".taz": ".tar", ".txz": ".tar", ".tbz": ".tar", ".tbz2": ".tar"}


def _decompressed_names(name: str, args: Sequence[str], cwd: str) -> str:
    """Why a decompressor could write a protected place ('' when it could not): an option Kiwi does not read,
    or, decompressing, a file whose name less its suffix is one (`gzip -d sub/.git.gz`)."""
    decompress = name.startswith("un") or name in ("gunzip", "bunzip2")
    files = []
    threads = False  # (the word after a bare -T is its number of threads)
    for index, arg in enumerate(args):
        if threads:
            threads = False
            if not arg.isdigit():
                return f"'-T {arg}': -T takes a number of threads (-T0, -T 4)"
            continue
        if arg == "--":
            files += args[index + 1 :]
            break
        if arg.startswith("--threads=") and arg.partition("=")[2].isdigit():
            continue
        if arg.startswith("-") and not arg.startswith("--") and "T" in arg:
            # -T0, -dT4, -T 4: the threads xz, zstd and lz4 work with (read so by Kiwi for every decompressor:
            # pigz's -T, which takes none, is refused before a file name).
            cut = arg.index("T")
            value, arg = arg[cut + 1 :], arg[:cut]
            if value and not value.isdigit():
                return f"'{args[index]}': -T takes a number of threads (-T0, -T 4)"
            threads = not value
            if arg == "-":
                continue
        if arg.startswith("--"):
            if arg not in _DECOMPRESSOR_LONG:
                return f"'{arg}' is an option of {name} that Kiwi does not read (it reads {', '.join(sorted(_DECOMPRESSOR_LONG))})"
            decompress = decompress or arg in ("--decompress", "--uncompress")
        elif arg.startswith("-") and len(arg) > 1:
            if not set(arg[1:]) <= _DECOMPRESSOR_FLAGS:
                return f"'{arg}' holds an option of {name} that Kiwi does not read (it reads -{''.join(sorted(_DECOMPRESSOR_FLAGS))})"
            decompress = decompress or "d" in arg
        else:
            files.append(arg)
    if not decompress:
        return ""  # (NAME.gz and its kin: no protected place's name ends so)
    for arg in files:
        folder, base = posixpath.split(arg.replace("\\", "/"))
        outputs = [base[: -len(end)] for end in _COMPRESSED if base.endswith(end) and len(base) > len(end)]
        outputs += [
            base[: -len(end)] + tar for end, tar in _ARCHIVES_COMPRESSED.items() if base.endswith(end)
        ]
        for output in outputs:
            rel = lexical_path(cwd, posixpath.join(folder, output))
            if isinstance(rel, str) and (place := protected_root(rel)) is not None:
                return f"'{arg}' would be written as '{rel}', in the protected place '{place}'"
    return ""


def known_program(arg0: str) -> bool:
    """Whether Kiwi knows how ``arg0`` reads its arguments (which files it writes, which options run code):
    only those are covered by ``commands="*"``. (Matched by program_name, folded; the worker and the wall ask
    modeled_program.)"""
    name = program_name(arg0)
    return name in SPECS or name in ("git", "find")


def modeled_program(arg0: str) -> bool:
    """Whether ``arg0`` is, by its exact name, a program Kiwi models. `HEAD` is no `head`: on Debian it is
    libwww-perl's HTTP client (review s30), which program_name's folding read as coreutils' head."""
    return posixpath.basename(arg0) in SPECS


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class ShellVerdict:
    """The answer for one argv (``PermissionSet.check_shell`` turns it into a ``Decision``)."""

    allowed: bool
    reason: str = ""
    hint: str = ""
    checked_against: tuple[str, ...] = ()


@dataclass(frozen=True)
class PathArgument:
    """An argument that names a path: as given, project-relative, and what the program does to it."""

    raw: str
    rel: str
    mode: str  # "read" | "write"
    tree: bool = False  # the program works on everything below it (rm -r, tar -x into it)
    # A path in a git object's name (REV:PATH): read from the repository, named from its root, not the cwd.
    in_repository: bool = False
    # FOLDER/NAME that cp, mv or ln would write into a folder (the worker's, path_arguments with probes).
    probe: bool = False
    # A path git rewrites in the working tree, a file or everything below a folder (the worker's, as above).
    pathspec: bool = False


def _no(reason: str, hint: str = "", against: Iterable[str] = ()) -> ShellVerdict:
    return ShellVerdict(False, reason, hint, tuple(against))


_LOCAL_HINT = (
    'use a local tool (.ai/tools, granted with <execute resource="tool"/>) or a Kiwi built-in '
    "(filesystem.*, git.*) instead"
)


# ---------------------------------------------------------------- program specs


@dataclass(frozen=True)
class Spec:
    """How a known program reads its arguments.

    ``values``: options taking a value, and what the value is ("value", "read" or "write" path).
    ``forbidden``: options refused always, with why. ``granted``: options refused unless the shell
    grant's ``options`` names them. ``operands``: how non-option arguments are paths (see ``_operands``).
    """

    values: Mapping[str, str] = field(default_factory=dict)
    forbidden: Mapping[str, str] = field(default_factory=dict)
    granted: frozenset[str] = frozenset()
    operands: str = "read"
    aliases: Mapping[str, str] = field(default_factory=dict)
    flags: frozenset[str] = frozenset()  # known long flags without a value (for abbreviations)
    # Since KNOWN_OPTIONS: every other option the program has (``known``: without a value; ``later_values``,
    # ``later_forbidden``: as ``values``, ``forbidden``). A spec with them is closed: an option it does not
    # name is refused. ``negations``: ``--no-NAME`` is known for every known ``--NAME`` (rg).
    known: frozenset[str] = frozenset()
    later_values: Mapping[str, str] = field(default_factory=dict)
    later_forbidden: Mapping[str, str] = field(default_factory=dict)
    negations: bool = False


def _k(text: str) -> frozenset[str]:
    return frozenset(text.split())


_FOLLOW = "follows symbolic links out of the project"
SPECS: dict[str, Spec] = {
    "rm": Spec(
        operands="write",
        aliases={
            "-R": "-r",
            "--recursive": "-r",
            "--force": "-f",
            "--dir": "-d",
            "--interactive": "-i",
            "--verbose": "-v",
            "-I": "-i",
        },
        flags=frozenset(
            {
                "--recursive",
                "--force",
                "--dir",
                "--verbose",
                "--one-file-system",
                "--preserve-root",
                "--no-preserve-root",
                "--interactive",
            }
        ),
    ),
    "rmdir": Spec(operands="write"),
    "mkdir": Spec(values={"-m": "value", "--mode": "value", "--context": "optional"}, operands="write"),
    "touch": Spec(
        values={"-r": "read", "--reference": "read", "-d": "value", "--date": "value", "-t": "value"},
        operands="write",
    ),
    "tee": Spec(operands="write"),
    "truncate": Spec(
        values={"-s": "value", "--size": "value", "-r": "read", "--reference": "read"}, operands="write"
    ),
    "cp": Spec(
        values={"-t": "write", "--target-directory": "write", "-S": "value", "--suffix": "value"},
        forbidden={"-L": _FOLLOW, "--dereference": _FOLLOW},
        aliases={"-R": "-r", "--recursive": "-r", "--force": "-f"},
        flags=frozenset({"--link"}),
        operands="copy",
    ),
    "mv": Spec(
        values={"-t": "write", "--target-directory": "write", "-S": "value", "--suffix": "value"},
        aliases={"--force": "-f"},
        operands="write",
    ),
    "ln": Spec(
        values={"-t": "write", "--target-directory": "write", "-S": "value", "--suffix": "value"},
        aliases={"--force": "-f", "--symbolic": "-s"},
        operands="link",
    ),
    "chmod": Spec(values={"--reference": "read"}, aliases={"-R": "-r", "--recursive": "-r"}, operands="mode"),
    "ls": Spec(
        values={
            "-I": "value",
            "--ignore": "value",
            "-w": "value",
            "--width": "value",
            "-T": "value",
            "--tabsize": "value",
            "--hide": "value",
            "--sort": "value",
            "--format": "value",
            "--time": "value",
            "--time-style": "value",
            "--color": "optional",
            "--block-size": "value",
            "--quoting-style": "value",
            "--indicator-style": "value",
        },
        forbidden={"-L": _FOLLOW, "--dereference": _FOLLOW},
    ),
    "cat": Spec(),
    "wc": Spec(),
    "nl": Spec(),
    "stat": Spec(values={"-c": "value", "--format": "value", "--printf": "value"}),
    "file": Spec(
        values={"-m": "read", "--magic-file": "read", "-f": "read", "--files-from": "read"},
        forbidden={
            "-C": "writes a compiled magic file into the cwd, which Kiwi does not check",
            "--compile": "writes a compiled magic file into the cwd, which Kiwi does not check",
            "-z": "runs decompression programs",
            "--uncompress": "runs decompression programs",
            "-Z": "runs decompression programs",
            "--uncompress-noreport": "runs decompression programs",
        },
    ),
    "head": Spec(values={"-n": "value", "--lines": "value", "-c": "value", "--bytes": "value"}),
    "tail": Spec(
        values={
            "-n": "value",
            "--lines": "value",
            "-c": "value",
            "--bytes": "value",
            "-s": "value",
            "--sleep-interval": "value",
            "--pid": "value",
        }
    ),
    "du": Spec(
        values={
            "-d": "value",
            "--max-depth": "value",
            "-B": "value",
            "--block-size": "value",
            "-t": "value",
            "--threshold": "value",
            "--exclude": "value",
            "-X": "read",
            "--exclude-from": "read",
            "--files0-from": "read",
            "--time-style": "value",
            "--time": "optional",
        },
        forbidden={"-L": _FOLLOW, "--dereference": _FOLLOW},
    ),
    "tree": Spec(
        values={
            "-L": "value",
            "-P": "value",
            "-I": "value",
            "-o": "write",
            "-H": "value",
            "-T": "value",
            "--charset": "value",
            "--filelimit": "value",
            "--timefmt": "value",
            "--hintro": "read",
            "--houtro": "read",
            "--gitfile": "read",
            "--infofile": "read",
        },
        forbidden={"-l": _FOLLOW, "-R": "runs tree again in every folder"},
    ),
    "sort": Spec(
        values={
            "-o": "write",
            "--output": "write",
            "-T": "write",
            "--temporary-directory": "write",
            "--files0-from": "read",
            "--random-source": "read",
            "-k": "value",
            "--key": "value",
            "-t": "value",
            "--field-separator": "value",
            "-S": "value",
            "--buffer-size": "value",
            "--parallel": "value",
            "--batch-size": "value",
            "--sort": "value",
        },
        forbidden={"--compress-program": "runs the program it names"},
    ),
    "uniq": Spec(
        values={
            "-f": "value",
            "--skip-fields": "value",
            "-s": "value",
            "--skip-chars": "value",
            "-w": "value",
            "--check-chars": "value",
            "--group": "optional",
            "--all-repeated": "optional",
        },
        operands="in-out",
    ),
    "cut": Spec(
        values={
            "-b": "value",
            "-c": "value",
            "-f": "value",
            "-d": "value",
            "--delimiter": "value",
            "--fields": "value",
            "--bytes": "value",
            "--characters": "value",
            "--output-delimiter": "value",
        }
    ),
    "diff": Spec(
        values={
            "-D": "value",
            "--ifdef": "value",
            "-U": "value",
            "--unified": "optional",
            "-C": "value",
            "--context": "optional",
            "-x": "value",
            "--exclude": "value",
            "-X": "read",
            "--exclude-from": "read",
            "-I": "value",
            "--ignore-matching-lines": "value",
            "-W": "value",
            "--width": "value",
            "--from-file": "read",
            "--to-file": "read",
            "-S": "value",
            "--starting-file": "value",
            "--label": "value",
            "-F": "value",
            "--show-function-line": "value",
            "--palette": "value",
            "--color": "optional",
            "--tabsize": "value",
            "--line-format": "value",
            "--horizon-lines": "value",
        },
        forbidden={
            "-r": "compares folders through symbolic links out of the project",
            "--recursive": "compares folders through symbolic links out of the project",
        },
    ),
    "cmp": Spec(values={"-i": "value", "--ignore-initial": "value", "-n": "value", "--bytes": "value"}),
    "comm": Spec(values={"--output-delimiter": "value"}),
    "md5sum": Spec(),
    "sha1sum": Spec(),
    "sha256sum": Spec(),
    "sha512sum": Spec(),
    "b2sum": Spec(),
    "readlink": Spec(),
    "realpath": Spec(values={"--relative-to": "read", "--relative-base": "read"}),
    "echo": Spec(operands="none"),
    "printf": Spec(operands="none"),
    "printenv": Spec(operands="none"),
    "pwd": Spec(operands="none"),
    "true": Spec(operands="none"),
    "false": Spec(operands="none"),
    "basename": Spec(operands="none", values={"-s": "value", "--suffix": "value"}),
    "dirname": Spec(operands="none"),
    "date": Spec(
        operands="none",
        values={
            "-d": "value",
            "--date": "value",
            "-f": "read",
            "--file": "read",
            "-r": "read",
            "--reference": "read",
            "-I": "optional",
            "--iso-8601": "optional",
        },
        forbidden={"-s": "sets the clock", "--set": "sets the clock"},
    ),
    "seq": Spec(
        operands="none", values={"-f": "value", "--format": "value", "-s": "value", "--separator": "value"}
    ),
    "tr": Spec(operands="none"),
    "yes": Spec(operands="none"),
    "whoami": Spec(operands="none"),
    "uname": Spec(operands="none"),
    "id": Spec(operands="none"),
    "grep": Spec(
        values={
            "-e": "value",
            "--regexp": "value",
            "-f": "read",
            "--file": "read",
            "-m": "value",
            "--max-count": "value",
            "-A": "value",
            "-B": "value",
            "-C": "value",
            "--after-context": "value",
            "--before-context": "value",
            "--context": "value",
            "--include": "value",
            "--exclude": "value",
            "--exclude-dir": "value",
            "--exclude-from": "read",
            "-d": "value",
            "--directories": "value",
            "-D": "value",
            "--devices": "value",
            "--label": "value",
            "--color": "optional",
            "--colour": "optional",
            "--binary-files": "value",
            "--group-separator": "value",
        },
        forbidden={"-R": _FOLLOW, "--dereference-recursive": _FOLLOW},
        flags=frozenset({"--binary"}),  # (exact: not an abbreviation of --binary-files)
        operands="pattern",
    ),
    "rg": Spec(
        values={
            "-e": "value",
            "--regexp": "value",
            "-f": "read",
            "--file": "read",
            "-g": "value",
            "--glob": "value",
            "--iglob": "value",
            "-t": "value",
            "--type": "value",
            "-T": "value",
            "--type-not": "value",
            "--type-add": "value",
            "--type-clear": "value",
            "-m": "value",
            "--max-count": "value",
            "-A": "value",
            "-B": "value",
            "-C": "value",
            "--after-context": "value",
            "--before-context": "value",
            "--context": "value",
            "-M": "value",
            "--max-columns": "value",
            "-j": "value",
            "--threads": "value",
            "-d": "value",
            "--max-depth": "value",
            "-E": "value",
            "--encoding": "value",
            "--color": "value",
            "--colors": "value",
            "-r": "value",
            "--replace": "value",
            "--ignore-file": "read",
            "--max-filesize": "value",
            "--sort": "value",
            "--sortr": "value",
            "-V": "value",
            "--path-separator": "value",
            "--context-separator": "value",
            "--field-match-separator": "value",
            "--field-context-separator": "value",
            "--engine": "value",
            "--dfa-size-limit": "value",
            "--regex-size-limit": "value",
        },
        forbidden={
            "--pre": "runs the program it names on every file",
            "--pre-glob": "chooses files for --pre, which runs a program",
            "-z": "runs decompression programs",
            "--search-zip": "runs decompression programs",
            "-L": _FOLLOW,
            "--follow": _FOLLOW,
            "--hostname-bin": "runs the program it names to learn the host's name",
        },
        flags=frozenset({"--files", "--hidden", "--no-ignore", "--fixed-strings", "--count"}),
        operands="pattern",
    ),
    "tar": Spec(
        values={
            "-f": "archive",
            "--file": "archive",
            "-C": "cwd",
            "--directory": "cwd",
            "-T": "read",
            "--files-from": "read",
            "-X": "read",
            "--exclude-from": "read",
            "--exclude": "value",
            "-b": "value",
            "--blocking-factor": "value",
            "--format": "value",
            "-H": "value",
            "--owner": "value",
            "--group": "value",
            "--mode": "value",
            "--mtime": "value",
            "--transform": "value",
            "--xform": "value",
            "--strip-components": "value",
            "-N": "value",
            "--newer": "value",
            # (Read since ARCHIVE_OPTIONS: as unknown options with a value, they were checked only when the
            # value had a '/', and tar --add-file=.env read a denied file.)
            "--add-file": "read",
            "--owner-map": "read",
            "--group-map": "read",
            "--sort": "value",
            "--after-date": "value",
            "--newer-mtime": "value",
        },
        forbidden={
            "--to-command": "runs the program it names for every file",
            "--use-compress-program": "runs the program it names",
            "-I": "runs the program it names",
            "--checkpoint-action": "can run a command at every checkpoint",
            "--info-script": "runs the script it names",
            "--new-volume-script": "runs the script it names",
            "-F": "runs the script it names",
            "--rsh-command": "runs the program it names",
            "--rmt-command": "runs the program it names",
            "-h": _FOLLOW,
            "--dereference": _FOLLOW,
            "--absolute-names": "writes and reads absolute paths",
            "-P": "writes and reads absolute paths",
            # (Refused in runs once they meet ARCHIVE_OPTIONS; see _LATER_OPTIONS.)
            "--index-file": "writes the file it names, which Kiwi does not check",
            "--volno-file": "writes the file it names, which Kiwi does not check",
            "-g": "writes the snapshot file it names, which Kiwi does not check",
            "--listed-incremental": "writes the snapshot file it names, which Kiwi does not check",
            "--one-top-level": "unpacks into the folder it names, which Kiwi does not check",
            "--no-verbatim-files-from": "lets a -T list carry options (-C, --directory) Kiwi does not check",
            "--no-force-local": "makes an archive named HOST:PATH a remote one, reached by running rsh",
            "--no-null": "lets a -T list carry options (-C, --directory) Kiwi does not check",
        },
        flags=frozenset(
            {
                "--create",
                "--extract",
                "--get",
                "--list",
                "--append",
                "--update",
                "--concatenate",
                "--catenate",
                "--diff",
                "--compare",
                "--delete",
                "--gzip",
                "--bzip2",
                "--xz",
                "--zstd",
                "--verbose",
                "--to-stdout",
                "--checkpoint",  # (not an abbreviation of --checkpoint-action)
                "--remove-files",
                "--overwrite",
                "--no-overwrite-dir",
            }
        ),
        operands="tar",
    ),
    "zip": Spec(
        values={
            "-b": "write",
            "--temp-path": "write",
            "-x": "value",
            "--exclude": "value",
            "-i": "value",
            "--include": "value",
            "-n": "value",
            "--suffixes": "value",
            "-P": "value",
            "--password": "value",
            "-Z": "value",
            "--compression-method": "value",
            "-t": "value",
            "-tt": "value",
        },
        forbidden={
            "-TT": "runs the program it names to test the archive",
            "--unzip-command": "runs the program it names to test the archive",
            "-T": "runs unzip (through sh) to test the archive",
            "--test": "runs unzip (through sh) to test the archive",
        },
        aliases={"--recurse-paths": "-r", "--recurse-patterns": "-R", "--symlinks": "-y", "--move": "-m"},
        operands="zip",
    ),
    "unzip": Spec(
        values={"-d": "extract", "-x": "value", "-P": "value"},
        # (Refused in runs once they meet ARCHIVE_OPTIONS; see _LATER_OPTIONS.)
        forbidden={
            "-:": "unpacks names with ../ out of the folder it is given",
            "-^": "keeps control characters in the names it writes",
        },
        operands="unzip",
    ),
    "find": Spec(operands="find"),
    "git": Spec(operands="git"),
}

# Every other option these programs have (GNU coreutils 9.1, grep 3.8, diffutils 3.8, file 5.44, tree 2.1,
# ripgrep 13): since KNOWN_OPTIONS an option a program's spec does not name is refused, so that an option
# Kiwi never read (`diff -l` runs pr, `sort --compress-program` any program) cannot pass as a harmless flag.
# Per program: options without a value, options with one (and what it is), options refused. tar, zip and
# unzip are held to a grammar of their own (_archive_shape), find and git are read by _find and _git, and
# the words of echo, printf, true, false and yes are text.
_COREUTILS = "--help --version"
_SUMS = (
    "-b -c -t -w -z --binary --check --ignore-missing --quiet --status --strict --tag --text --warn --zero"
)
_KNOWN: dict[str, tuple[str, dict[str, str], dict[str, str]]] = {
    "rm": ("-f -i -I -r -R -d -v", {"--interactive": "optional", "--preserve-root": "optional"}, {}),
    "rmdir": ("-p -v --parents --verbose --ignore-fail-on-non-empty", {}, {}),
    "mkdir": ("-p -v -Z --parents --verbose", {}, {}),
    "touch": ("-a -c -f -h -m --no-create --no-dereference", {"--time": "value"}, {}),
    "tee": ("-a -i -p --append --ignore-interrupts", {"--output-error": "optional"}, {}),
    "truncate": ("-c -o --no-create --io-blocks", {}, {}),
    "cp": (
        "-H -P -R -T -Z -a -b -d -f -i -l -n -p -r -s -u -v -x --archive --attributes-only --copy-contents "
        "--force --interactive --link --no-clobber --no-dereference --no-target-directory --one-file-system "
        "--parents --recursive --remove-destination --strip-trailing-slashes --symbolic-link --verbose",
        {
            "--backup": "optional",
            "--context": "optional",
            "--no-preserve": "value",
            "--preserve": "optional",
            "--reflink": "optional",
            "--sparse": "value",
            "--update": "optional",
        },
        {},
    ),
    "mv": (
        "-T -Z -b -f -i -n -u -v --context --force --interactive --no-clobber --no-target-directory "
        "--strip-trailing-slashes --verbose",
        {"--backup": "optional", "--update": "optional"},
        {},
    ),
    "ln": (
        "-F -L -P -T -b -d -f -i -n -r -s -v --directory --force --interactive --logical --no-dereference "
        "--no-target-directory --physical --relative --symbolic --verbose",
        {"--backup": "optional"},
        {},
    ),
    "chmod": (
        "-R -c -f -v --changes --no-preserve-root --preserve-root --quiet --recursive --silent --verbose",
        {},
        {},
    ),
    "ls": (
        "-1 -A -B -C -D -F -G -H -N -Q -R -S -U -X -Z -a -b -c -d -f -g -h -i -k -l -m -n -o -p -q -r -s -t "
        "-u -v -x --all --almost-all --author --context --dereference-command-line "
        "--dereference-command-line-symlink-to-dir --directory --dired --escape --file-type --full-time "
        "--group-directories-first --hide-control-chars --human-readable --ignore-backups --inode --kibibytes "
        "--literal --no-group --numeric-uid-gid --quote-name --recursive --reverse --show-control-chars --si "
        "--size --zero",
        {"--classify": "optional", "--hyperlink": "optional"},
        {},
    ),
    "cat": (
        "-A -E -T -b -e -n -s -t -u -v --number --number-nonblank --show-all --show-ends --show-nonprinting "
        "--show-tabs --squeeze-blank",
        {},
        {},
    ),
    "wc": ("-L -c -l -m -w --bytes --chars --lines --max-line-length --words", {"--files0-from": "read"}, {}),
    "nl": (
        "-p --no-renumber",
        {
            **dict.fromkeys(("-b", "-d", "-f", "-h", "-i", "-l", "-n", "-s", "-v", "-w"), "value"),
            **dict.fromkeys(
                (
                    "--body-numbering",
                    "--section-delimiter",
                    "--footer-numbering",
                    "--header-numbering",
                    "--line-increment",
                    "--join-blank-lines",
                    "--number-format",
                    "--number-separator",
                    "--starting-line-number",
                    "--number-width",
                ),
                "value",
            ),
        },
        {},
    ),
    "stat": ("-L -f -t --dereference --file-system --terse", {"--cached": "value"}, {}),
    "file": (
        "-0 -L -N -S -b -c -d -h -i -k -l -n -p -r -s -v --apple --brief --checking-printout --debug "
        "--dereference --extension --keep-going --list --mime --mime-encoding --mime-type --no-buffer "
        "--no-dereference --no-pad --no-sandbox --preserve-date --print0 --raw --special-files",
        {
            "-e": "value",
            "--exclude": "value",
            "--exclude-quiet": "value",
            "-F": "value",
            "--separator": "value",
            "-P": "value",
            "--parameter": "value",
        },
        {},
    ),
    "head": ("-q -v -z --quiet --silent --verbose --zero-terminated", {}, {}),
    "tail": (
        "-F -f -q -v -z --quiet --retry --silent --verbose --zero-terminated",
        {"--follow": "optional", "--max-unchanged-stats": "value"},
        {},
    ),
    "du": (
        "-0 -D -H -P -S -a -b -c -h -k -l -m -s -x --all --apparent-size --bytes --count-links "
        "--dereference-args --human-readable --inodes --no-dereference --null --one-file-system "
        "--separate-dirs --si --summarize --total",
        {},
        {},
    ),
    "tree": (
        "-A -C -D -F -J -N -Q -U -X -a -c -d -f -g -h -i -n -p -q -r -s -t -u -v -x --device --dirsfirst --du "
        "--fflinks --filesfirst --fromfile --ignore-case --inodes --matchdirs --metafirst "
        "--nolinks --noreport --prune --si",
        {"--sort": "value"},
        {
            "--info": "reads a .info file in every folder, through links Kiwi does not check",
            "--gitignore": "reads a .gitignore file in every folder, through links Kiwi does not check",
        },
    ),
    "sort": (
        "-C -M -R -V -b -c -d -f -g -h -i -m -n -r -s -u -z --debug --dictionary-order --general-numeric-sort "
        "--human-numeric-sort --ignore-case --ignore-leading-blanks --ignore-nonprinting --merge --month-sort "
        "--numeric-sort --random-sort --reverse --stable --unique --version-sort --zero-terminated",
        {"--check": "optional"},
        {},
    ),
    "uniq": ("-D -c -d -i -u -z --count --ignore-case --repeated --unique --zero-terminated", {}, {}),
    "cut": ("-n -s -z --complement --only-delimited --zero-terminated", {}, {}),
    "diff": (
        "-B -E -N -T -Z -a -b -c -d -e -i -n -p -q -s -t -u -v -w -y --brief --ed --expand-tabs "
        "--ignore-all-space --ignore-blank-lines --ignore-case --ignore-file-name-case --ignore-space-change "
        "--ignore-tab-expansion --ignore-trailing-space --initial-tab --left-column --minimal --new-file "
        "--no-dereference --no-ignore-file-name-case --normal --rcs --report-identical-files "
        "--show-c-function --side-by-side --speed-large-files --strip-trailing-cr --suppress-blank-empty "
        "--suppress-common-lines --text --unidirectional-new-file",
        dict.fromkeys(
            (
                "--old-group-format",
                "--new-group-format",
                "--unchanged-group-format",
                "--changed-group-format",
                "--old-line-format",
                "--new-line-format",
                "--unchanged-line-format",
            ),
            "value",
        ),
        {"-l": "runs the program pr", "--paginate": "runs the program pr"},
    ),
    "cmp": ("-b -l -s -v --print-bytes --quiet --silent --verbose", {}, {}),
    "comm": ("-1 -2 -3 -z --check-order --nocheck-order --total --zero-terminated", {}, {}),
    "md5sum": (_SUMS, {}, {}),
    "sha1sum": (_SUMS, {}, {}),
    "sha256sum": (_SUMS, {}, {}),
    "sha512sum": (_SUMS, {}, {}),
    "b2sum": (_SUMS, {"-l": "value", "--length": "value"}, {}),
    "readlink": (
        "-e -f -m -n -q -s -v -z --canonicalize --canonicalize-existing --canonicalize-missing --no-newline "
        "--quiet --silent --verbose --zero",
        {},
        {},
    ),
    "realpath": (
        "-L -P -e -m -q -s -z --canonicalize-existing --canonicalize-missing --logical --no-symlinks "
        "--physical --quiet --strip --zero",
        {},
        {},
    ),
    "printenv": ("-0 --null", {}, {}),
    "pwd": ("-L -P --logical --physical", {}, {}),
    "basename": ("-a -z --multiple --zero", {}, {}),
    "dirname": ("-z --zero", {}, {}),
    "date": ("-R -u --debug --resolution --rfc-email --universal --utc", {"--rfc-3339": "value"}, {}),
    "seq": ("-w --equal-width", {}, {}),
    "tr": ("-C -c -d -s -t --complement --delete --squeeze-repeats --truncate-set1", {}, {}),
    "whoami": ("", {}, {}),
    "uname": (
        "-a -i -m -n -o -p -r -s -v --all --hardware-platform --kernel-name --kernel-release --kernel-version "
        "--machine --nodename --operating-system --processor",
        {},
        {},
    ),
    "id": ("-G -Z -a -g -n -r -u -z --context --group --groups --name --real --user --zero", {}, {}),
    "grep": (
        "-E -F -G -H -I -L -P -T -U -V -Z -a -b -c -h -i -l -n -o -q -r -s -v -w -x -y -z --basic-regexp "
        "--byte-offset --count --extended-regexp --files-with-matches --files-without-match --fixed-strings "
        "--ignore-case --initial-tab --invert-match --line-buffered --line-number --line-regexp --no-filename "
        "--no-group-separator --no-ignore-case --no-messages --null --null-data --only-matching "
        "--perl-regexp --quiet --recursive --silent --text --with-filename --word-regexp",
        {},
        {},
    ),
    "rg": (
        "-. -0 -F -H -I -N -P -S -U -V -a -b -c -h -i -l -n -o -p -q -s -u -v -w -x --auto-hybrid-regex "
        "--binary --block-buffered --byte-offset --case-sensitive --column --count-matches --crlf --debug "
        "--files-with-matches --files-without-match --glob-case-insensitive --heading --hidden "
        "--ignore-case --ignore-file-case-insensitive --include-zero --invert-match --json --line-buffered "
        "--line-number --line-regexp --max-columns-preview --mmap --multiline --multiline-dotall --no-config "
        "--no-context-separator --no-filename --no-heading --no-ignore-dot --no-ignore-exclude "
        "--no-ignore-files --no-ignore-global --no-ignore-messages --no-ignore-parent --no-ignore-vcs "
        "--no-line-number --no-messages --no-mmap --no-pcre2-unicode --no-require-git --no-unicode --null "
        "--null-data --one-file-system --only-matching --passthru --pcre2 --pcre2-unicode --pcre2-version "
        "--pretty --quiet --smart-case --sort-files --stats --text --trace --trim --type-list --unicode "
        "--unrestricted --vimgrep --with-filename --word-regexp",
        {},
        {},
    ),
}
for _name, (_known, _values, _forbidden) in _KNOWN.items():
    SPECS[_name] = dataclasses.replace(
        SPECS[_name],
        known=_k(_known) | _k(_COREUTILS),
        later_values=_values,
        later_forbidden=_forbidden,
        negations=_name == "rg",
    )


# ---------------------------------------------------------------- option parsing


def _resolve_long(name: str, spec: Spec) -> str:
    """``--to-comm`` is ``--to-command`` (GNU getopt and git take unique abbreviations)."""
    known = {
        k
        for k in (*spec.values, *spec.forbidden, *spec.granted, *spec.aliases, *spec.flags)
        if k.startswith("--")
    }
    if name in known:
        return name
    matches = sorted(k for k in known if k.startswith(name) and len(name) > 2)
    dangerous = [k for k in matches if k in spec.forbidden or k in spec.granted]
    if dangerous:
        return dangerous[0]
    return matches[0] if len(matches) == 1 else name


@dataclass
class _Parsed:
    options: list[str] = field(default_factory=list)  # canonical names, in order
    values: list[tuple[str, str, str]] = field(default_factory=list)  # (option, kind, value)
    operands: list[str] = field(default_factory=list)
    plain: int | None = None  # (how many operands came before `--`: after it every word is an operand)


class UnknownOption(ShellVerdict):
    """An option a closed spec does not name (refused since KNOWN_OPTIONS)."""


_CLOSED: dict[str, tuple[Spec, frozenset[str]]] = {}


def _closed(program: str, spec: Spec) -> tuple[Spec, frozenset[str]]:
    """``spec`` (the ``program``'s) with every option it knows since KNOWN_OPTIONS, and all their names."""
    if program not in _CLOSED:
        full = dataclasses.replace(
            spec,
            values={**spec.values, **spec.later_values},
            forbidden={**spec.forbidden, **spec.later_forbidden},
            flags=spec.flags | spec.known,
        )
        names = frozenset((*full.values, *full.forbidden, *full.granted, *full.aliases, *full.flags))
        _CLOSED[program] = (full, names)
    return _CLOSED[program]


def _not_known(
    program: str, name: str, arg: str, names: frozenset[str], abbreviations: bool = True
) -> UnknownOption:
    several = sorted(
        k for k in names if abbreviations and name.startswith("--") and k.startswith(name) and len(name) > 2
    )
    what = (
        f"abbreviates several of {program}'s options ({', '.join(several)})"
        if len(several) > 1
        else f"is not an option of {program} that Kiwi knows"
    )
    return UnknownOption(
        False,
        f"option '{name}'{'' if arg.startswith(name) else f' (in {arg!r})'} {what}: Kiwi refuses options it "
        "has not read, so that none can run a program or write a file it does not check",
        f"run {program} with the options `{program} --help` lists (whole long names), or use a Kiwi built-in "
        "for the step",
    )


def _parse(
    args: Sequence[str],
    spec: Spec,
    allow_grant: set[str],
    *,
    abbreviations: bool = True,
    equals_sign: bool = False,
    program: str = "",
) -> _Parsed | ShellVerdict:
    """GNU-style options (clusters, ``--x=v``, abbreviations, ``--``) of a known program. Without
    ``abbreviations`` a long option is only its exact name; with ``equals_sign`` a short option's `=VALUE`
    is VALUE (rg's parser). Given the ``program``'s name, a spec that lists all its options (KNOWN_OPTIONS)
    is read with them, and an option it does not name is refused."""
    names: frozenset[str] | None = None
    if program and spec.known:
        spec, names = _closed(program, spec)
    out = _Parsed()
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            out.plain = len(out.operands)
            out.operands.extend(args[i:])
            break
        if arg.startswith("--"):
            raw, eq, value = arg.partition("=")
            name = _resolve_long(raw, spec) if abbreviations else raw
            if names is not None and name not in names:
                negation = spec.negations and name.startswith("--no-") and f"--{name[5:]}" in names
                if not negation:
                    return _not_known(program, name, arg, names, abbreviations)
            problem = _option_problem(name, spec, allow_grant, arg)
            if problem:
                return problem
            name = spec.aliases.get(name, name)
            out.options.append(name)
            kind = spec.values.get(name)
            if kind == "optional":
                # (GNU takes an optional value only as --opt=VALUE: the next word is an operand.)
                if eq:
                    out.values.append((name, "value", value))
                continue
            if kind:
                if not eq:
                    if i >= len(args):
                        return _no(f"option '{raw}' needs a value")
                    value = args[i]
                    i += 1
                out.values.append((name, kind, value))
            elif eq:
                out.values.append((name, "unknown", value))
            continue
        if arg.startswith("-") and len(arg) > 1 and not _is_number(arg):
            if arg in spec.forbidden or arg in spec.values or arg in spec.granted:
                chars = [arg]  # multi-letter single-dash options (zip -TT)
            else:
                chars = [f"-{c}" for c in arg[1:]]
            for index, opt in enumerate(chars):
                if names is not None and opt not in names:
                    return _not_known(program, opt, arg, names)
                problem = _option_problem(opt, spec, allow_grant, arg)
                if problem:
                    return problem
                canonical = spec.aliases.get(opt, opt)
                out.options.append(canonical)
                kind = spec.values.get(opt)
                if kind == "optional":
                    # (A short option's optional value is only the rest of its word: date -Iseconds.)
                    rest = "".join(c[1:] for c in chars[index + 1 :])
                    if rest:
                        out.values.append((canonical, "value", rest))
                    break
                if kind:
                    rest = "".join(c[1:] for c in chars[index + 1 :])
                    if equals_sign and rest.startswith("="):
                        rest = rest[1:] or "="
                    if rest:
                        value = rest
                    elif i < len(args):
                        value = args[i]
                        i += 1
                    else:
                        return _no(f"option '{opt}' needs a value")
                    out.values.append((canonical, kind, value))
                    break
            continue
        out.operands.append(arg)
    return out


def _tree_cluster(args: Sequence[str]) -> str:
    """A word of tree's single-letter options holding one that takes a value (`-Lo`: tree gives -L and -o
    the next words, in order), or ''."""
    for arg in args:
        if arg == "--":
            break
        if arg.startswith("-") and not arg.startswith("--") and len(arg) > 2 and set(arg[1:]) & set("LPIoHT"):
            return arg
    return ""


_CHMOD_OPTIONS = re.compile(r"-[cfvR]+")
_CHMOD_MODE = re.compile(r"-[rwxXstugoa0-7,+=-]+")


def _chmod_mode_first(args: Sequence[str]) -> list[str]:
    """chmod's arguments with a mode written as an option (`chmod -w,a+rwx FILE`, `chmod -r FILE`: GNU takes
    it for the MODE, and every other word for a file) moved to the front as the mode operand. After `--`
    every word is a file (`chmod -w -- -l`)."""
    cut = list(args).index("--") if "--" in args else len(args)
    before, after = list(args[:cut]), list(args[cut + 1 :])
    for arg in before:
        if _CHMOD_MODE.fullmatch(arg) and not _CHMOD_OPTIONS.fullmatch(arg):
            options = [a for a in before if a.startswith("-") and a != arg]
            files = [a for a in before if not a.startswith("-")]
            return [*options, "--", arg.lstrip("-") or "=", *files, *after]
    return list(args)


def down_and_up(text: str) -> bool:
    """Whether a path goes into a folder and back up (`a/../b`, `X/X/../..`): '..' after a named segment."""
    named = False
    for segment in text.replace("\\", "/").split("/"):
        if segment == "..":
            if named:
                return True
        elif segment not in ("", "."):
            named = True
    return False


def _is_number(arg: str) -> bool:
    return bool(re.fullmatch(r"-\d+", arg))  # head -5, a negative number


def _option_problem(name: str, spec: Spec, allow_grant: set[str], arg: str) -> ShellVerdict | None:
    if name in spec.forbidden:
        return _no(
            f"option '{name}'{'' if arg.startswith(name) else f' (in {arg!r})'} is refused: it "
            f"{spec.forbidden[name]}",
            "run the program without it, or use a Kiwi built-in for the step",
        )
    if name in spec.granted and name not in allow_grant:
        return _no(
            f"option '{name}' is refused unless the shell grant names it",
            f'add options="{name}" to the <execute resource="shell"/> grant that names this program '
            "(a human signs that directive)",
        )
    return None


# ---------------------------------------------------------------- paths


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


# Since session 29 (a hostile review): a folder a command reads or writes whole (grep -r, cp -r, rm -r) needs a
# grant that covers everything below it, not one that names the folder alone (`.`, `src`, `*`: `grep -r KEY .`
# printed every file to a run that may read only the root's listing). Asked only where it changes the answer.
TREE_GRANTED = "kiwi-tree-granted-s29"


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


# ---------------------------------------------------------------- per-program operands


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


# ---------------------------------------------------------------- unpacking, staged

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


# find: tests and actions taking one argument; which of them name files.
_FIND_ARG = {
    "-name",
    "-iname",
    "-path",
    "-ipath",
    "-wholename",
    "-iwholename",
    "-regex",
    "-iregex",
    "-lname",
    "-ilname",
    "-type",
    "-xtype",
    "-size",
    "-perm",
    "-user",
    "-group",
    "-uid",
    "-gid",
    "-mtime",
    "-atime",
    "-ctime",
    "-mmin",
    "-amin",
    "-cmin",
    "-maxdepth",
    "-mindepth",
    "-links",
    "-inum",
    "-printf",
    "-fstype",
    "-used",
    "-context",
    "-regextype",
    "-D",
    "-newermm",
}
_FIND_FILE = {"-newer", "-anewer", "-cnewer", "-samefile", "-files0-from"}
_FIND_RUN = {"-exec", "-execdir", "-ok", "-okdir"}
_FIND_WRITE = {"-fprint": 1, "-fprint0": 1, "-fls": 1, "-fprintf": 2}
FIND_GRANTABLE = ("-delete", *_FIND_WRITE)


def _find(
    args: Sequence[str], allow: set[str], options: bool = True
) -> list[tuple[str, str, bool]] | ShellVerdict:
    """find's start points and what its expression reads and writes. ``options``: as findutils reads the
    leading words since SHELL_OPTIONS (`--` ends them, -O takes any number, a lone `-` is a start point:
    `find -- ../outside` listed a folder Kiwi never saw)."""
    i = 0
    found: list[tuple[str, str, bool]] = []
    level = r"-O\d+" if options else r"-O\d"
    while (
        i < len(args)
        and args[i] in ("-H", "-P", "-L", "-D")
        or (i < len(args) and re.fullmatch(level, args[i]))
    ):
        if args[i] in ("-L",):
            return _no(f"option '-L' is refused: it {_FOLLOW}", "run find without -L")
        i += 2 if args[i] == "-D" else 1
    if options and i < len(args) and args[i] == "--":
        i += 1
    starts = []
    while i < len(args) and not (
        (args[i].startswith("-") and not (options and args[i] == "-")) or args[i] in ("(", ")", "!", ",")
    ):
        starts.append(args[i])
        i += 1
    starts = starts or ["."]
    deleting = False
    while i < len(args):
        token = args[i]
        i += 1
        if token in _FIND_RUN:
            return _no(
                f"find's '{token}' is refused: it runs a program on every file it finds",
                "list the files with find, then act on them with Kiwi's filesystem tools",
            )
        if token == "-follow":
            return _no(f"find's '-follow' is refused: it {_FOLLOW}", "run find without -follow")
        if token == "-delete" or token in _FIND_WRITE:
            if token not in allow:
                return _no(
                    f"find's '{token}' is refused unless the shell grant names it",
                    f'add options="{token}" to the <execute resource="shell" commands="find"/> grant '
                    "(a human signs that directive)",
                )
            if token == "-delete":
                deleting = True
            else:
                if i >= len(args):
                    return _no(f"find's '{token}' needs a file")
                found.append((args[i], "write", False))
                i += _FIND_WRITE[token]
        elif token in _FIND_FILE or re.fullmatch(r"-newer[amctB][amctB]", token):
            if i < len(args):
                if not (token.startswith("-newer") and token[-1] == "t"):
                    found.append((args[i], "read", False))
                i += 1
        elif token in _FIND_ARG:
            i += 1
    return found + [(s, "write" if deleting else "read", deleting) for s in starts]


# ---------------------------------------------------------------- git

GIT_SUBCOMMANDS = frozenset(
    [
        "status",
        "diff",
        "log",
        "show",
        "add",
        "commit",
        "rm",
        "mv",
        "restore",
        "checkout",
        "switch",
        "branch",
        "tag",
        "stash",
        "reset",
        "rev-parse",
        "ls-files",
        "ls-tree",
        "blame",
        "annotate",
        "grep",
        "init",
        "merge",
        "shortlog",
        "describe",
        "cat-file",
        "rev-list",
        "show-ref",
        "for-each-ref",
        "merge-base",
        "name-rev",
        "diff-tree",
        "diff-files",
        "diff-index",
        "cherry-pick",
        "revert",
        "whatchanged",
        "count-objects",
        "check-ignore",
        "check-attr",
        "cherry",
        "range-diff",
        "reflog",
        "version",
    ]
)
GIT_REFUSED_SUBCOMMANDS = {
    **{
        c: "runs programs from configuration or the command line"
        for c in (
            "config",
            "filter-branch",
            "submodule",
            "bisect",
            "difftool",
            "mergetool",
            "rebase",
            "am",
            "help",
            "instaweb",
            "web--browse",
            "send-email",
            "daemon",
            "worktree",
            "maintenance",
            "gc",
            "repack",
            "credential",
            "fsmonitor--daemon",
            "var",
            "apply",
            "format-patch",
            "notes",
            "clean",
            "sparse-checkout",
        )
    },
    **{
        c: "talks to other repositories over the network"
        for c in (
            "fetch",
            "pull",
            "push",
            "clone",
            "remote",
            "archive",
            "ls-remote",
            "bundle",
            "request-pull",
            "upload-pack",
            "receive-pack",
            "upload-archive",
            "http-backend",
            "shell",
        )
    },
    **{
        c: "writes git's object store or refs directly"
        for c in (
            "hash-object",
            "update-index",
            "update-ref",
            "commit-tree",
            "read-tree",
            "checkout-index",
            "write-tree",
            "symbolic-ref",
            "mktree",
            "mktag",
            "fast-import",
            "replace",
            "prune",
            "fsck",
            "unpack-objects",
            "index-pack",
            "pack-objects",
            "merge-file",
            "merge-index",
            "merge-tree",
        )
    },
}
# Options refused before the subcommand (they point git somewhere else or make it run something).
_GIT_GLOBAL_REFUSED = {
    "-c": "sets configuration, which can make git run any program (alias.x=!cmd, core.fsmonitor)",
    "--config-env": "sets configuration, which can make git run any program",
    "--exec-path": "changes where git finds the programs it runs",
    "-C": "runs git in another folder",
    "--git-dir": "points git at another repository",
    "--work-tree": "points git at another folder",
    "--namespace": "changes the refs git sees",
    "-p": "starts a pager",
    "--paginate": "starts a pager",
    "--bare": "treats the folder as a bare repository",
    "--super-prefix": "is internal to git",
    "--list-cmds": "is internal to git",
    "--html-path": "is not needed",
    "--man-path": "is not needed",
    "--info-path": "is not needed",
    "--help": "starts a manual viewer",
    "-h": "starts a manual viewer",
}
_GIT_GLOBAL_OK = {
    "--no-pager",
    "-P",
    "--no-replace-objects",
    "--literal-pathspecs",
    "--glob-pathspecs",
    "--noglob-pathspecs",
    "--icase-pathspecs",
    "--no-optional-locks",
    "--version",
}
# Refused anywhere before "--", whatever the subcommand.
GIT_REFUSED_OPTIONS = {
    "--upload-pack": "runs the program it names",
    "--receive-pack": "runs the program it names",
    "--exec": "runs the program it names",
    "-x": "runs a command (rebase) or is not needed here",
    "--ext-diff": "runs the external diff program from configuration",
    "-O": "opens files in a pager (git grep) or reads an order file",
    "--open-files-in-pager": "starts a pager",
    "--template": "copies hooks from the folder it names",
    "--config-env": "sets configuration",
    "--exec-path": "changes where git finds the programs it runs",
    "--git-dir": "points git at another repository",
    "--work-tree": "points git at another folder",
    "--namespace": "changes the refs git sees",
    "--paginate": "starts a pager",
    "--help": "starts a manual viewer",
    "--separate-git-dir": "puts the repository somewhere else",
    "--interactive": "starts an editor",
    "--edit": "starts an editor",
    "--patch": "starts an interactive session that runs diff filters",
    "--upload-archive": "runs the program it names",
    "--remote": "talks to another repository",
}
# Per subcommand: options whose value follows as the next argument, and what the value is.
_GIT_VALUES: dict[str, dict[str, str]] = {
    "*": {
        "--output": "write",
        "--pathspec-from-file": "read",
        "-n": "value",
        "--max-count": "value",
        "--author": "value",
        "--committer": "value",
        "--grep": "value",
        "--since": "value",
        "--until": "value",
        "--after": "value",
        "--before": "value",
        "-S": "value",
        "-G": "value",
        "-L": "value",
        "--format": "value",
        "--pretty": "value",
        "--date": "value",
        "--skip": "value",
        "--diff-filter": "value",
        "--src-prefix": "value",
        "--dst-prefix": "value",
        "--line-prefix": "value",
        "--encoding": "value",
    },
    "commit": {
        "-m": "value",
        "--message": "value",
        "-F": "read",
        "--file": "read",
        "-C": "value",
        "-c": "value",
        "--reuse-message": "value",
        "--reedit-message": "value",
        "-t": "read",
        "--fixup": "value",
        "--squash": "value",
        "--trailer": "value",
        "--cleanup": "value",
        "-u": "value",
        "--untracked-files": "value",
        "--author": "value",
        "--date": "value",
    },
    "tag": {
        "-m": "value",
        "--message": "value",
        "-F": "read",
        "--file": "read",
        "-u": "value",
        "--local-user": "value",
        "--contains": "value",
        "--points-at": "value",
        "--sort": "value",
        "--format": "value",
        "--merged": "value",
        "--no-merged": "value",
        "--cleanup": "value",
    },
    "branch": {
        "--contains": "value",
        "--merged": "value",
        "--no-merged": "value",
        "--sort": "value",
        "--format": "value",
        "--set-upstream-to": "value",
        "-u": "value",
        "--points-at": "value",
    },
    "blame": {
        "-L": "value",
        "-S": "read",
        "--contents": "read",
        "--ignore-revs-file": "read",
        "--ignore-rev": "value",
    },
    "grep": {
        "-e": "value",
        "-f": "read",
        "-m": "value",
        "--max-count": "value",
        "-A": "value",
        "-B": "value",
        "-C": "value",
        "--after-context": "value",
        "--before-context": "value",
        "--context": "value",
        "--max-depth": "value",
        "--threads": "value",
    },
    "stash": {"-m": "value", "--message": "value"},
    "merge": {
        "-m": "value",
        "-F": "read",
        "--file": "read",
        "-s": "value",
        "--strategy": "value",
        "-X": "value",
        "--strategy-option": "value",
    },
    "restore": {"-s": "value", "--source": "value"},
    "checkout": {"-b": "value", "-B": "value", "--orphan": "value", "--conflict": "value"},
    "switch": {
        "-c": "value",
        "-C": "value",
        "--create": "value",
        "--force-create": "value",
        "--orphan": "value",
        "--conflict": "value",
    },
    "cherry-pick": {
        "-m": "value",
        "--mainline": "value",
        "-s": "value",
        "--strategy": "value",
        "-X": "value",
        "--strategy-option": "value",
    },
    "revert": {"-m": "value", "--mainline": "value", "-s": "value", "--strategy": "value"},
    "init": {"-b": "value", "--initial-branch": "value", "--shared": "value", "--object-format": "value"},
    "cat-file": {},
    "rev-parse": {},
    "ls-files": {
        "--exclude": "value",
        "-X": "read",
        "--exclude-from": "read",
        "--exclude-per-directory": "value",
    },
    "shortlog": {"-w": "value", "--group": "value"},
    "describe": {
        "--match": "value",
        "--exclude": "value",
        "--candidates": "value",
        "--dirty": "value",
        "--broken": "value",
        "--abbrev": "value",
    },
}
# Subcommands whose paths (operands) are written; those that rewrite the work tree need write on ".".
_GIT_WRITE_PATHS = {"add", "rm", "mv", "restore", "checkout", "init"}
_GIT_TREE_WRITERS = {"switch", "stash", "merge", "cherry-pick", "revert"}
# Subcommands that rewrite the working tree at the paths they name (git add only stages them).
_GIT_TREE_PATHS = {"rm", "mv", "restore", "checkout"}
_GIT_REVISION_FIRST = {
    "log",
    "show",
    "diff",
    "blame",
    "grep",
    "shortlog",
    "describe",
    "cat-file",
    "rev-parse",
    "rev-list",
    "ls-tree",
    "diff-tree",
    "diff-index",
    "merge-base",
    "name-rev",
    "branch",
    "tag",
    "reset",
    "checkout",
    "switch",
    "merge",
    "cherry-pick",
    "revert",
    "reflog",
    "whatchanged",
    "cherry",
    "range-diff",
    "restore",
    "stash",
    "show-ref",
    "for-each-ref",
    "annotate",
    "diff-files",
    "status",
    "ls-files",
    "check-ignore",
    "check-attr",
    "count-objects",
    "version",
    "commit",
}


def _git_option(token: str, values: Mapping[str, str]) -> tuple[str, str]:
    """A long git option as git reads it (unique abbreviations too: ``--ext`` is ``--ext-diff``), and its value."""
    name, _, value = token.partition("=")
    if name in GIT_REFUSED_OPTIONS or name in values or len(name) <= 2:
        return name, value
    refused = sorted(k for k in GIT_REFUSED_OPTIONS if k.startswith(name))
    if refused:
        return refused[0], value
    known = [k for k in values if k.startswith("--") and k.startswith(name)]
    return (known[0] if len(known) == 1 else name), value


# git subcommands whose -S, -G, -L, -n take a value (pickaxe, line ranges, counts); elsewhere they are flags
# (`git restore -S PATH` is --staged: PATH was taken for a value and never checked). Since SHELL_OPTIONS.
_GIT_LOG_FAMILY = frozenset({"log", "show", "whatchanged", "shortlog", "diff", "blame", "annotate"})
# git subcommands where -p is --patch (interactive hunks).
_GIT_PATCHING = frozenset({"restore", "checkout", "reset", "stash", "commit", "switch"})
# Options with which `git checkout -b NAME` / `git switch -c NAME` only make a branch where HEAD is.
_GIT_NEW_BRANCH_ONLY = frozenset(
    {"-b", "-B", "-c", "-C", "--create", "--force-create", "-q", "--quiet", "-t", "--track", "--no-track",
     "--guess", "--no-guess"}
)  # fmt: skip
# Long options git takes by a unique start that make a subcommand rewrite the working tree.
_GIT_REWRITING = {"reset": ("--hard", "--merge", "--keep")}


# The merge strategies git has built in: any other NAME runs the program git-merge-NAME found on PATH.
_GIT_STRATEGIES = frozenset({"ort", "recursive", "resolve", "octopus", "ours", "subtree"})
_GIT_MERGE_SHORT_VALUES = "mFsX"


def _git_strategy(sub: str, rest: Sequence[str]) -> ShellVerdict | None:
    """Why ``git merge -s NAME`` (or merge's, cherry-pick's, revert's --strategy) may not run, or None."""
    i = 0
    while i < len(rest):
        token = rest[i]
        i += 1
        if token == "--":
            break
        value: str | None = None
        if token == "--strategy":
            value = rest[i] if i < len(rest) else ""
            i += 1
        elif token.startswith("--strategy="):
            value = token.partition("=")[2]
        elif token.startswith("--") and token in (*_GIT_VALUES.get(sub, {}), "--message"):
            i += 1  # (its value: `--message -sfoo` names no strategy)
        elif sub == "merge" and token.startswith("-") and not token.startswith("--"):
            for index, char in enumerate(token[1:], start=2):
                if char == "S":
                    break  # (-S[KEYID]: the rest of the word is a key id)
                if char in _GIT_MERGE_SHORT_VALUES:
                    taken = token[index:] or (rest[i] if i < len(rest) else "")
                    i += 0 if token[index:] else 1
                    value = taken if char == "s" else None
                    break
        if value is not None and value not in _GIT_STRATEGIES:
            return _no(
                f"git merge strategy '{value}' is refused: git runs a program named git-merge-{value} for it",
                f"use one of git's own: {', '.join(sorted(_GIT_STRATEGIES))}",
            )
    return None


def _git(
    args: Sequence[str], options: bool = True, known: bool = False
) -> list[tuple[str, str, bool]] | ShellVerdict:
    i = 0
    while i < len(args) and args[i].startswith("-"):
        token = args[i]
        name = token.partition("=")[0]
        if (
            name in _GIT_GLOBAL_REFUSED
            or name.startswith("-c")
            and not name.startswith("--")
            or (name.startswith("-C") and not name.startswith("--"))
        ):
            key = name if name in _GIT_GLOBAL_REFUSED else name[:2]
            return _no(
                f"git option '{key}' is refused: it {_GIT_GLOBAL_REFUSED[key]}",
                "run git without it; the repository is the project's own, in the command's cwd",
            )
        if name not in _GIT_GLOBAL_OK:
            return _no(
                f"git option '{name}' before the subcommand is not one Kiwi allows",
                f"allowed there: {', '.join(sorted(_GIT_GLOBAL_OK))}",
            )
        if known and name in ("--icase-pathspecs", "--glob-pathspecs"):
            # (`git --icase-pathspecs rm -r out` deleted OUT/: since KNOWN_OPTIONS.)
            return _no(
                f"git option '{name}' is refused: it makes every path a pattern, and Kiwi checks names",
                "name each path as it is",
            )
        i += 1
    if i >= len(args):
        return []
    sub = args[i]
    if sub in GIT_REFUSED_SUBCOMMANDS:
        return _no(
            f"'git {sub}' is refused: it {GIT_REFUSED_SUBCOMMANDS[sub]}",
            "use the git.status/diff/commit/checkpoint/rollback tools or an allowed subcommand: "
            + ", ".join(sorted(GIT_SUBCOMMANDS)),
        )
    if sub not in GIT_SUBCOMMANDS:
        return _no(
            f"'git {sub}' is not a subcommand Kiwi allows (aliases and other programs are refused)",
            "allowed: " + ", ".join(sorted(GIT_SUBCOMMANDS)),
        )
    rest = list(args[i + 1 :])
    if known and sub in ("merge", "cherry-pick", "revert") and (problem := _git_strategy(sub, rest)):
        return problem  # (since KNOWN_OPTIONS)
    if known and sub == "reflog" and rest[:1] and rest[0] in ("expire", "delete", "drop"):
        return _no(
            f"'git reflog {rest[0]}' is refused: it rewrites the repository's records of where refs were",
            "read them with git reflog [show]",
        )
    values = {**_GIT_VALUES["*"], **_GIT_VALUES.get(sub, {})}
    if options:
        if sub == "annotate":
            values = {
                **values,
                **_GIT_VALUES["blame"],
            }  # (annotate is blame's older name: -S FILE, --contents)
        if sub not in _GIT_LOG_FAMILY:
            values = {k: v for k, v in values.items() if k not in ("-S", "-G", "-L", "-n")}
        if sub == "init":
            values.pop("--shared", None)  # (--shared[=PERMS]: the next word is the folder)
    if options and known:
        # (Since KNOWN_OPTIONS: `git blame -n FILE` is --show-number and `git show --pretty REV:PATH` takes
        # no value from the next word; each swallowed the path it then read unchecked.)
        if sub not in ("log", "show", "whatchanged"):
            values.pop("-n", None)
        values.pop("--pretty", None)
    found: list[tuple[str, str, bool]] = []
    before: list[str] = []
    after: list[str] | None = None
    opts: list[str] = []
    j = 0
    while j < len(rest):
        token = rest[j]
        j += 1
        if token == "--":
            after = rest[j:]
            break
        if token.startswith("--"):
            name, value = _git_option(token, values)
            if options and name not in values:
                name = next(
                    (o for o in _GIT_REWRITING.get(sub, ()) if len(name) > 3 and o.startswith(name)), name
                )
            if name in GIT_REFUSED_OPTIONS:
                return _no(
                    f"git option '{name}' is refused: it {GIT_REFUSED_OPTIONS[name]}", "run git without it"
                )
            opts.append(name)
            kind = values.get(name)
            if kind and "=" not in token:
                if j >= len(rest):
                    return _no(f"git option '{name}' needs a value")
                value = rest[j]
                j += 1
            if kind in ("read", "write"):
                found.append((value, kind, False))
                if options:
                    # (Some git commands open these from the repository's root, not the cwd: blame
                    # --contents, grep -f, ls-files -X: `../outside/f` from out/ left the project.)
                    found.append((value, kind + "@root", False))
            elif value and _path_like(value):
                found.append((value, "read", False))
            continue
        if token.startswith("-") and token != "-" and not _is_number(token):
            for index, char in enumerate(token[1:], start=1):
                opt = f"-{char}"
                if opt in GIT_REFUSED_OPTIONS:
                    return _no(
                        f"git option '{opt}' is refused: it {GIT_REFUSED_OPTIONS[opt]}", "run git without it"
                    )
                if sub == "add" and opt in ("-p", "-i", "-e"):
                    return _no(
                        f"'git add {opt}' is refused: it starts an interactive session or an editor",
                        "stage paths with git add PATH",
                    )
                if options and opt == "-p" and sub in _GIT_PATCHING:
                    # (-p is --patch here: it asks hunk by hunk, and `git restore -p` with no path names
                    # none for Kiwi to check while it may write anywhere in the tree.)
                    return _no(
                        f"'git {sub} -p' is refused: it picks hunks interactively, anywhere in the tree",
                        f"name the paths: git {sub} PATH",
                    )
                opts.append(opt)
                kind = values.get(opt)
                if kind:
                    value = token[index + 1 :]
                    if not value:
                        if j >= len(rest):
                            return _no(f"git option '{opt}' needs a value")
                        value = rest[j]
                        j += 1
                    if kind in ("read", "write"):
                        found.append((value, kind, False))
                        if options:
                            found.append((value, kind + "@root", False))
                    break
            continue
        before.append(token)
    no_index = "--no-index" in opts
    if no_index and sub == "diff" and rule_in_force(SHELL_REVIEW_S28):
        # (It reads folders whole, and git's rules let git read the repositories' settings, which other
        # programs may not: `git diff --no-index empty .` printed .git/config's credentials, review s28.)
        return _no(
            "'git diff --no-index' is refused: it compares files outside git, reading git's own settings too",
            "compare files with diff -u A B (diff -r for folders)",
        )
    writes = sub in _GIT_WRITE_PATHS
    tree_writer = (
        sub in _GIT_TREE_WRITERS
        or (sub == "reset" and any(o in opts for o in ("--hard", "--merge", "--keep")))
        or (sub == "checkout" and (after is None or (options and not after)))
        or (sub == "add" and not before and not after)
    )
    new_branch_here = (
        sub in ("checkout", "switch")
        and any(o in opts for o in ("-b", "-B", "-c", "-C", "--create", "--force-create"))
        and not before
        and after is None
        # (Since SHELL_OPTIONS, only with options that leave the tree as it is: `git checkout -f -b x`
        # reset every tracked file to HEAD, which the agent can point anywhere.)
        and (not options or all(o in _GIT_NEW_BRANCH_ONLY for o in opts))
    )
    if tree_writer and not new_branch_here:
        # (A new branch where HEAD is leaves the working tree as it is: `git checkout -b other`.) The whole
        # repository's working tree, wherever the cwd is (since SHELL_OPTIONS: `git reset --hard` run in out/
        # was checked as a write of out/, and rewrote src/).
        found.append((".", "root*" if options else "write*", False))
    mode = "write" if writes else "read"
    if sub in _GIT_TREE_PATHS:
        # Paths it rewrites in the working tree: each a whole tree (`git restore --source=REV -- .ai` wrote the
        # protected places inside .ai), and no pathspec magic or glob (`:(icase).AI/CONFIG`, `temporal-dev.ym?`)
        # the literal check would read as a name.
        mode = "write*"
        if "--pathspec-from-file" in opts:
            found.append(("--pathspec-from-file", "magic", False))
    elif (
        sub in ("add", "commit")
        and (_git_stages(sub, opts) or before or after)
        and rule_in_force(GIT_ADD_TREES)
    ):
        # What it stages is each path's whole tree, as `git add -A` stages the repository's (review s35: `git add
        # -N .` put a tool's untracked .env in the index, reading nothing the wall withholds, and git.diff printed
        # it; a human's `git commit -a` would commit it). `git commit PATH`, `-a` and a file of paths stage too
        # (third review s35: `git commit -a` under `write src/**` committed a denied file and Kiwi's records).
        mode = "write*"
        if "--pathspec-from-file" in opts:
            found.append(("--pathspec-from-file", "magic", False))
        if sub == "commit" and any(o in opts for o in ("-a", "--all")):
            found.append((".", "write*", False))
    if after is not None:
        found += [_git_path(p, mode) for p in after]
        if sub in ("add", "rm", "mv", "restore", "init") or (sub == "commit" and mode == "write*"):
            found += [_git_path(p, mode) for p in before]
        else:
            found += [(p, "read", False) for p in before if _path_like(p)]
        if sub == "init" and known and rule_in_force(SHELL_REVIEW_S28):
            # (`git init -- sub` makes sub/.git as `git init sub` does: review s28.)
            found += [(posixpath.join(p, ".git"), "write", False) for p in ((after or before)[-1:] or ["."])]
    elif no_index or sub == "diff" and any(_path_like(p) for p in before):
        # Outside a repository "git diff a b" compares files on disk: they are paths.
        found += [(p, "read", False) for p in before]
    elif writes and sub != "checkout":
        found += [_git_path(p, mode) for p in before]
        if sub == "init" and not before:
            found.append((".", "write", False))
        if sub == "init" and known:
            # (It makes FOLDER/.git, a protected place: `git init` in out/ made out/.git; KNOWN_OPTIONS.)
            found += [(posixpath.join(p, ".git"), "write", False) for p in (before[-1:] or ["."])]
    elif known and sub in ("blame", "annotate"):
        # (Its file is read as it is in the working tree, a name without '/' too: `git blame temporal-dev.yml`.
        # Since KNOWN_OPTIONS.)
        found += [(p, "read", False) for p in before]
    elif mode == "write*":
        found += [_git_path(p, mode) for p in before]  # (git commit PATH...: every operand a path it stages)
    else:
        found += [(p, mode, False) for p in before if _path_like(p)]
    # An object named REV:PATH (`git show HEAD:.ai/config/x`, `:PATH` in the index, `:N:PATH`) reads the file
    # PATH as it was: PATH is checked as a read, from the project's root (from the cwd when it starts ./ or
    # ../), as filesystem.read would check it.
    found += [(path, "object", False) for token in before if (path := _object_path(token))]
    return found


def _git_stages(sub: str, opts: Sequence[str]) -> bool:
    """Whether git add or git commit, with these options, stages paths of its own choosing (a file of paths;
    commit's `-a`)."""
    return "--pathspec-from-file" in opts or (sub == "commit" and any(o in opts for o in ("-a", "--all")))


def _object_path(token: str) -> str:
    """The path in a git object name ``REV:PATH`` ('' when ``token`` names none)."""
    if ":" not in token or token.startswith(":(") or "://" in token:
        return ""
    rest = token.partition(":")[2]
    if token.startswith(":") and rest[:1].isdigit() and rest[1:2] == ":":
        rest = rest[2:]  # (:N:PATH, a stage of the index)
    return rest


def _git_path(path: str, mode: str) -> tuple[str, str, bool]:
    """A path git writes: ``magic`` when git would read it as a pattern (see path_arguments)."""
    if mode == "write*" and (path.startswith(":") or any(c in path for c in "*?[")):
        return (path, "magic", False)
    return (path, mode, False)


def git_reads_everything(g: _Grants) -> ShellVerdict | None:
    """git can print any file of the repository (``git show HEAD:secret``), so it needs read on all of it."""
    if not any(glob_covered("**", p) for p in g.read):
        return _no(
            "git reads every file of the repository (git show, log -p, grep), and this run may not read "
            "all of the project",
            'add <read resource="filesystem" path="**"/>, or use the git.* tools',
            g.read,
        )
    if g.deny:
        return _no(
            f"git reads every file of the repository, and this run denies '{g.deny[0]}'",
            "use the git.* tools, or drop the denial",
            g.deny,
        )
    return None


# ---------------------------------------------------------------- blocked commands

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


# ---------------------------------------------------------------- the check


def _options_for(
    program: str, options_granted: Mapping[str, Iterable[str]] | Iterable[str] | None
) -> set[str]:
    if not options_granted:
        return set()
    if isinstance(options_granted, Mapping):
        return {*options_granted.get(program, ()), *options_granted.get("*", ())}
    return set(options_granted)


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


# Since session 25: an option a program's spec does not name is refused (Spec.known: `diff -l` ran pr, and
# every option Kiwi had not read passed as a flag). Workflow code answers by this rule behind this patch,
# asked only where it changes the answer (a marker only in runs that meet it); the worker checks by it always.
KNOWN_OPTIONS = "kiwi-known-options"


# Since session 28 (a hostile review): cp -a read as recursive, cp -r's and mv's -t folder as a whole-tree
# write, `git diff --no-index` refused. Workflow code answers by these rules behind this patch, asked only
# where they can change the answer (a marker only in runs that meet them); the worker checks by them always.
SHELL_REVIEW_S28 = "kiwi-shell-review-s28"


# Since session 35: `git add PATH` writes PATH's whole tree to the index, protected places included only by a
# grant naming them, as `git add -A` does; a pattern or --pathspec-from-file is refused as for `git restore`.
# Workflow code answers by this rule behind this patch, asked only for a git add naming paths.
GIT_ADD_TREES = "kiwi-git-add-trees-s35"


# Workflow code checks with the rules of _into_folder, _git_path and git's whole-tree paths behind this
# patch (a marker only in runs that meet them): runs that ran such commands before replay as they ran.
SHELL_PATHS_WHOLE = "kiwi-shell-paths-whole"


# Workflow code refuses LATER_REFUSED programs, and programs Kiwi does not know under commands="*", behind
# this patch (a marker only in runs that meet it).
SHELL_KNOWN_ONLY = "kiwi-shell-known-only"


# Since session 30 (a hostile review): commands="*" covers a program by its exact name (`HEAD` was read as
# `head`). Workflow code refuses other names behind this patch (a marker only in runs that meet it).
EXACT_NAMES = "kiwi-exact-names-s30"


# Workflow code checks the PATH of a git object named REV:PATH behind this patch (a marker only in runs that
# name one).
GIT_OBJECT_PATHS = "kiwi-git-object-paths"


# Since session 23 (two reviews of the staged unpacking), tar, zip and unzip are read as they read themselves:
# tar's old-style letters, options that write a file or pick a folder Kiwi did not check, names after -C, -T
# lists in create mode, --remove-files and zip -m sources as writes, zip -O/-lf as writes, zip -T. Workflow
# code answers by these rules behind this patch, asked only where they change the answer (a marker only in
# runs that meet them); _SPECS_BEFORE_ARCHIVES are the specs runs from before replay with. The worker
# checks by them always.
ARCHIVE_OPTIONS = "kiwi-archive-options"


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


# Since session 24 (the second review of the folder rules): options whose value GNU takes only as
# --opt=VALUE (the next word is an operand: `grep --color KEY ../../outside/f` read outside the project),
# `rg --hostname-bin` (it runs the program it names) and `file -C` (it writes a compiled magic file in the
# cwd), `\` in a path (a separator to Kiwi, part of a name here), and `ln -s` targets with -r (named from
# the cwd) and -t DIR (read from DIR). Workflow code answers by these rules behind this patch, asked only
# where they change the answer; the worker checks by them always.
SHELL_OPTIONS = "kiwi-shell-options"
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
            f'add <execute resource="shell" commands="{program}"/> to <permissions>',
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
            f'name it in <execute resource="shell" commands="{program}"/> if the directive really needs it '
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
        if problem:
            if p is paths[0]:
                if _cwd_unread(argv, p, g, options_granted, known) and rule_in_force(CWD_UNREAD):
                    continue
                whole = first_match(list(g.deny), p.rel) is None and any(
                    u is p and depth is None
                    for u, _, depth in folder_uses(argv, paths, options_granted, known)
                )
                return _no(
                    f"the command's cwd '{p.rel}' may not be read by this run",
                    f'add <read resource="filesystem" path="{"**" if p.rel == "." else p.rel + "/**"}"/> to '
                    "<permissions>, or give the program the paths it reads"
                    if whole
                    else problem.hint,
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
    problem = ungranted_below(argv, paths, g.read, options_granted, known=known)
    if problem is not None and rule_in_force(TREE_GRANTED):
        return problem
    return ShellVerdict(True, checked_against=tuple(allowed))


# Since session 30: a command's cwd needs a read grant only where the program reads it (`ls`, `grep -r KEY`,
# `find` given no path; rg, git and programs Kiwi does not model always): under `read src/**`, `cat src/a.py` run
# from the root was refused. Workflow code answers so behind this patch, asked only where it changes the answer.
CWD_UNREAD = "kiwi-cwd-unread-s30"


def _cwd_unread(
    argv: Sequence[str],
    cwd: PathArgument,
    g: _Grants,
    options_granted: Mapping[str, Iterable[str]] | Iterable[str] | None,
    known: bool,
) -> bool:
    """Whether the program leaves its cwd ``cwd`` unread (it reads and writes only the paths it is given,
    each checked on its own), and the cwd is neither denied nor a protected place."""
    if first_match(list(g.deny), cwd.rel) is not None or protected_root(cwd.rel) is not None:
        return False
    name = program_name(argv[0])
    if not modeled_program(argv[0]) or name == "git":  # (by its exact name: `HEAD` is no head, review s30)
        return False
    if name not in _READS_CWD:
        return True
    if name == "rg":  # (its cwd's ignore files, whatever it searches, and their lines printed in its errors)
        return False
    if name == "find":
        return bool(_find_starts(argv[1:]))
    parsed = _parse(
        list(argv[1:]), SPECS[name], _options_for(name, options_granted), program=name if known else ""
    )
    return isinstance(parsed, _Parsed) and bool(_path_operands(name, parsed))


def _find_starts(args: Sequence[str]) -> list[str]:
    """find's starting points: the words after its leading options (-H, -L, -P, -D X, -O3) and before its
    expression (a word that begins with '-', or '(', '!', ',')."""
    index = 0
    while (
        index < len(args)
        and args[index] in ("-H", "-L", "-P", "-D")
        or (index < len(args) and re.fullmatch(r"-O\d*", args[index]))
    ):
        index += 2 if args[index] == "-D" else 1
    starts = []
    for arg in args[index:]:
        if arg.startswith("-") or arg in ("(", "!", ","):
            break
        starts.append(arg)
    return starts


def ungranted_below(
    argv: Sequence[str],
    paths: Sequence[PathArgument],
    read_grants: Sequence[str],
    options_granted: Mapping[str, Iterable[str]] | Iterable[str] | None = None,
    uses: list[tuple[PathArgument, str, int | None]] | None = None,
    known: bool = True,
) -> ShellVerdict | None:
    """Why ``argv`` may not run when it reads every file below a folder (`grep -r`, `du`, the cwd of `rg`) that
    no read grant covers whole, though one names the folder (`.`, `src`, `*`); None when it may."""
    for p, verb, depth in folder_uses(argv, paths, options_granted, known) if uses is None else uses:
        if verb != "reads":
            continue
        inside = ("*" if p.rel in ("", ".") else f"{p.rel}/*") if depth == 1 else None
        if inside is not None and any(glob_covered(inside, g) for g in read_grants):
            continue
        if inside is None and tree_granted(p.rel, read_grants):
            continue
        where = "the cwd" if p is paths[0] else f"'{p.raw}'"
        return _no(
            f"{posixpath.basename(argv[0])} reads {'the files directly in' if depth == 1 else 'everything below'}"
            f" {where} ({p.rel}), and no read grant covers all of it",
            f'add <read resource="filesystem" path="{"**" if p.rel in ("", ".") else p.rel + "/**"}"/> to '
            "<permissions> if the directive may read all of it, or name the files",
            read_grants,
        )
    return None


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
# Names a grant may give these programs under (their paths are read as an unknown program's, path-like words
# as reads): `egrep -r KEY .` is grep's recursion; rgrep always recurses; dir and vdir are ls.
_SAME_AS = {"egrep": "grep", "fgrep": "grep", "rgrep": "grep", "dir": "ls", "vdir": "ls"}
# Programs that, given no path operand, read below the cwd (an option's file, grep -f PATTERNS or
# --exclude-from, is no path operand: `grep -r KEY --exclude-from=-` searched `.`).
_READS_CWD = frozenset({"rg", "du", "tree", "find", "grep", "ls"})
# Workflow code refuses such folder reads (and whole-folder moves and deletes, _CHANGES_FOLDERS) behind this
# patch, asked only where it changes the answer (a marker only in runs that meet it), for denials whose first
# segment names a place (`secrets/**`); the worker checks every denial on disk (activities/commands.py), so
# `**/.env` refuses a folder only where one is below it. The worker refuses them whatever the run decided.
DENY_INSIDE = "kiwi-deny-inside"
# Since session 30: find given starting points reads them, not its cwd (`find src` was refused where a denial
# reached below the cwd). Workflow code answers so behind this patch, asked only where it changes the answer.
FIND_STARTS = "kiwi-find-starts-s30"


def folder_uses(
    argv: Sequence[str],
    paths: Sequence[PathArgument],
    options_granted: Mapping[str, Iterable[str]] | Iterable[str] | None = None,
    known: bool = True,
    find_cwd: bool = False,
) -> list[tuple[PathArgument, str, int | None]]:
    """The folders ``argv`` reads, moves, deletes or changes as a whole: each path argument (``paths``, from
    path_arguments, the cwd first) with what the program does below it and how deep (None: all the way).
    ``known``: the options read as path_arguments read them, by KNOWN_OPTIONS or not. ``find_cwd``: find's
    cwd counted though it is given starting points (as before FIND_STARTS)."""
    if not argv:
        return []
    given = program_name(argv[0])
    name = _SAME_AS.get(given, given)
    spec = SPECS.get(name)
    if spec is None or name not in (*_READS_FOLDERS, *_CHANGES_FOLDERS):
        return []
    if name == "find":
        # (find reads its starting points, the cwd only when it is given none.)
        parsed = _Parsed(operands=[] if find_cwd else _find_starts(argv[1:]))
    else:
        args = _tar_old_style(list(argv[1:])) if name == "tar" else list(argv[1:])
        found = _parse(args, spec, _options_for(name, options_granted), program=name if known else "")
        if isinstance(found, UnknownOption):
            # (egrep, rgrep, dir and vdir are read as programs Kiwi does not know, their options unchecked:
            # the folders they read are found as before, not lost with the option.)
            found = _parse(args, spec, _options_for(name, options_granted))
        if isinstance(found, ShellVerdict):
            return []  # (refused already by path_arguments)
        parsed = found
    uses: list[tuple[PathArgument, str, int | None]] = []
    if name in _READS_FOLDERS and (given == "rgrep" or _reads_folders(name, parsed)):
        reads = [p for p in paths[1:] if p.mode == "read"]
        if name in _READS_CWD and not _path_operands(name, parsed):
            reads.append(paths[0])
        uses += [(p, "reads", 1 if name == "diff" else None) for p in reads]
    if name in _CHANGES_FOLDERS and (name != "tar" or "--remove-files" in parsed.options):
        kept = _destination(name, parsed)
        uses += [
            (p, _CHANGES_FOLDERS[name], None)
            for p in paths[1:]
            if p.mode == "write" and p.tree and p.raw != kept
        ]
    return uses


def denied_inside(
    argv: Sequence[str],
    paths: Sequence[PathArgument],
    deny: Sequence[str],
    options_granted: Mapping[str, Iterable[str]] | Iterable[str] | None = None,
    uses: list[tuple[PathArgument, str, int | None]] | None = None,
    known: bool = True,
    find_cwd: bool = False,
) -> ShellVerdict | None:
    """Why ``argv`` may not run when it reads, moves, deletes or changes everything below a folder where a
    denial whose first segment names a place can match (None when it may). (`mv data out/` put
    data/secrets where no denial named it; `rm -r data` deleted it.) The worker checks the rest on disk."""
    placed = [d for d in deny if not any(c in glob_segments(d)[0] for c in "*?")]
    if not placed:
        return None
    if uses is None:
        uses = folder_uses(argv, paths, options_granted, known, find_cwd)
    for p, verb, depth in uses:
        for pattern in placed:
            if glob_reaches_below(pattern, p.rel, depth):
                return inside_refusal(argv, p, paths, verb, pattern, deny)
    return None


def inside_refusal(
    argv: Sequence[str],
    p: PathArgument,
    paths: Sequence[PathArgument],
    verb: str,
    pattern: str,
    deny: Sequence[str],
) -> ShellVerdict:
    where = "the cwd" if p is paths[0] else f"'{p.raw}'"
    below = (
        "the files directly in" if verb == "reads" and program_name(argv[0]) == "diff" else "everything below"
    )
    return _no(
        f"{posixpath.basename(argv[0])} {verb} {below} {where} ({p.rel}), which holds paths this run denies "
        f"('{pattern}')",
        "name folders or files that hold nothing the run denies"
        + (", or read files one at a time (filesystem.read)" if verb == "reads" else ""),
        deny,
    )


# Programs whose whole-folder writes act on what is already below the folder (what they delete, move away or
# change), and what they do to it; a destination they move or copy into is not one (_destination).
_CHANGES_FOLDERS = {"rm": "deletes", "mv": "moves", "chmod": "changes", "zip": "deletes", "tar": "deletes"}
# Long options that turn recursion on, as GNU getopt takes them: any unique start (`grep --recur`).
_RECURSING_LONG = {
    "grep": ("--recursive", "--dereference-recursive"),
    "ls": ("--recursive",),
    "cp": ("--recursive", "--archive"),
    "zip": ("--recurse-paths", "--recurse-patterns"),
}


@dataclass(frozen=True)
class LinkMoves:
    """Where ``cp``/``mv``/``ln`` put what they are given, as links stay links: each source lands at
    ``into``/NAME (``into``/SOURCE with ``parents``) when ``into`` is a folder and ``named`` is False (-T),
    else at ``into`` itself. ``top``: a source that is a symbolic link moves as one (mv, cp -r/-a/-d/-P, a
    hard ln); ``below``: so do the links below a source folder (mv, cp -r), and below the folder a source
    link leads to when cp follows it (``follows``: -H). ``made``: ln -s, whose sources are the new links'
    texts."""

    sources: tuple[str, ...]
    into: str
    folder: bool  # (given as the folder to write into: -t DIR)
    parents: bool
    top: bool
    below: bool
    follows: bool = False
    named: bool = False  # (-T, --no-target-directory; ln -n: `into` is the new name, even if a folder)
    made: bool = False
    relative: bool = False  # (ln -sr: each text is named from the cwd, and ln makes it relative)
    named_if_link: bool = False  # (ln -n: `into` is the new name when it is a link, to a folder or not)


def link_moves(argv: Sequence[str]) -> LinkMoves | None:
    """How ``argv`` moves, copies or makes links (see :class:`LinkMoves`), or None when it does none."""
    if not argv:
        return None
    name = program_name(argv[0])
    if name == "git":
        return _git_mv(argv[1:])
    if name not in ("cp", "mv", "ln"):
        return None
    parsed = _parse(list(argv[1:]), SPECS[name], set(), program=name)
    if isinstance(parsed, ShellVerdict):
        return None
    options = set(parsed.options)
    folders = [v for _, k, v in parsed.values if k == "write"]
    ops = list(parsed.operands)
    if name == "ln" and not folders and len(ops) == 1:
        ops.append(".")
    sources, into = (ops, folders[-1]) if folders else (ops[:-1], ops[-1] if ops else "")
    if not sources or not into:
        return None
    named = bool({"-T", "--no-target-directory"} & options)
    if_link = name == "ln" and bool({"-n", "--no-dereference"} & options)
    if name == "ln" and "-s" in options:
        relative = bool({"-r", "--relative"} & options)
        return LinkMoves(
            tuple(sources),
            into,
            bool(folders),
            False,
            False,
            False,
            named=named,
            made=True,
            relative=relative,
            named_if_link=if_link,
        )
    recursive = name == "mv" or (name == "cp" and _reads_folders("cp", parsed))
    as_links = name in ("mv", "ln") or recursive or bool({"-d", "-P", "--no-dereference"} & options)
    follows = _follows_last(name, parsed.options)
    return LinkMoves(
        tuple(sources),
        into,
        bool(folders),
        "--parents" in options,
        as_links and not follows,
        recursive and not (name == "cp" and "-L" in options),
        follows=name == "cp" and recursive and follows,
        named=named,
        named_if_link=if_link,
    )


def _follows_last(name: str, options: Sequence[str]) -> bool:
    """Whether cp (-H, -L) or ln (-L) follows a source link: the last of them and -P (-d, -a for cp) wins."""
    follow = {"cp": ("-H", "-L", "--dereference"), "ln": ("-L", "--logical")}.get(name, ())
    keep = {"cp": ("-P", "--no-dereference", "-d", "-a", "--archive"), "ln": ("-P", "--physical")}.get(
        name, ()
    )
    last = [o for o in options if o in (*follow, *keep)]
    return bool(last) and last[-1] in follow


def _git_mv(args: Sequence[str]) -> LinkMoves | None:
    """``git mv SOURCE... DEST`` moves links as mv does (see :class:`LinkMoves`), or None for any other git."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 1
    if i >= len(args) or args[i] != "mv":
        return None
    ops: list[str] = []
    rest = list(args[i + 1 :])
    for index, word in enumerate(rest):
        if word == "--":
            ops += rest[index + 1 :]
            break
        if not word.startswith("-"):
            ops.append(word)
    if len(ops) < 2:
        return None
    return LinkMoves(tuple(ops[:-1]), ops[-1], False, False, True, True)


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


# Options that read the names of the files to work on from a list (a file, or standard input, which shell.run
# can give): the names in it are never checked, so `sort --files0-from=out/list` read /etc/passwd, and a
# checksum's -c read whatever its sums file named. Refused as tar -T is, behind this patch in workflow code
# (asked only where it changes the answer); always by the worker.
_NAMES_FROM_A_LIST: dict[str, tuple[str, ...]] = {
    "sort": ("--files0-from",),
    "wc": ("--files0-from",),
    "du": ("--files0-from",),
    "find": ("-files0-from",),
    "file": ("-f", "--files-from"),
    **{
        f"{algorithm}sum": ("-c", "--check")
        for algorithm in ("md5", "sha1", "sha224", "sha256", "sha384", "sha512", "b2", "ck")
    },
}
LIST_FILES = "kiwi-list-files"


def names_from_a_list(argv: Sequence[str]) -> ShellVerdict | None:
    """Why ``argv`` may not run when it takes the names of the files it reads from a list (None when not)."""
    if not argv:
        return None
    name = program_name(argv[0])
    listed = _NAMES_FROM_A_LIST.get(name)
    if not listed:
        return None
    longs = [o for o in listed if o.startswith("--") or name == "find"]
    letters = {o[1] for o in listed if not o.startswith("--") and name != "find"}
    for arg in argv[1:]:
        if arg == "--":
            break
        option = arg.split("=", 1)[0]
        hit = next((o for o in longs if len(option) > 2 and o.startswith(option)), None)
        if hit is None and arg.startswith("-") and not arg.startswith("--") and letters & set(arg[1:]):
            hit = f"-{sorted(letters & set(arg[1:]))[0]}"
        if hit is not None:
            return _no(
                f"{posixpath.basename(argv[0])} {hit} reads the names of the files to work on from a list, whose "
                "names Kiwi does not check",
                "name the files on the command line",
            )
    return None


def _destination(name: str, parsed: _Parsed) -> str | None:
    """The folder ``mv`` moves into (its -t value, else its last operand): written into, not moved away."""
    if name != "mv":
        return None
    targets = [v for _, k, v in parsed.values if k == "write"]
    return targets[-1] if targets else (parsed.operands[-1] if parsed.operands else None)
