"""``kiwi keys``: the human identities that sign items and approve calls."""

from __future__ import annotations

import argparse
import getpass
import json
import re
import sys

from kiwi.errors import InputInvalid
from kiwi.items.store import find_project_root, user_space
from kiwi.keys import create_key, keys_dir, load_trusted, own_keys, trust_key, trusted_paths


def default_name() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", getpass.getuser())[:64] or "me"


def ensure_key() -> tuple[str, str]:
    """The user's signing key, created (and trusted for signing and approving) when there is none.

    Returns ``(name, what was done)``; used by ``kiwi init`` so a new project's example runs.
    """
    signers = load_trusted(find_project_root(), user_space()).with_role("sign")
    names = [n for n in own_keys() if n in signers]
    if len(names) > 1:
        # (Trial F23: one of several was taken without a word.)
        return names[0], (
            f"you have {len(names)} signing keys ({', '.join(names)}); '{names[0]}' signs here (another: "
            "`kiwi sign --key NAME .ai/directives`)"
        )
    if names:
        return names[0], ""
    name = default_name()
    while name in own_keys():
        name += "-signer"
    path, public = create_key(name)
    trusted = trust_key(user_space(), name, public, ["sign", "approve"])
    return name, f"created your key '{name}' ({path}) and trusted it in {trusted}"


ROLES = ("sign", "approve")


def _roles(text: str | None) -> list[str]:
    """``--roles``: comma-separated, spaces around the commas ignored; both when not given."""
    if text is None:
        return list(ROLES)
    roles = [r.strip() for r in text.split(",") if r.strip()]
    unknown = [r for r in roles if r not in ROLES]
    if unknown or not roles:
        raise InputInvalid(
            f"--roles {text!r}: " + (f"unknown role '{unknown[0]}'" if unknown else "no role named"),
            hint="roles are sign and approve: --roles sign, --roles approve or --roles sign,approve",
        )
    return list(dict.fromkeys(roles))


def cmd_keys(args: argparse.Namespace) -> int:
    if args.keys_command == "init":
        name = args.name or default_name()
        roles = _roles(args.roles)  # (checked before anything is written: a bad value left a key behind)
        path, public = create_key(name)
        trusted = trust_key(user_space(), name, public, roles)  # type: ignore[arg-type]
        if getattr(args, "json", False):
            data = {"name": name, "path": str(path), "roles": roles, "trusted_in": str(trusted)}
            print(json.dumps({**data, "public_key": public}, indent=2))
            return 0
        print(f"created key '{name}': {path} (private: keep it to yourself; mode 0600)")
        print(f"trusted it for {', '.join(roles)} in {trusted}")
        print(f"public key: {public}")
        return 0
    root = find_project_root()
    trusted = load_trusted(root, user_space())
    # Where the trust comes from (README trial s34: sign's warning sent the user here, and the list did not
    # say which file to edit).
    files = [str(f) for f in trusted_paths(root, user_space()) if f.is_file()]
    rows = [
        {"name": name, "roles": key.roles, "public_key": key.public_key, "yours": name in own_keys()}
        for name, key in sorted(trusted.keys.items())
    ]
    mine = [n for n in own_keys() if n not in trusted.keys]
    if args.json:
        print(
            json.dumps(
                {
                    "trusted": rows,
                    "untrusted_own_keys": mine,
                    "keys_dir": str(keys_dir()),
                    "trusted_in": files,
                },
                indent=2,
            )
        )
        return 0
    if not rows:
        print("no trusted keys; create yours with `kiwi keys init`", file=sys.stderr)
    for row in rows:
        print(
            f"{row['name']:<20} {','.join(row['roles']):<14} {'yours ' if row['yours'] else ''}{row['public_key']}"
        )
    for name in mine:
        print(f"{name:<20} (your key, not trusted here: add it to trusted_keys.yaml)")
    user_file = trusted_paths(root, user_space())[0]
    print(f"trusted in: {', '.join(files) or f'no trusted_keys.yaml yet (yours would be {user_file})'}")
    print(f"your private keys: {keys_dir()}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "keys",
        help="your signing/approving keys and the keys Kiwi trusts",
        description="Ed25519 keys of the humans who sign items (so a directive's grants take "
        "effect) and approve calls. Private keys live in $KIWI_KEYS_DIR (default "
        "~/.config/kiwi/keys), out of reach of every tool Kiwi runs; trusted public "
        "keys are listed in trusted_keys.yaml (~/.ai/config, .ai/config).",
    )
    keys_sub = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    q = keys_sub.add_parser("init", help="create a key and trust it in ~/.ai/config/trusted_keys.yaml")
    q.add_argument(
        "--name", help="the key's name, shown as the signer and approver (default: your user name)"
    )
    q.add_argument("--roles", help="comma-separated: sign, approve (default: both)")
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(func=cmd_keys)
    q = keys_sub.add_parser("list", help="list trusted keys and your own")
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(func=cmd_keys)
