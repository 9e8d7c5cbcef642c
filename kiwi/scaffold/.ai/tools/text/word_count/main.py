"""Count words and lines: Kiwi calls main(**parameters) and returns its JSON-able result."""


def main(text: str) -> dict:
    return {"words": len(text.split()), "lines": len(text.splitlines()) or 1}
