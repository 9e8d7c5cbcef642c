"""Protected paths: places no grant reaches unless it names them.

``.git`` (at any depth: a nested ``.git`` file or folder points git at a config of its own),
Kiwi's configuration, audit trail, cache, the code of local tools and the tools agents proposed,
``temporal-dev.yml`` at any depth
(``kiwi dev`` and the other commands read the one of the folder they start in: the address its server
listens on, its database), and a ``.ai`` folder below the root (a command run below it would take that
folder for its project's). A file written there
would change what a later tool executes (``.git/config``'s ``core.fsmonitor``, a hook, a
tool's ``main.py``) or what the harness allows, so ``write **`` does not reach them; a grant
whose literal part names the place does (``write .ai/tools/**``, ``read .git/**``).

Pure (no I/O): the workflow and the activities use the same rule.
"""

from __future__ import annotations

from kiwi.globs import first_match
from kiwi.rules import rule_in_force as rule_in_force  # (its home is kiwi.rules; imported from here too)
from kiwi.rules import rules_assumed as rules_assumed

# Project-relative folders, as POSIX paths. ".git" is matched as a segment anywhere.
PROTECTED_ROOTS = (".ai/config", ".ai/logs", ".ai/tools", ".ai/scripts", ".ai/.cache", ".kiwi")
GIT_DIR = ".git"
# Protected in workflow code behind DEV_CONFIG_PROTECTED (see protected_root).
DIRECTIVES = ".ai/directives"
# Tools an agent proposed, waiting for a human (kiwi.items.proposals): rewritten after the human read them,
# `kiwi tools accept` installed the new code. Protected in workflow code behind PROPOSALS_PROTECTED.
PROPOSALS = ".ai/proposals"
PROPOSALS_PROTECTED = "kiwi-proposals-protected"
# kiwi dev's settings file, at the project's root (kiwi.devserver.load_dev_config).
DEV_CONFIG = "temporal-dev.yml"
# Workflow code protects it (and nested .ai folders) behind this patch: runs that wrote them before replay as
# they ran.
DEV_CONFIG_PROTECTED = "kiwi-dev-config-protected"


def fold(segment: str) -> str:
    """A name as a case-insensitive filesystem (macOS, Windows) may see it: ``.GIT``, ``.git.`` and ``.git ``
    are ``.git`` there, so they are protected everywhere."""
    return segment.casefold().rstrip(" .") or segment


def fold_path(rel: str) -> str:
    """A project-relative path folded segment by segment (see :func:`fold`)."""
    return "/".join(fold(segment) for segment in rel.split("/"))


# The protected places at the project's root a command's folder can hold, and those below `.ai`.
ROOT_PLACES = (GIT_DIR, ".ai", ".kiwi", DEV_CONFIG)
AI_PLACES = tuple(p for p in (*PROTECTED_ROOTS, DIRECTIVES, PROPOSALS) if p.startswith(".ai/"))


_ROOT_PARTS = tuple([fold(p) for p in root.split("/")] for root in PROTECTED_ROOTS)
_ROOT_DEPTH = max(len(parts) for parts in _ROOT_PARTS)


def protected_root(rel: str) -> str | None:
    """The protected place ``rel`` (a normalised project-relative path) is in, or None.

    Every path an agent names goes through here (a shell command's too), in workflow code: only a path
    whose folded text holds ".git" has its every segment folded (a segment folds to ".git" only then)."""
    segments = [s for s in rel.split("/") if s not in ("", ".")]
    if GIT_DIR in rel.casefold():
        for index, segment in enumerate(segments):
            if fold(segment) == GIT_DIR:
                return "/".join(segments[: index + 1])
    folded = [fold(s) for s in segments[:_ROOT_DEPTH]]
    for parts in _ROOT_PARTS:
        if folded[: len(parts)] == parts:
            return "/".join(segments[: len(parts)])
    if folded[:2] == [".ai", "directives"] and rule_in_force(DEV_CONFIG_PROTECTED):
        # Directives carry grants by their signature: an older signed version written back (a file write, git
        # restore) had the grants a human had removed since. Agents write them through execute(directive,
        # update), which drops a signature line.
        return "/".join(segments[:2])
    if folded[:2] == [".ai", "proposals"] and rule_in_force(PROPOSALS_PROTECTED):
        return "/".join(segments[:2])
    text = rel.casefold()
    if DEV_CONFIG in text or ".ai" in text:
        # temporal-dev.yml anywhere (a command run from a sub-folder reads the one there), and a .ai folder
        # below the root (a command run below it takes that folder for the project: its trusted keys, its
        # harness). Behind DEV_CONFIG_PROTECTED in workflow code.
        for index, segment in enumerate(segments):
            name = fold(segment)
            if (name == DEV_CONFIG or (name == ".ai" and index > 0)) and rule_in_force(DEV_CONFIG_PROTECTED):
                return "/".join(segments[: index + 1])
    return None


def _literal_segments(pattern: str) -> list[str]:
    literal = []
    for segment in pattern.strip("/").split("/"):
        if segment in ("", "."):
            continue
        if "*" in segment or "?" in segment:
            break
        literal.append(segment)
    return literal


def names(pattern: str, root: str) -> bool:
    """Whether the grant ``pattern`` names the protected place ``root`` in its literal part."""
    parts = [fold(p) for p in root.split("/")]
    return [fold(s) for s in _literal_segments(pattern)[: len(parts)]] == parts


def named_place(pattern: str) -> str | None:
    """The protected place the grant ``pattern`` names in its literal part (``.git/config``: ``.git``;
    ``.ai/tools/**``: ``.ai/tools``), or None. Every place counts as protected here, whatever rule a run has met:
    this answers which grants may stand in for others (see :func:`reaches`), where stricter is safe."""
    literal = "/".join(_literal_segments(pattern))
    if not literal:
        return None
    with rules_assumed():
        root = protected_root(literal)
    return root if root is not None and names(pattern, root) else None


def reaches(narrow: str, wide: str, covered: bool) -> bool:
    """Whether the grant ``wide`` reaches everything the grant ``narrow`` does: its globs cover it (``covered``,
    :func:`kiwi.globs.glob_covered`) and it names the protected place ``narrow`` names, if any. ``**`` covers
    ``.git/config`` as globs, and reaches none of it (review s34: an unsigned directive's ``.git/config`` was
    kept by the base policy's ``read **``, and the run read the token in it)."""
    if not covered:
        return False
    place = named_place(narrow)
    return place is None or names(wide, place)


def granted(patterns: list[str] | tuple[str, ...], rel: str) -> str | None:
    """The first grant that covers ``rel``, protected places included; None if none does."""
    match = first_match(patterns, rel)
    if match is None:
        return None
    root = protected_root(rel)
    if root is None or names(match, root):
        return match
    return first_match([p for p in patterns if names(p, root)], rel)
