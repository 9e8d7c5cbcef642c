"""Human identities: Ed25519 keys that sign items and approval decisions.

A person's private key lives outside every project and outside the user space
(``$KIWI_KEYS_DIR``, default ``~/.config/kiwi/keys/NAME.key``, mode 0600), where no tool
Kiwi runs for an agent can read it. Which keys Kiwi trusts, and for what, is
``trusted_keys.yaml`` in ``.ai/config/`` (project, a protected place) and ``~/.ai/config/``
(user)::

    keys:
      alice: {public_key: "ed25519:BASE64", roles: [sign, approve]}

Public keys are no secret: they travel in a run's snapshot, and the workflow verifies
approval decisions with them (pure computation, so deterministic).
"""

from __future__ import annotations

import base64
import contextlib
import difflib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal, get_args

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kiwi import yamltext
from kiwi.errors import InputInvalid, ItemInvalid, KiwiError, Problem

Role = Literal["sign", "approve"]
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
PREFIX = "ed25519:"
TRUSTED_FILE = "trusted_keys.yaml"
# The project's (the user's is ~/.ai/config/trusted_keys.yaml).
PROJECT_FILE = f".ai/config/{TRUSTED_FILE}"


class TrustedKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    public_key: str
    roles: list[Role] = Field(default_factory=lambda: ["sign", "approve"])


