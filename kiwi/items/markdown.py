"""Finding a directive's XML block in its Markdown file, as a Markdown viewer shows the file: one top-level fenced
```xml block, and nothing a rendered view could hide or show as something else (HTML, lookalike decoys)."""

from __future__ import annotations

import re
from typing import Any

from kiwi.errors import ItemInvalid, Problem


def find_xml_block(text: str, path: str = "") -> tuple[str, int]:
    """Return the ``<directive>`` XML block and the file line its first line is on.

    The file is read as a Markdown viewer shows it (CommonMark, markdown-it-py): the directive is the one fenced
    block whose info string's first word is ``xml``. A ``<directive>`` anywhere a viewer hides or shows as
    something else is an error: in an HTML block (a comment, ``<script>``, ``<details>``), an indented code block,
    another fence, or a fence nested in a quote or list (hostile reviews s36: a block granting ``write **`` hid
    in a comment, then in ``<script>``, beside a visible one granting ``read notes/**``; the human signed what
    they never saw). So is HTML other than a comment anywhere in the file, which a viewer may use to fold away,
    hide or restyle the directive's block (``text <details>`` in a paragraph, ``<div hidden>``, ``<style>``,
    ``<template>``: review s37), and a block that only looks like a directive (``‹dіrective>``, with a Cyrillic
    і: a decoy showing other grants than the block that runs)."""
    from markdown_it import MarkdownIt  # (20 ms to import: only where a directive file is read)

    blocks: list[tuple[int, int, str]] = []
    tokens = MarkdownIt("commonmark").parse(text)
    for token in tokens:
        first, last = token.map or (0, 0)
        if token.type not in ("fence", "code_block", "html_block") or "<directive" not in token.content:
            if html := _html_other_than_comments(token):
                raise ItemInvalid([_problem_at(path, first + 1, _HTML_REFUSED.format(html=html))])
            if token.type in ("fence", "code_block") and _looks_like_directive(token.content):
                raise ItemInvalid(
                    [
                        _problem_at(
                            path,
                            first + 1,
                            f"a block that looks like a <directive> but is not one (lines {first + 1}-{last}: its "
                            "name is written with characters that only look like those of <directive>): a decoy "
                            "beside the block that runs; remove it",
                        )
                    ]
                )
            continue  # (prose that names <directive> is text: only a block can be taken for the directive)
        language = (token.info.split() or [""])[0].lower()
        if token.type == "fence" and language == "xml" and token.level == 0:
            blocks.append((first + 1, last, token.content.removesuffix("\n")))
            continue
        where = {
            "html_block": "an HTML block, which a rendered view of the file hides or shows as HTML",
            "code_block": "an indented code block, which a viewer shows as code and Kiwi does not read",
        }.get(token.type, f"a {'nested ' if token.level else ''}block Kiwi does not read")
        raise ItemInvalid(
            [
                _problem_at(
                    path,
                    first + 1,
                    f"a <directive> inside {where} (lines {first + 1}-{last}): what a human reviews must be what "
                    "runs, so the file holds its <directive> in one top-level ```xml block only: remove this one",
                )
            ]
        )
    if not blocks:
        raise ItemInvalid(
            [
                Problem(
                    "no ```xml block with a <directive> element found; a directive is Markdown with one "
                    'fenced ```xml block holding <directive name="..." version="...">',
                    path,
                    1,
                    1,
                )
            ]
        )
    if len(blocks) > 1:
        raise ItemInvalid(
            [
                Problem(
                    f"{len(blocks)} ```xml blocks hold a <directive>; a directive file has exactly one "
                    f"(the second starts on line {blocks[1][0]})",
                    path,
                    blocks[1][0],
                    1,
                )
            ]
        )
    start, _, content = blocks[0]
    return content, start


# A comment as a browser reads it (HTML5): `<!--` not followed by `>` or `->` (which end it at once), up to the
# first `-->` or `--!>`. (Review s37, third round: `<!-->`, `<!--->` and `--!>` end a comment earlier than a
# `<!--.*?-->` match does, so `<!--> <details> -->` opened a folded section the rule took for a comment.)
_HTML_COMMENT = re.compile(r"<!--(?!>|->).*?--!?>", re.S)
_HTML_REFUSED = (
    "HTML in a directive file ({html}): a rendered view of the file can fold away, hide or restyle the directive's "
    "block with it, so a human would not review what runs; write it as Markdown (an HTML comment is fine)"
)


def _html_other_than_comments(token: Any) -> str:
    """The first raw HTML of ``token`` (an HTML block, or inline HTML in its text) that is not a comment: "" if
    none. A viewer passes it through to the page, where ``<details>`` folds what follows, ``hidden`` hides it."""
    parts = [token.content] if token.type == "html_block" else []
    parts += [child.content for child in token.children or [] if child.type == "html_inline"]
    for part in parts:
        if rest := _HTML_COMMENT.sub("", part).strip():
            return " ".join(rest.split())[:60]
    return ""


# Letters that look like those of "directive" (Cyrillic, Greek, Latin small capitals and dotless i); what NFKC
# folds (fullwidth ｄ, the roman numeral ⅾ, ＜) it folds first.
_LOOKALIKES = str.maketrans(
    {
        "\u0501": "d", "\u0456": "i", "\u0131": "i", "\u026a": "i", "\u03b9": "i", "\u0433": "r", "\u0280": "r",
        "\u0435": "e", "\u03b5": "e", "\u0441": "c", "\u03f2": "c", "\u0442": "t", "\u03c4": "t", "\u0475": "v",
        "\u03bd": "v", "\u1d20": "v", "\u2039": "<", "\u3008": "<", "\u276c": "<", "\u0269": "i", "\uabaf": "c",
        "\u2c85": "r", "\u04bd": "e", "\u02c2": "<", "\u27e8": "<", "\u0399": "i",
    }
)  # fmt: skip


def _looks_like_directive(content: str) -> bool:
    """Whether ``content`` holds a ``<directive`` written with lookalike or invisible characters: marks and format
    characters dropped (a combining grapheme joiner, variation selectors: review s37, third round), fillers too,
    and each other letter read as the Latin one its Unicode name ends in (``LATIN LETTER SMALL CAPITAL C``,
    ``CYRILLIC SMALL LETTER BYELORUSSIAN-UKRAINIAN I``) or the table gives."""
    import unicodedata

    folded = []
    for char in unicodedata.normalize("NFKD", content):
        if unicodedata.category(char) in ("Mn", "Me", "Cf") or "FILLER" in unicodedata.name(char, ""):
            continue
        if char.isascii():
            folded.append(char)
            continue
        name = unicodedata.name(char, "")
        last = name.rsplit(" ", 1)[-1]
        if (
            "LESS-THAN" in name
            or "LEFT-POINTING ANGLE" in name
            or "LEFT ANGLE" in name
            or "LEFT ARROWHEAD" in name
        ):
            folded.append("<")
        elif len(last) == 1 and "LETTER" in name:
            folded.append(last)
        else:
            folded.append(char.translate(_LOOKALIKES))
    text = "".join(folded).lower()
    return "<directive" not in content and re.search(r"<\s*directive\b", text) is not None


def _problem_at(path: str, line: int, message: str) -> Problem:
    return Problem(message, path, line, 1)
