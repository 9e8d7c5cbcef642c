"""Reading a program's options as the program reads them (GNU getopt: abbreviations, clusters,
``--opt=VALUE``), against its spec."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kiwi.protected import rule_in_force
from kiwi.shellpolicy.results import ShellVerdict, _no
from kiwi.shellpolicy.rules import NUMBER_OPTIONS
from kiwi.shellpolicy.specs import Spec


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
        if (
            _is_number(arg)
            and (program in _COUNT_FIRST or (names is not None and arg in names))
            and rule_in_force(NUMBER_OPTIONS)
        ):
            if program in _COUNT_FIRST:
                # (head -5, tail -5: GNU's older spelling of -n 5.)
                out.options.append("-n")
                out.values.append(("-n", spec.values.get("-n", "value"), arg[1:]))
                continue
            out.options.append(arg)  # (ls -1: one of its own options)
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


# Programs whose `-NUM` is a count, `-n NUM` (GNU's older spelling).
_COUNT_FIRST = frozenset({"head", "tail"})


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


def _options_for(
    program: str, options_granted: Mapping[str, Iterable[str]] | Iterable[str] | None
) -> set[str]:
    if not options_granted:
        return set()
    if isinstance(options_granted, Mapping):
        return {*options_granted.get(program, ()), *options_granted.get("*", ())}
    return set(options_granted)
