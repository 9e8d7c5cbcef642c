"""Each program Kiwi models: its options (with and without a value, refused, needing the grant's
``options``), what its operands are (read, written, text) and how it treats links."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field


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
