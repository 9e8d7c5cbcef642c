"""Path globs that mean what they say: ``*`` and ``?`` stay inside one folder, ``**`` crosses folders.

The seeds' ``fnmatch`` sketch lets ``src/*.ts`` match ``src/a/b.ts``; here it does not.
Everything is pure (no I/O), so workflow code can use it.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache


@lru_cache(maxsize=4096)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """Compile a path glob to a regex over normalised relative POSIX paths."""
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
    return re.compile("|".join(f"(?P<g{i}>{compile_glob(p).pattern})" for i, p in enumerate(patterns)), re.DOTALL)


def first_match(patterns: list[str] | tuple[str, ...], path: str) -> str | None:
    """The first of ``patterns`` that matches ``path`` (one combined regex, cached), or None."""
    if not patterns:
        return None
    key = tuple(patterns)
    match = _any_glob(key).match(path)
    return key[int(match.lastgroup[1:])] if match and match.lastgroup else None


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