class TrustedKeys(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: dict[str, TrustedKey] = Field(default_factory=dict)

    def with_role(self, role: Role) -> dict[str, str]:
        """``{name: public key}`` of the keys trusted for ``role``."""
        return {name: key.public_key for name, key in self.keys.items() if role in key.roles}


def keys_dir() -> Path:
    return Path(os.environ.get("KIWI_KEYS_DIR") or Path.home() / ".config" / "kiwi" / "keys")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def public_key_text(key: Ed25519PrivateKey) -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PREFIX + _b64(raw)


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise InputInvalid(
            f"key name '{name}' is not usable", hint="use letters, digits, '.', '_' or '-' (at most 64)"
        )
    return name


def create_key(name: str) -> tuple[Path, str]:
    """Make ``NAME.key`` in the keys folder (never overwriting one); return its path and public key."""
    path = keys_dir() / f"{check_name(name)}.key"
    if path.exists():
        raise InputInvalid(f"a key named '{name}' already exists at {path}", hint="pick another --name")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(_b64(raw) + "\n")
    return path, public_key_text(key)


def load_private(name: str) -> Ed25519PrivateKey:
    path = keys_dir() / f"{check_name(name)}.key"
    try:
        raw = _unb64(path.read_text().strip())
        return Ed25519PrivateKey.from_private_bytes(raw)
    except FileNotFoundError:
        raise InputInvalid(
            f"no signing key '{name}' at {path}", hint="create one with `kiwi keys init --name NAME`"
        ) from None
    except ValueError as exc:
        raise InputInvalid(f"{path} is not a Kiwi key: {exc}") from None


def own_keys() -> list[str]:
    folder = keys_dir()
    return sorted(p.stem for p in folder.glob("*.key")) if folder.is_dir() else []


def default_key(
    requested: str | None = None,
    option: str = "--key",
    role: Role | None = None,
    project_root: Path | None = None,
) -> str:
    """The key to sign with: the one named, else the only one there is, else the only one ``project_root``'s
    trusted keys trust for ``role`` (README trial s36: with a second key made to sign, `kiwi approve` said "you
    have several keys" though only one could approve). ``option``: the command's option that names one, for
    the hint when several would do."""
    if requested:
        return check_name(requested)
    names = own_keys()
    if len(names) == 1:
        return names[0]
    if not names:
        raise InputInvalid(
            f"you have no signing key (looked in {keys_dir()})",
            hint="create one with `kiwi keys init`; it is trusted for signing and approving",
        )
    able = names
    if role is not None and project_root is not None:
        from kiwi.items.store import user_space

        with contextlib.suppress(KiwiError):  # (unreadable trusted keys: their own check says so)
            trusted = set(load_trusted(project_root, user_space()).with_role(role).values())
            able = [n for n in names if _public_of(n) in trusted]
        if len(able) == 1:
            return able[0]
    shown = ", ".join(able or names)
    what = f" trusted to {role}" if role is not None and project_root is not None and able else ""
    raise InputInvalid(f"you have several keys{what} ({shown})", hint=f"choose one with {option} NAME")


def _public_of(name: str) -> str:
    try:
        return public_key_text(load_private(name))
    except KiwiError:
        return ""


def sign_bytes(name: str, message: bytes) -> str:
    return _b64(load_private(name).sign(message))


def verify_bytes(public_key: str, message: bytes, signature: str) -> bool:
    """True when ``signature`` is ``public_key``'s over ``message``. Pure: usable in workflow code."""
    if not public_key.startswith(PREFIX):
        return False
    try:
        Ed25519PublicKey.from_public_bytes(_unb64(public_key[len(PREFIX) :])).verify(
            _unb64(signature), message
        )
    except (InvalidSignature, ValueError):
        return False
    return True


def approval_message(
    run_id: str, execution: str, request_id: str, args_hash: str, approved: bool, by: str
) -> bytes:
    """What an approver signs: the run and its execution (a workflow id can be reused by a new execution,
    whose request ids start again), the request, the exact call (its hash) and the answer."""
    return json.dumps(
        {
            "kind": "kiwi-approval-v2",
            "run_id": run_id,
            "execution": execution,
            "request_id": request_id,
            "args_hash": args_hash,
            "approved": approved,
            "by": by,
        },
        sort_keys=True,
    ).encode()


def human_message(kind: str, run_id: str, execution: str, subject: str, answer: str, by: str) -> bytes:
    """What a human signs to steer a held run: ``resume`` (subject: the hold's id, new for every hold) or
    ``decide`` (subject: the escalation's request id, answer: the option), in this execution of the run."""
    return json.dumps(
        {
            "kind": f"kiwi-{kind}-v2",
            "run_id": run_id,
            "execution": execution,
            "subject": subject,
            "answer": answer,
            "by": by,
        },
        sort_keys=True,
    ).encode()


def item_message(kind: str, content_sha256: str, timestamp: str, signer: str) -> bytes:
    """What signing an item covers: its kind (a signed tool manifest is no signed directive), the SHA-256
    of everything after the signature line, the time and the signer."""
    return f"kiwi-item-v2\n{kind}\n{content_sha256}\n{timestamp}\n{signer}".encode()


# ---------------------------------------------------------------- trusted keys


def trusted_paths(project_root: Path, user_space: Path) -> list[Path]:
    return [user_space / "config" / TRUSTED_FILE, project_root / PROJECT_FILE]


def load_trusted(project_root: Path, user_space: Path) -> TrustedKeys:
    """The user's trusted keys, then the project's (a project entry replaces the user's of the same name)."""
    merged: dict[str, TrustedKey] = {}
    user_file, project_file = trusted_paths(project_root, user_space)
    # The project's is read with no link followed on the way (kiwi.projectfiles).
    project = yamltext.read_in_project(project_root, PROJECT_FILE)
    for path, data in (
        (user_file, yamltext.read(user_file) if user_file.is_file() else None),
        (project_file, project),
    ):
        if data is None:
            continue
        try:
            keys = TrustedKeys.model_validate(data).keys
        except ValidationError as exc:
            errors = exc.errors()
            # (A misspelt key is named once, with the one meant: not also as that one missing.)
            meant = {
                (*e["loc"][:-1], close)
                for e in errors
                if e["type"] == "extra_forbidden"
                for close in difflib.get_close_matches(str(e["loc"][-1]), list(TrustedKey.model_fields), n=1)
            }
            kept = [e for e in errors if not (e["type"] == "missing" and tuple(e["loc"]) in meant)]
            raise ItemInvalid([_trusted_problem(error, path) for error in kept]) from None
        problems = [
            Problem(f"keys.{name}: {why}", str(path))
            for name, key in keys.items()
            if (why := _untrusty(name, key))
        ]
        if problems:
            raise ItemInvalid(problems)
        merged.update(keys)
    return TrustedKeys(keys=merged)


def _untrusty(name: str, key: TrustedKey) -> str:
    """What is wrong with a trusted key's entry ('' when nothing): its name, or a public key that is none
    (second README trial s35: `ed25519:notbase64!!` was listed as a trusted signer)."""
    if not NAME.match(name):
        return "a key's name is letters, digits, '.', '_' or '-' (at most 64)"
    try:
        if not key.public_key.startswith(PREFIX):
            raise ValueError
        Ed25519PublicKey.from_public_bytes(_unb64(key.public_key[len(PREFIX) :]))
    except (ValueError, TypeError):
        return (
            f"public_key is not an Ed25519 public key: expected 'ed25519:' and 43 characters, as `kiwi keys "
            f"init` prints it (got {key.public_key[:24]!r})"
        )
    return ""


def _trusted_problem(error: Any, path: Path) -> Problem:
    """One of a trusted_keys.yaml's mistakes, with the key it meant for a misspelt one (`publc_key`)."""
    where = ".".join(str(p) for p in error["loc"])
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        fields = TrustedKey.model_fields if len(error["loc"]) > 2 else TrustedKeys.model_fields
        close = difflib.get_close_matches(str(error["loc"][-1]), list(fields), n=1, cutoff=0.6)
        message = (
            f"no such key; did you mean {close[0]}?" if close else f"no such key (keys: {', '.join(fields)})"
        )
    elif error["type"] == "literal_error" and isinstance(error.get("input"), str):
        close = difflib.get_close_matches(error["input"], list(get_args(Role)), n=1, cutoff=0.6)
        message = f"'{error['input']}' is no role; " + (
            f"did you mean {close[0]}?" if close else "roles: sign, approve"
        )
    elif error["type"] == "list_type" and error["loc"][-1] == "roles":
        message = "a list of roles, e.g. roles: [sign, approve]"
    # (The problem names the file: its name is not repeated in the message.)
    return Problem(f"{where}: {message}", str(path))


def trust_key(user_space: Path, name: str, public_key: str, roles: list[Role]) -> Path:
    """Add (or replace) ``name`` in the user's trusted_keys.yaml."""
    path = user_space / "config" / TRUSTED_FILE
    data: Any = yamltext.read(path) if path.is_file() else {}
    current = TrustedKeys.model_validate(data or {})
    current.keys[name] = TrustedKey(public_key=public_key, roles=roles)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Keys Kiwi trusts: `sign` (items whose grants take effect) and `approve` (approval decisions).",
        "# Written by `kiwi keys init`; edit by hand to revoke (remove) or narrow roles.",
        "keys:",
    ]
    for key_name, key in sorted(current.keys.items()):
        lines.append(f'  {key_name}: {{public_key: "{key.public_key}", roles: [{", ".join(key.roles)}]}}')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
