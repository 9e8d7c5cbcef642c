"""Item signatures: a first-line comment with a UTC timestamp, the SHA-256 of the content, and
the signer's name and Ed25519 signature.

Kiwi writes ``<!-- kiwi:signed:TIMESTAMP:SHA256:SIGNER:SIGNATURE -->`` (``# kiwi:signed:...`` in
YAML and Python files) and hashes everything after that first line. A line without a signer
(``kiwi:signed:TIMESTAMP:SHA256``, what Kiwi wrote before keys) only proves integrity: anyone,
an agent included, can compute a hash, so it never makes a directive's grants take effect.
Which signers are trusted is ``trusted_keys.yaml`` (see ``kiwi.keys``). The legacy Kiwi MCP line
``<!-- kiwi-mcp:validated:TIMESTAMP:HASH -->`` is recognised: its hash covered the directive's
XML block, sometimes shortened to 12 hex digits.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

_SIGNATURE = re.compile(
    r"^(?:<!--|#)\s*(kiwi|kiwi-mcp):(signed|validated):(\S+?):([0-9a-fA-F]{12,64})"
    r"(?::([A-Za-z0-9_.-]{1,64}):([A-Za-z0-9_-]+))?\s*(?:-->)?\s*$"
)
_XML_BLOCK = re.compile(r"```xml\n(.*?)\n```", re.DOTALL)


@dataclass
class SignatureStatus:
    state: Literal["unsigned", "valid", "modified"]
    timestamp: str = ""
    legacy: bool = False
    expected: str = ""
    actual: str = ""
    signer: str = ""
    signature: str = ""
    # Set by ``check_trust``: the signer's key is trusted for signing and the signature verifies.
    trusted: bool = False

    def describe(self) -> str:
        if self.state == "unsigned":
            return "unsigned"
        label = "legacy kiwi-mcp signature" if self.legacy else "signature"
        if self.state == "valid":
            who = f" by {self.signer}" if self.signer else " (no signer: integrity only)"
            # (README trial s39: "NOT by a trusted key" of a key trusted to approve, not to sign.)
            trust = (", trusted" if self.trusted else ", NOT by a key trusted to sign") if self.signer else ""
            return f"{label} valid (signed {self.timestamp}{who}{trust})"
        return f"modified after signing: {label} from {self.timestamp} does not match the content (re-sign with `kiwi sign`)"


def split_signature(text: str) -> tuple[str | None, str]:
    """Return (signature line or None, the content the signature covers)."""
    first, sep, rest = text.partition("\n")
    if _SIGNATURE.match(first.strip()):
        return first, rest
    return None, text


def content_hash(text: str) -> str:
    """SHA-256 of an item's content without its signature line (the run snapshot's hash)."""
    return hashlib.sha256(split_signature(text)[1].encode("utf-8")).hexdigest()


def verify(text: str) -> SignatureStatus:
    line, body = split_signature(text)
    if line is None:
        return SignatureStatus("unsigned")
    m = _SIGNATURE.match(line.strip())
    assert m is not None
    tool, _, timestamp, digest, signer, signature = m.groups()
    legacy = tool == "kiwi-mcp"
    digest = digest.lower()
    if legacy:
        block = _XML_BLOCK.search(body)
        candidates = [hashlib.sha256(body.encode()).hexdigest()]
        if block:
            candidates.append(hashlib.sha256(block.group(1).encode()).hexdigest())
        ok = any(c == digest or (len(digest) == 12 and c.startswith(digest)) for c in candidates)
        actual = candidates[-1]
    else:
        actual = hashlib.sha256(body.encode()).hexdigest()
        ok = actual == digest
    return SignatureStatus(
        "valid" if ok else "modified", timestamp, legacy, digest, actual, signer or "", signature or ""
    )


def check_trust(status: SignatureStatus, signers: dict[str, str], kind: str) -> SignatureStatus:
    """``status`` with ``trusted`` set: valid content, a named signer in ``signers``, and its signature
    over this ``kind`` of item and its whole body.

    A legacy kiwi-mcp line is never trusted: its hash covers only the first XML block a regex finds,
    which need not be the block Kiwi parses.
    """
    from kiwi.keys import item_message, verify_bytes

    key = signers.get(status.signer)
    status.trusted = bool(
        status.state == "valid"
        and not status.legacy
        and key
        and status.signature
        and verify_bytes(
            key, item_message(kind, status.actual, status.timestamp, status.signer), status.signature
        )
    )
    return status


def sign(
    text: str,
    *,
    signer: str,
    kind: str,
    comment: Literal["html", "hash"] = "html",
    now: datetime | None = None,
) -> str:
    """Return ``text`` (an item of ``kind``: directive, tool, knowledge) with a fresh Kiwi signature by the key
    ``signer`` as its first line (any old one replaced)."""
    from kiwi.keys import item_message, sign_bytes

    _, body = split_signature(text)
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    mark = f"kiwi:signed:{stamp}:{digest}:{signer}:{sign_bytes(signer, item_message(kind, digest, stamp, signer))}"
    line = f"<!-- {mark} -->" if comment == "html" else f"# {mark}"
    return f"{line}\n{body}"
