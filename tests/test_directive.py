"""Directive parsing and validation: compat files, the seeds' forms, bad input with file:line:col."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiwi.errors import ItemInvalid
from kiwi.items.directive import parse_directive, parse_directive_lenient
from kiwi.signing import content_hash, sign, verify
from tests.helpers import COMPAT, directive_md

WRITE_STEP = """
    <step name="write">
      <tool_call tool="filesystem.write">
        <param name="path">out/{target}.txt</param>
        <param name="content">hello {who}</param>
      </tool_call>
    </step>"""
PERMS = '<write resource="filesystem" path="out/**" />'
INPUTS = (
    '<input name="target" type="string" required="true"/>\n<input name="who" type="string" default="world"/>'
)


def errors(text: str, path: str = "d.md") -> list[str]:
    _, problems = parse_directive_lenient(text, path)
    return [str(p) for p in problems if p.severity == "error"]


def test_real_signed_compat_directive_loads_with_its_steps_and_grants():
    text = (COMPAT / "directives" / "agent.AGENTS.md").read_text()
    directive, warnings = parse_directive(text, "agent.AGENTS.md")
    assert (directive.name, directive.version) == ("agent", "1.1.0")
    assert directive.metadata.model.tier == "orchestrator" and directive.metadata.model.fallback == "general"
    assert [s.name for s in directive.steps][:3] == ["understand_task", "search_directives", "load_directive"]
    legacy = directive.steps[1].tool_calls[0]
    assert legacy.tool == "kiwi-mcp.search" and legacy.params["source"] == "all"
    assert directive.metadata.deviation_rules["ask_first"] == "true"
    assert directive.metadata.relationships["extends"] == ["core/orchestrator"]
    grants = directive.grants()
    assert grants.kiwi_actions == ["search", "load", "execute", "help"] and grants.shell == ["*"]
    assert all(p.mode == "agent" for p in directive.plan())
    assert verify(text).legacy is True


def test_seed_forms_tool_calls_mcps_and_plan():
    body = (
        WRITE_STEP
        + """
    <step name="list" condition="inputs.target != 'skip'">
      <tool_calls>
        <call mcp="fs" tool="list_directory"><param name="path">{steps.write.outputs.path}</param></call>
      </tool_calls>
    </step>
    <step name="think"><action>Look at {target} and decide.</action></step>"""
    )
    text = directive_md(
        body,
        permissions=PERMS + '\n<execute resource="mcp" name="fs" actions="list_directory"/>',
        inputs=INPUTS,
        tools='<mcps><mcp name="fs" required="true"><tools><tool>list_directory</tool></tools></mcp></mcps>',
    )
    directive, _ = parse_directive(text, "d.md")
    assert directive.steps[1].tool_calls[0].tool == "fs.list_directory"
    assert directive.metadata.tools.mcps[0].required is True
    plan = {p.step: p.mode for p in directive.plan()}
    assert plan == {"write": "auto", "list": "auto", "think": "agent"}
    assert directive.input_spec("who").default == "world"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda t: t.replace('<step name="write">', "<step>"),
            "d.md:{line}:{col}: <step> needs a name attribute",
        ),
        (lambda t: t.replace('name="demo"', 'name="Demo-X"'), "must be snake_case"),
        (lambda t: t.replace('version="1.0.0"', 'version="1.0"'), "is not semver"),
        (lambda t: t.replace('tier="fast"', 'tier="galaxy"'), "is not a known tier"),
        (lambda t: t.replace('type="string" required', 'type="strng" required'), 'has type "strng"'),
        (lambda t: t.replace("{who}", "{nobody}"), "{{nobody}} is not a declared input"),
        (
            lambda t: t.replace("</process>", '<step name="write"><action>x</action></step></process>'),
            'step name "write" is used twice',
        ),
        (lambda t: t.replace(PERMS, ""), "does not grant"),
    ],
)
def test_validation_errors_name_the_problem_and_place(mutate, expected):
    text = mutate(
        directive_md(
            WRITE_STEP,
            permissions=PERMS,
            inputs=INPUTS,
            tools='<tools><tool name="filesystem.write"/></tools>',
        )
    )
    lines = text.splitlines()
    line = next((i for i, ln in enumerate(lines, 1) if "<step>" in ln), 0)
    col = lines[line - 1].index("<step>") + 1 if line else 0
    found = errors(text)
    assert any(expected.format(line=line, col=col) in e for e in found), found


def test_unknown_elements_are_kept_as_warnings():
    text = directive_md(
        WRITE_STEP, permissions=PERMS, inputs=INPUTS, extra_meta="<future_thing a='1'>x</future_thing>"
    )
    directive, problems = parse_directive(text, "d.md")
    assert "future_thing" in directive.metadata.extra
    assert [p.severity for p in problems] == ["warning"] and "future_thing" in problems[0].message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("# no block here\n", "no ```xml block"),
        (directive_md("") + "\n" + directive_md(""), "2 ```xml blocks hold a <directive>"),
        ("```xml\n<directive name='a' version='1.0.0'><metadata></directive>\n```\n", "malformed XML"),
        (
            "```xml\n<!DOCTYPE d [<!ENTITY a 'aaaa'><!ENTITY b '&a;&a;&a;&a;'>]>\n<directive name='x' version='1.0.0'>"
            "<metadata><description>&b;</description></metadata></directive>\n```\n",
            "DTDs and entity declarations",
        ),
        (
            "```xml\n<!DOCTYPE d [<!ENTITY x SYSTEM 'file:///etc/passwd'>]><directive name='x' version='1.0.0'>&x;"
            "</directive>\n```\n",
            "not allowed",
        ),
        ("```xml\n<process name='x'/>\n```\n<directive", "no ```xml block"),
        ("```xml\n<plan><directive name='a' version='1.0.0'/></plan>\n```\n", "root element is <plan>"),
        ("a\x00b", "NUL bytes"),
    ],
)
def test_bad_files_give_clear_errors_without_tracebacks(text, expected):
    with pytest.raises(ItemInvalid) as info:
        parse_directive(text, "bad.md")
    assert expected in str(info.value)
    assert "bad.md" in str(info.value)


def test_malformed_xml_error_points_at_the_file_line():
    text = "# t\n\n```xml\n<directive name='a' version='1.0.0'>\n  <metadata>\n</directive>\n```\n"
    with pytest.raises(ItemInvalid) as info:
        parse_directive(text, "m.md")
    assert str(info.value).startswith("m.md:6:"), str(info.value)


def test_a_50_mb_file_is_refused_quickly():
    text = directive_md(WRITE_STEP, permissions=PERMS, inputs=INPUTS) + ("x" * 50_000_000)
    with pytest.raises(ItemInvalid, match="larger than"):
        parse_directive(text, "big.md")


def test_sign_then_verify_and_detect_modification():
    from kiwi.cli.keys import ensure_key
    from kiwi.items.store import user_space
    from kiwi.keys import load_trusted
    from kiwi.signing import check_trust

    text = directive_md(WRITE_STEP, permissions=PERMS, inputs=INPUTS)
    signer = ensure_key()[0]
    signed = sign(text, signer=signer, kind="directive")
    assert signed.splitlines()[0].startswith("<!-- kiwi:signed:")
    trusted = load_trusted(Path("."), user_space()).with_role("sign")
    status = check_trust(verify(signed), trusted, "directive")
    assert (status.state, status.signer, status.trusted) == ("valid", signer, True)
    assert content_hash(signed) == content_hash(text)
    modified = check_trust(verify(signed.replace("hello", "goodbye")), trusted, "directive")
    assert (modified.state, modified.trusted) == ("modified", False)
    parse_directive(signed, "signed.md")


def test_a_signature_is_only_trusted_from_a_trusted_key_and_cannot_be_forged_by_hashing():
    """An agent can compute a SHA-256 and even make a key of its own; neither makes it a trusted signer."""
    import hashlib

    from kiwi.cli.keys import ensure_key
    from kiwi.items.store import user_space
    from kiwi.keys import create_key, load_trusted
    from kiwi.signing import check_trust

    ensure_key()
    trusted = load_trusted(Path("."), user_space()).with_role("sign")
    body = directive_md(WRITE_STEP, permissions=PERMS, inputs=INPUTS)
    digest = hashlib.sha256(body.encode()).hexdigest()
    hashed_only = f"<!-- kiwi:signed:2026-11-22T00:00:00Z:{digest} -->\n{body}"
    assert check_trust(verify(hashed_only), trusted, "directive").trusted is False
    create_key("mallory")  # a key of its own, never added to trusted_keys.yaml
    by_mallory = sign(body, signer="mallory", kind="directive")
    assert check_trust(verify(by_mallory), trusted, "directive").trusted is False
    # Claiming a trusted name with mallory's signature does not verify either.
    owner = next(iter(trusted))
    forged = by_mallory.replace(":mallory:", f":{owner}:", 1)
    assert check_trust(verify(forged), trusted, "directive").trusted is False


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.text(max_size=400))
def test_parser_never_crashes_on_arbitrary_text(junk):
    for text in (
        junk,
        f"```xml\n{junk}\n```\n",
        f"```xml\n<directive name='a' version='1.0.0'>{junk}</directive>\n```",
    ):
        try:
            parse_directive(text, "fuzz.md")
        except ItemInvalid as exc:
            assert exc.problems and all(p.path == "fuzz.md" for p in exc.problems)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True), min_size=1, max_size=6, unique=True))
def test_generated_directives_round_trip_their_steps(names):
    body = "\n".join(f'<step name="{n}"><action>do {n}</action></step>' for n in names)
    directive, _ = parse_directive(directive_md(body), "gen.md")
    assert [s.name for s in directive.steps] == names


def test_a_malformed_xml_error_counts_every_line_it_names_in_the_file():
    # A new-user trial: "broken.md:17:13: ... Opening and ending tag mismatch: action line 13 and step", the
    # first number the file's line, the second the line inside the ```xml block.
    text = "# A directive\n\nSome prose.\n\n```xml\n<directive name='a' version='1.0.0'>\n<process>\n<step name='s'>\n<action>Do it.</step>\n</process>\n</directive>\n```\n"
    _, problems = parse_directive_lenient(text, "broken.md")
    (problem,) = problems
    action = text.splitlines().index("<action>Do it.</step>") + 1
    assert problem.line == action and f"action line {action} and step" in problem.message, problem


def test_a_directive_without_a_version_has_its_other_problems_named_in_the_same_pass():
    # A new-user trial: the missing version was reported, the bad name and the doubled step only after it
    # was fixed (the rest was not checked without a version).
    text = directive_md('<step name="a"><action>x</action></step><step name="a"><action>y</action></step>')
    text = text.replace('name="demo" version="1.0.0"', 'name="Bad-Name"')
    directive, problems = parse_directive_lenient(text, "d.md")
    said = " | ".join(p.message for p in problems)
    assert directive is None
    assert "needs a version attribute" in said and '"Bad-Name" must be snake_case' in said, said
    assert 'step name "a" is used twice' in said, said


def test_an_actions_placeholders_that_have_values_are_filled_beside_one_that_has_none():
    """README trial s36: one misspelt `{steps.sortd.outputs.result.stdout}` in an <action> left every placeholder
    unfilled, `{top}` too: the agent read neither. Each is filled where it has a value."""
    from workflows.directive_run.view import render_safe

    context = {
        "inputs": {"top": 3, "name": "Ada"},
        "steps": {"sorted": {"outputs": {"result": {"n": [1, 2]}}}},
    }
    assert (
        render_safe("See {steps.sortd.outputs.result.stdout}, write the first {top} for {name}", context)
        == "See {steps.sortd.outputs.result.stdout}, write the first 3 for Ada"
    )
    assert render_safe("{top}", context) == "3"
    assert render_safe("n: {sorted.result.n}", context) == "n: [1, 2]"


def test_a_placeholder_that_names_nothing_is_pointed_at_by_its_param():
    """README trial s36: `{fille} is not a declared input` named a line and no column."""
    text = directive_md(WRITE_STEP, permissions=PERMS, inputs=INPUTS).replace("{who}", "{nobody}")
    (line, where) = next((n, ln) for n, ln in enumerate(text.splitlines(), 1) if "{nobody}" in ln)
    column = where.rfind("<param", 0, where.index("{nobody}")) + 1
    found = errors(text)
    assert any(
        e.startswith(f"d.md:{line}:{column}: ") and "{nobody} is not a declared input" in e for e in found
    ), (
        found,
        line,
        column,
    )
