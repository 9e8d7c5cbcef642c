"""The rules shell checks came to over the sessions, each a patch id asked with ``rule_in_force``.

Workflow code answers by a rule only in runs that meet it (a marker in their history); runs from before
replay as they ran. The worker checks by every rule always."""

from __future__ import annotations

# Since session 29 (a hostile review): a folder a command reads or writes whole (grep -r, cp -r, rm -r) needs a
# grant that covers everything below it, not one that names the folder alone (`.`, `src`, `*`: `grep -r KEY .`
# printed every file to a run that may read only the root's listing). Asked only where it changes the answer.
TREE_GRANTED = "kiwi-tree-granted-s29"


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


# Since session 24 (the second review of the folder rules): options whose value GNU takes only as
# --opt=VALUE (the next word is an operand: `grep --color KEY ../../outside/f` read outside the project),
# `rg --hostname-bin` (it runs the program it names) and `file -C` (it writes a compiled magic file in the
# cwd), `\` in a path (a separator to Kiwi, part of a name here), and `ln -s` targets with -r (named from
# the cwd) and -t DIR (read from DIR). Workflow code answers by these rules behind this patch, asked only
# where they change the answer; the worker checks by them always.
SHELL_OPTIONS = "kiwi-shell-options"


# Since session 30: a command's cwd needs a read grant only where the program reads it (`ls`, `grep -r KEY`,
# `find` given no path; rg, git and programs Kiwi does not model always): under `read src/**`, `cat src/a.py` run
# from the root was refused. Workflow code answers so behind this patch, asked only where it changes the answer.
CWD_UNREAD = "kiwi-cwd-unread-s30"
# Workflow code refuses such folder reads (and whole-folder moves and deletes, _CHANGES_FOLDERS) behind this
# patch, asked only where it changes the answer (a marker only in runs that meet it), for denials whose first
# segment names a place (`secrets/**`); the worker checks every denial on disk (activities/diskchecks.py), so
# `**/.env` refuses a folder only where one is below it. The worker refuses them whatever the run decided.
DENY_INSIDE = "kiwi-deny-inside"
# Since session 30: find given starting points reads them, not its cwd (`find src` was refused where a denial
# reached below the cwd). Workflow code answers so behind this patch, asked only where it changes the answer.
FIND_STARTS = "kiwi-find-starts-s30"
LIST_FILES = "kiwi-list-files"

# Since session 36 (README trial): a number-like word that is one of the program's own options (`ls -1`) is that
# option, and head's or tail's `-NUM` is `-n NUM`; both were read as paths (`read not allowed on '-1'`). Workflow
# code answers so behind this patch, asked only for such a word; the worker reads them so always.
NUMBER_OPTIONS = "kiwi-number-options-s36"

# Since session 38: `git commit` with no path commits the whole index, what a human staged included: refused, naming
# `git commit -m MSG -- PATH` (each path checked as a write). Workflow code answers by this rule behind this patch, asked only
# for a git commit naming no path.
GIT_COMMIT_INDEX = "kiwi-git-commit-index-s38"

# Since session 38 (README trial): a program Kiwi does not model runs only in a cwd the run may read whole (it
# reads any file there by a bare name, which no check of its words sees; under `read .`, jq printed a root .env).
# Workflow code answers by this rule behind this patch, asked only for such a program in a cwd granted in part.
CWD_WHOLE = "kiwi-cwd-whole-s38"
