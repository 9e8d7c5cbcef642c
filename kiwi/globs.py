"""Path globs that mean what they say: ``*`` and ``?`` stay inside one folder, ``**`` crosses folders.

The seeds' ``fnmatch`` sketch lets ``src/*.ts`` match ``src/a/b.ts``; here it does not.
Everything is pure (no I/O), so workflow code can use it.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache

from kiwi.rules import rule_in_force


def _literal(text: str) -> str:
    """Glob text without ``*``: ``?`` is one character of a name, anything else itself."""
    return "".join("[^/]" if ch == "?" else re.escape(ch) for ch in text)


def _segment(segment: str) -> str:
    """One path segment's glob (``*`` and ``?`` inside one name) as a regex that backtracks in one way only.

    ``*A*B*C`` matched by plain ``[^/]*`` tries every placement of A and B (a name of m characters costs
    m**2 tries, and more with more stars). Each middle part is matched where it first occurs, atomically:
    a later placement never matches where the first does not (the next ``*`` takes what lies between).
    """
    parts = segment.split("*")
    if len(parts) == 1:
        return _literal(segment)
    head, *middle, tail = parts
    return (
        _literal(head)
        + "".join(f"(?>[^/]*?{_literal(part)})" for part in middle if part)
        + "[^/]*"
        + _literal(tail)
    )


def glob_segments(pattern: str) -> list[str]:
    """A glob's segments, without empty and ``.`` ones, ``**/**`` as ``**`` (the same, and a simpler regex);
    none at all is ``**``."""
    segments: list[str] = []
    for segment in pattern.strip("/").split("/"):
        if segment not in ("", ".") and not (segment == "**" and segments[-1:] == ["**"]):
            segments.append(segment)
    return segments or ["**"]


@lru_cache(maxsize=4096)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """Compile a path glob to a regex over normalised relative POSIX paths.

    ``.`` is the project's root folder itself (listing it), not everything below it: that is ``**``.

    The regex takes time linear in the path's length (times the pattern's) whatever the path: an agent
    names the paths. ``**/A/**/B`` matched by plain ``(?:.*/)?A/(?:.*/)?B`` tried every pair of places for
    A and B (a path of 4 KB: seconds; of 1 MB: hours). Each run of segments that another ``**`` follows is
    matched where it first occurs, atomically (``(?>...)``): a later place never matches where the first
    does not, since the next ``**`` takes the segments between.
    """
    if pattern.strip() in (".", "./"):
        return re.compile(r"\.\Z")
    segments = glob_segments(pattern)
    if segments == ["**"]:
        return re.compile(r".*\Z", re.DOTALL)
    # Runs of literal-or-wildcard segments, each after a "**" but the first: [head, run, run...].
    runs: list[list[str]] = [[]]
    for segment in segments:
        if segment == "**":
            runs.append([])
        else:
            runs[-1].append(_segment(segment))
    regex = "/".join(runs[0])
    for index, run in enumerate(runs[1:], start=1):
        last = index == len(runs) - 1
        if not run:  # a last "**": "a/**" also matches "a" itself
            regex += "(?:/.*)?" if regex else ".*"
            break
        joined = "/".join(run)
        lead = "/" if regex else ""  # "**/x" matches "x" at any depth, "a/**/x" "a/x" too
        if last:
            regex += f"(?:{lead}.*/|{lead})" + joined if regex else "(?:.*/)?" + joined
        else:
            # Another "**" follows: this run where it first occurs, ending at a segment's end.
            skip = f"(?:{lead}|{lead}.*?/)" if regex else "(?:.*?/)??"  # (fewest segments skipped first)
            regex += f"(?>{skip}{joined}(?=/|\\Z))"
    return re.compile(regex + r"\Z", re.DOTALL)


@lru_cache(maxsize=1024)
def _any_glob(patterns: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(
        "|".join(f"(?P<g{i}>{compile_glob(p).pattern})" for i, p in enumerate(patterns)), re.DOTALL
    )


@lru_cache(maxsize=1024)
def _by_first_segment(patterns: tuple[str, ...]) -> tuple[dict[str, tuple[int, ...]], tuple[int, ...]]:
    """Pattern positions by their first segment when it is literal, and the positions of the others.

    A pattern whose first segment is literal can only match paths that start with that segment, so
    a path is tried against those and the wildcard-led ones only.
    """
    literal: dict[str, list[int]] = {}
    wild: list[int] = []
    for index, pattern in enumerate(patterns):
        segments = [s for s in pattern.strip("/").split("/") if s not in ("", ".")]
        first = segments[0] if segments else "**"
        if "*" in first or "?" in first:
            wild.append(index)
        else:
            literal.setdefault(first, []).append(index)
    return {k: tuple(v) for k, v in literal.items()}, tuple(wild)


@lru_cache(maxsize=8192)
def _candidates(patterns: tuple[str, ...], first: str) -> tuple[re.Pattern[str] | None, tuple[int, ...]]:
    literal, wild = _by_first_segment(patterns)
    positions = tuple(sorted(literal.get(first, ()) + wild))
    return (_any_glob(tuple(patterns[i] for i in positions)) if positions else None), positions


def first_match(patterns: list[str] | tuple[str, ...], path: str) -> str | None:
    """The first of ``patterns`` that matches ``path``, or None.

    One combined regex (cached) of the patterns that can match a path with this first segment.
    """
    if not patterns:
        return None
    key = tuple(patterns)
    first = path.split("/", 1)[0]
    # Cached by a first segment the patterns name, else by "" (the wildcard-led ones only): the path's own
    # first segment is an agent's text, and 8192 cached names of 1 MB each held 8 GB of the worker.
    regex, positions = _candidates(key, first if first in _by_first_segment(key)[0] else "")
    match = regex.match(path) if regex is not None else None
    return key[positions[int(match.lastgroup[1:])]] if match and match.lastgroup else None


def glob_match(pattern: str, path: str) -> bool:
    """True when the normalised relative ``path`` matches ``pattern``."""
    return compile_glob(pattern).match(path) is not None


def glob_reaches_below(pattern: str, folder: str, depth: int | None = None) -> bool:
    """True when ``pattern`` can match a path below the normalised relative ``folder`` (``.``: the root), at
    most ``depth`` segments below it (None: any): a program that reads every file below ``folder`` may read
    one the pattern names. Sound: a ``True`` where no such file can exist only costs a refusal, never a
    read."""
    segments = glob_segments(pattern)
    names = [s for s in folder.strip("/").split("/") if s not in ("", ".")]

    def closure(states: set[int]) -> set[int]:
        # (``**`` also matches no segment at all.)
        out = set(states)
        for i in states:
            while i < len(segments) and segments[i] == "**":
                i += 1
                out.add(i)
        return out

    states = closure({0})
    for name in names:
        after: set[int] = set()
        for i in states:
            if i < len(segments):
                if segments[i] == "**":
                    after.add(i)
                elif re.fullmatch(_segment(segments[i]), name):
                    after.add(i + 1)
        states = closure(after)
        if not states:
            return False
    if depth is None:
        return any(i < len(segments) for i in states)
    for _ in range(depth):
        # One more name below, whatever it is (every segment's glob matches some name).
        states = closure({i if segments[i] == "**" else i + 1 for i in states if i < len(segments)})
        if len(segments) in states:
            return True
    return False


def _segment_covered(inner: str, outer: str) -> bool:
    """Every name ``inner`` matches is matched by ``outer`` (single segment, sound)."""
    if inner == outer or outer == "*":
        return True

    @cache
    def go(i: int, o: int) -> bool:
        if o == len(outer):
            return i == len(inner)
        token = outer[o]
        if token == "*":
            return go(i, o + 1) or (i < len(inner) and go(i + 1, o))
        if i == len(inner):
            return False
        if token == "?":
            return inner[i] != "*" and go(i + 1, o + 1)
        return inner[i] == token and go(i + 1, o + 1)

    return go(0, 0)


# The workflow patch behind which glob_covered reads "." as the root folder alone.
ROOT_ALONE = "kiwi-root-alone-s29"


def _root_alone(pattern: str) -> bool:
    return pattern.strip() in (".", "./")


def glob_covered(inner: str, outer: str) -> bool:
    """True when every path ``inner`` matches is also matched by ``outer``.

    Sound (never claims coverage that does not hold) though not complete for exotic
    patterns; a ``False`` only costs a narrower grant, never a wider one.
    """
    covered = _covered(inner, outer)
    if _root_alone(outer) or _root_alone(inner):
        # "." is the root folder alone (compile_glob), not everything below it, which it was taken for here
        # (review s29: a grant of "." covered "**", so git printed the whole history and `grep -r .` every file
        # to a run that may read only the root's listing). Behind a patch in workflow code: runs from before
        # replay as they ran.
        alone = _root_alone(inner) if _root_alone(outer) else glob_match(outer, ".")
        if alone != covered:
            return alone if rule_in_force(ROOT_ALONE) else covered
    return covered


def _covered(inner: str, outer: str) -> bool:
    a = [s for s in inner.strip("/").split("/") if s not in ("", ".")] or ["**"]
    b = [s for s in outer.strip("/").split("/") if s not in ("", ".")] or ["**"]

    @cache
    def go(i: int, j: int) -> bool:
        if j == len(b):
            return i == len(a)
        if b[j] == "**":
            if j == len(b) - 1 and j > 0:
                # "x/**" covers "x" itself and everything below it.
                return True
            return go(i, j + 1) or (i < len(a) and go(i + 1, j))
        if i == len(a) or a[i] == "**":
            return False
        return _segment_covered(a[i], b[j]) and go(i + 1, j + 1)

    return go(0, 0)
