"""Path globs that mean what they say: ``*`` and ``?`` stay inside one folder, ``**`` crosses folders.

The seeds' ``fnmatch`` sketch lets ``src/*.ts`` match ``src/a/b.ts``; here it does not.
Everything is pure (no I/O), so workflow code can use it.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache


@lru_cache(maxsize=4096)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """Compile a path glob to a regex over normalised relative POSIX paths.

    ``.`` is the project's root folder itself (listing it), not everything below it: that is ``**``.
    """
    if pattern.strip() in (".", "./"):
        return re.compile(r"\.\Z")
    segments: list[str] = []
    for segment in pattern.strip("/").split("/"):
        # "**/**" means the same as "**"; collapsing keeps the regex simple.
        if segment not in ("", ".") and not (segment == "**" and segments[-1:] == ["**"]):
            segments.append(segment)
    segments = segments or ["**"]
    out: list[str] = []
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            # "a/**" also matches "a" itself; "**/x" matches "x" at any depth.
            out.append("(?:/.*)?" if last and index else ("(?:.*/)?" if not last else ".*"))
            continue
        part = ""
        for ch in segment:
            if ch == "*":
                part += "[^/]*"
            elif ch == "?":
                part += "[^/]"
            else:
                part += re.escape(ch)
        out.append(part + ("" if last else "/"))
    regex = "".join(out)
    # Joining "x/" with "(?:/.*)?" would double the slash; normalise it.
    regex = regex.replace("/(?:/.*)?", "(?:/.*)?")
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
    regex, positions = _candidates(key, path.split("/", 1)[0])
    match = regex.match(path) if regex is not None else None
    return key[positions[int(match.lastgroup[1:])]] if match and match.lastgroup else None


def glob_match(pattern: str, path: str) -> bool:
    """True when the normalised relative ``path`` matches ``pattern``."""
    return compile_glob(pattern).match(path) is not None


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


def glob_covered(inner: str, outer: str) -> bool:
    """True when every path ``inner`` matches is also matched by ``outer``.

    Sound (never claims coverage that does not hold) though not complete for exotic
    patterns; a ``False`` only costs a narrower grant, never a wider one.
    """
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
