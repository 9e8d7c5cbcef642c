"""Programs that run other programs (refused whatever the grant), programs refused by the worker,
and the names programs make from their arguments (decompressors, split)."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence

from kiwi.protected import AI_PLACES, ROOT_PLACES, fold, protected_root
from kiwi.protected import granted as protected_granted
from kiwi.shellpolicy.paths import lexical_path
from kiwi.shellpolicy.results import _LOCAL_HINT, ShellVerdict, _no
from kiwi.shellpolicy.specs import SPECS

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
