"""The shared registry: publish, find and pull directives, tools and knowledge, on PostgreSQL.

``KIWI_REGISTRY_URL`` names the database (a Supabase project's Postgres connection string or any
PostgreSQL >= 14); without it, ``kiwi dev`` and the CLI use the user's embedded one
(``kiwi.registry.embedded``). Every version is immutable: its files, the SHA-256 over them
(``bundle_hash``) and the publisher's Ed25519 signature over that hash are checked again on every pull,
so a row changed in the database is refused. Row-level security (migration 0001) lets a role publish
and yank only under its own namespace; everyone reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiwi.errors import KiwiError

MIGRATIONS = Path(__file__).parent / "migrations"
URL_VARIABLE = "KIWI_REGISTRY_URL"
MAX_ITEM_BYTES = 1_000_000
KINDS = ("directive", "tool", "knowledge")
_TABLE = {"directive": "directives", "tool": "tools", "knowledge": "knowledge"}
_VERSION = re.compile(r"^(\d{1,9})\.(\d{1,9})\.(\d{1,9})$")
# A namespace, as the kiwi_publishers table checks it.
_NAMESPACE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


class RegistryUnavailable(KiwiError):
    """The registry's database cannot be reached (or has no Kiwi tables yet)."""


class RegistryConflict(KiwiError):
    """A publish that cannot land: the version exists, is not newer, or the id is another namespace's."""


class RegistryRefused(KiwiError):
    """The database refused the request: not a publisher, another namespace, a tampered row."""


def parse_version(version: str) -> list[int]:
    m = _VERSION.match(version)
    if not m:
        raise KiwiError(f"version '{version}' is not MAJOR.MINOR.PATCH", hint="e.g. 1.0.0")
    return [int(p) for p in m.groups()]


def bundle_hash(kind: str, item_id: str, version: str, files: dict[str, str]) -> str:
    """SHA-256 over what a version is: its kind, id, version and every file (path and content)."""
    digest = hashlib.sha256()
    digest.update(json.dumps([kind, item_id, version], separators=(",", ":")).encode())
    for path in sorted(files):
        digest.update(b"\0" + path.encode() + b"\0" + hashlib.sha256(files[path].encode()).digest())
    return digest.hexdigest()


def bundle_message(digest: str, signer: str) -> bytes:
    return f"kiwi-registry-bundle:v1:{digest}:{signer}".encode()


@dataclass
class Bundle:
    """One version of an item as published: its main file and, for a tool, the others."""

    kind: str
    item_id: str
    version: str
    main: str  # the main file's text (directive .md, tool.yaml, knowledge .md)
    files: dict[str, str] = field(default_factory=dict)  # a tool's other files, by relative path
    description: str = ""
    category: str = ""
    tags: list[str] = field(default_factory=list)
    # Set by a pull that replaced a tool: where the files of the old folder it did not carry over are kept.
    kept: str = ""

    def all_files(self) -> dict[str, str]:
        return {"": self.main, **self.files}

    def digest(self) -> str:
        return bundle_hash(self.kind, self.item_id, self.version, self.all_files())

    def size(self) -> int:
        return sum(len(text.encode()) for text in self.all_files().values())


def registry_url() -> str:
    return os.environ.get(URL_VARIABLE, "").strip()


def _passwords(url: str) -> list[str]:
    """Every spelling of the password a connection string may hold (URI userinfo, ?password=, key=value)."""
    found = []
    try:
        from psycopg.conninfo import conninfo_to_dict

        value = conninfo_to_dict(url).get("password")
        if value:
            found.append(str(value))
    except Exception:  # noqa: BLE001 - an unparsable string still goes through the patterns below
        pass
    userinfo = re.match(r"^[a-z]+://([^/?#]*)@", url)
    if userinfo and ":" in userinfo.group(1):
        found.append(userinfo.group(1).split(":", 1)[1])
    found += re.findall(r"password=([^&\s]+)", url)
    return sorted({p for p in found if p}, key=len, reverse=True)


def scrub_password(text: str, url: str) -> str:
    for secret in _passwords(url):
        text = text.replace(secret, "***")
        for part in re.split(r"[@:/?&=\s]+", secret):
            if len(part) >= 4:
                text = text.replace(part, "***")
    return text


def describe_url(url: str) -> str:
    """The URL without its password, for messages: rebuilt from its parts when it parses."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 - say nothing of a string that does not parse
        return "the registry database (its connection string does not parse)"
    host = parts.get("host", "")
    where = f"{host}:{parts['port']}" if parts.get("port") else host
    user = (
        f"{parts['user']}:***@"
        if parts.get("password") and parts.get("user")
        else (f"{parts['user']}@" if parts.get("user") else "")
    )
    shown = f"postgresql://{user}{where if not str(host).startswith('/') else ''}/{parts.get('dbname', '')}"
    if str(host).startswith("/"):
        shown += f"?host={host}"
    return scrub_password(shown, url)


class Registry:
    """The registry on one PostgreSQL database (a connection pool)."""

    def __init__(self, url: str, *, pool_size: int = 4) -> None:
        import logging

        import psycopg
        from psycopg_pool import ConnectionPool

        # The pool logs every failed attempt; Kiwi's error says it once.
        logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
        self.url = url
        try:
            psycopg.connect(url, connect_timeout=5).close()
        except Exception as exc:  # noqa: BLE001 - psycopg's connection errors have many types
            raise RegistryUnavailable(
                f"cannot reach the registry at {describe_url(url)}: "
                + scrub_password(str(exc).strip().splitlines()[0], url)[:200],
                hint=f"check {URL_VARIABLE}, or unset it to use the local registry `kiwi dev` starts",
            ) from None
        self.pool = ConnectionPool(
            url, min_size=0, max_size=pool_size, timeout=10, open=True, kwargs={"autocommit": True}
        )

    def label(self) -> str:
        """How a run's provenance names this registry (no password; "local" for the embedded one)."""
        return describe_url(self.url) if registry_url() else "local"

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _conn(self, *, owner: bool = False) -> Iterator[Any]:
        """A pooled connection, the database's errors as Kiwi's. ``owner``: an act of the database's owner
        (migrate, add-publisher), whose refusal names the owner, not publishing."""
        import psycopg

        try:
            with self.pool.connection() as conn:
                yield conn
        except psycopg.errors.UndefinedTable as exc:
            raise RegistryUnavailable(
                f"the registry database {describe_url(self.url)} has no Kiwi tables"
                + (
                    f" ({exc.diag.message_primary}: a migration is not applied)"
                    if exc.diag.message_primary
                    else ""
                ),
                hint="apply the migrations: `kiwi registry migrate` (or `supabase db push` with deploy/supabase)",
            ) from None
        except psycopg.errors.InsufficientPrivilege as exc:
            raise RegistryRefused(
                f"the registry refused this: {exc.diag.message_primary or exc}",
                hint="run it as the database's owner (the role that applied the migrations), not as a publisher "
                "or reader"
                if owner
                else "publishing needs a role registered as a publisher (`kiwi registry add-publisher`), "
                "and only under that publisher's namespace",
            ) from None
        except psycopg.OperationalError as exc:
            raise RegistryUnavailable(
                f"the registry at {describe_url(self.url)} is unavailable: "
                + scrub_password(str(exc).strip(), self.url)[:200],
                hint=f"check {URL_VARIABLE} or start the local one with `kiwi dev`",
            ) from None

    # ------------------------------------------------------------------ schema

    def migrate(self) -> list[str]:
        """Apply the migrations not yet applied, each in its own transaction; the names applied."""
        applied: list[str] = []
        with self._conn(owner=True) as conn:
            conn.execute(
                "create table if not exists kiwi_schema_migrations "
                "(name text primary key, applied_at timestamptz not null default now())"
            )
            done = {r[0] for r in conn.execute("select name from kiwi_schema_migrations")}
            for path in sorted(MIGRATIONS.glob("*.sql")):
                if path.name in done:
                    continue
                with conn.transaction():
                    conn.execute(path.read_text())
                    conn.execute("insert into kiwi_schema_migrations (name) values (%s)", (path.name,))
                applied.append(path.name)
        return applied

    def add_publisher(self, namespace: str, role: str, key_name: str, public_key: str) -> None:
        """Register ``role`` as the publisher of ``namespace`` (an administrator's act)."""
        import psycopg
        from psycopg import sql

        if not _NAMESPACE.fullmatch(namespace):
            raise RegistryRefused(
                f"namespace '{namespace}' is not lowercase letters, digits, '-' and '_' (from a letter or digit)",
                hint="e.g. `kiwi registry add-publisher team-a --role ROLE --key KEY`",
            )
        if not _ed25519_public(public_key):
            raise RegistryRefused(
                "--public-key is not an Ed25519 public key as `kiwi keys list` prints one (ed25519:...)",
                hint="copy the publisher's key from `kiwi keys list` on their machine, or leave --public-key "
                "out to use your own key named by --key",
            )
        try:
            self._register(namespace, role, key_name, public_key, sql)
        except psycopg.errors.UniqueViolation:
            raise RegistryRefused(
                f"the role '{role}' already publishes under another namespace (one namespace per role)",
                hint="`kiwi registry status` lists the publishers; create another role for this namespace",
            ) from None
        except psycopg.errors.UndefinedObject:
            raise RegistryRefused(
                f"the database has no role '{role}'",
                hint=f"create it first (`create role {role} login password '...'`), or name an existing one",
            ) from None
        except psycopg.errors.CheckViolation as exc:
            raise RegistryRefused(
                f"the registry refused the publisher: {exc.diag.message_primary or exc}"
            ) from None

    def _register(self, namespace: str, role: str, key_name: str, public_key: str, sql: Any) -> None:
        # (UniqueViolation: the role publishes elsewhere; nothing is granted then, the transaction rolls back.)
        with self._conn(owner=True) as conn, conn.transaction():
            conn.execute(sql.SQL("grant kiwi_publisher to {}").format(sql.Identifier(role)))
            conn.execute(
                "insert into kiwi_publishers (namespace, role_name, key_name, public_key) values (%s, %s, %s, %s) "
                "on conflict (namespace) do update set role_name = excluded.role_name, "
                "key_name = excluded.key_name, public_key = excluded.public_key",
                (namespace, role, key_name, public_key),
            )
            # The namespace's earlier keys stay in its history: versions they signed still pull.
            conn.execute(
                "insert into kiwi_publisher_keys (namespace, key_name, public_key) values (%s, %s, %s) "
                "on conflict do nothing",
                (namespace, key_name, public_key),
            )

    def status(self) -> dict[str, Any]:
        import psycopg

        with self._conn() as conn:
            version = conn.execute("show server_version").fetchone()[0]
            try:
                with conn.transaction():
                    migrations: list[str] | None = [
                        r[0] for r in conn.execute("select name from kiwi_schema_migrations order by name")
                    ]
            except psycopg.errors.InsufficientPrivilege:
                migrations = None  # (the owner's table: a publisher or reader sees the rest)
            counts = dict(
                conn.execute("select item_type, count(*) from item_versions group by item_type").fetchall()
            )
            me = conn.execute("select current_user, kiwi_my_namespace()").fetchone()
        wanted = sorted(p.name for p in MIGRATIONS.glob("*.sql"))
        return {
            "url": describe_url(self.url),
            "server_version": version,
            "migrations": migrations if migrations is not None else "not visible to this role",
            "pending_migrations": [m for m in wanted if m not in migrations]
            if migrations is not None
            else [],
            "versions": counts,
            "role": me[0],
            "namespace": me[1] or "",
        }

    # ------------------------------------------------------------------ publish

    def publish(self, bundle: Bundle, *, signer: str, bundle_signature: str) -> dict[str, Any]:
        """Store one version: the item row (first publish claims the id for this namespace), the version
        and a tool's files, in one transaction; conflicts name the version."""
        import psycopg

        order = parse_version(bundle.version)
        if bundle.size() > MAX_ITEM_BYTES:
            raise KiwiError(
                f"{bundle.kind} '{bundle.item_id}' is {bundle.size():,} bytes; the registry takes at most "
                f"{MAX_ITEM_BYTES:,}",
                hint="split it, or keep large data out of items",
            )
        digest = bundle.digest()
        table = _TABLE[bundle.kind]
        try:
            with self._conn() as conn, conn.transaction():
                namespace = conn.execute("select kiwi_my_namespace()").fetchone()[0]
                if not namespace:
                    user = conn.execute("select current_user").fetchone()[0]
                    raise RegistryRefused(
                        f"the database role '{user}' is not a registered publisher",
                        hint="an administrator runs `kiwi registry add-publisher NAMESPACE --role ROLE --key KEY`",
                    )
                # One publisher of an id at a time: versions are compared and inserted under this lock.
                conn.execute(
                    "select pg_advisory_xact_lock(hashtext(%s))", (f"{bundle.kind}:{bundle.item_id}",)
                )
                owner = conn.execute(
                    "select kiwi_item_namespace(%s, %s)", (bundle.kind, bundle.item_id)
                ).fetchone()[0]
                if owner is None:
                    conn.execute(
                        f"insert into {table} (id, namespace) values (%s, %s)",  # noqa: S608 - fixed table names
                        (bundle.item_id, namespace),
                    )
                elif owner != namespace:
                    raise RegistryConflict(
                        f"{bundle.kind} '{bundle.item_id}' belongs to the namespace '{owner}', not '{namespace}'",
                        hint="publish it under another id",
                    )
                key_name, public_key = conn.execute(
                    "select key_name, public_key from kiwi_publishers where namespace = %s", (namespace,)
                ).fetchone()
                from kiwi.keys import verify_bytes

                if signer != key_name or not verify_bytes(
                    public_key, bundle_message(digest, signer), bundle_signature
                ):
                    raise RegistryRefused(
                        f"the namespace '{namespace}' publishes with the key '{key_name}'; this version is signed "
                        f"by '{signer}'",
                        hint=f"sign the item with that key and publish with it (`kiwi sign FILE --key {key_name}`, "
                        f"then `kiwi publish FILE --key {key_name}`), or have the registry's owner register your "
                        "key (`kiwi registry add-publisher`)",
                    )
                latest = conn.execute(
                    "select version, version_order from item_versions where item_type = %s and item_id = %s "
                    "order by version_order desc limit 1",
                    (bundle.kind, bundle.item_id),
                ).fetchone()
                if latest is not None and list(latest[1]) >= order:
                    raise RegistryConflict(
                        f"{bundle.kind} '{bundle.item_id}' version {bundle.version} is not newer than the "
                        f"published {latest[0]}",
                        hint="raise the version in the item and sign it again",
                    )
                conn.execute(
                    "insert into item_versions (item_type, item_id, version, version_order, namespace, description, "
                    "category, tags, content, content_hash, bundle_signature, signer, size_bytes) "
                    "values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    (
                        bundle.kind,
                        bundle.item_id,
                        bundle.version,
                        order,
                        namespace,
                        bundle.description,
                        bundle.category,
                        " ".join(bundle.tags),
                        bundle.main,
                        digest,
                        bundle_signature,
                        signer,
                        bundle.size(),
                    ),
                )
                for path, text in sorted(bundle.files.items()):
                    conn.execute(
                        "insert into tool_version_files (item_id, version, path, content) values (%s, %s, %s, %s)",
                        (bundle.item_id, bundle.version, path, text),
                    )
        except psycopg.errors.UniqueViolation:
            raise RegistryConflict(
                f"{bundle.kind} '{bundle.item_id}' version {bundle.version} is already published",
                hint="versions are immutable: raise the version and sign again",
            ) from None
        return {
            "item_type": bundle.kind,
            "item_id": bundle.item_id,
            "version": bundle.version,
            "namespace": namespace,
            "content_hash": digest,
        }

    def yank(self, kind: str, item_id: str, version: str) -> None:
        with self._conn() as conn:
            row = conn.execute(
                "update item_versions set yanked = true where item_type = %s and item_id = %s and version = %s "
                "returning version",
                (kind, item_id, version),
            ).fetchone()
        if row is None:
            raise RegistryRefused(
                f"no {kind} '{item_id}' version {version} of your namespace in the registry",
                hint="`kiwi search --source registry` lists what is published; only its publisher yanks a version",
            )

    # ------------------------------------------------------------------ find and pull

    def search(
        self, query: str, *, kind: str | None = None, limit: int = 20, category: str | None = None
    ) -> list[dict[str, Any]]:
        """Latest versions that are not yanked, ranked by full-text match (weighted: id, then description,
        category and tags, then content); of ``category`` and its sub-categories when given. A query of no
        words (``""``, ``*``) lists them, as the local search does (README trial s39: `*` found nothing)."""
        query = "" if query.strip() == "*" else query
        with self._conn() as conn:
            # Matching rows first (the GIN index), then each matching item's latest version that is not
            # yanked (the (item_type, item_id, version_order) index), ranked.
            rows = conn.execute(
                "with q as (select websearch_to_tsquery('english', %(q)s) as q), "
                "m as (select distinct item_type, item_id from item_versions, q "
                "where not yanked and (%(kind)s::text is null or item_type = %(kind)s) "
                "and (%(q)s = '' or search @@ q.q)) "
                "select l.item_type, l.item_id, l.version, l.description, l.category, l.tags, l.namespace, "
                "l.signer, (select count(distinct d.role_name) from kiwi_downloads d where d.item_type = l.item_type "
                "and d.item_id = l.item_id) as downloads, ts_rank(l.search, q.q) as rank from m cross join lateral "
                "(select * from item_versions v where v.item_type = m.item_type and v.item_id = m.item_id "
                "and not v.yanked order by v.version_order desc limit 1) l, q "
                "where (%(category)s::text is null or l.category = %(category)s "
                "or starts_with(l.category, %(category)s || '/')) "
                "order by rank desc, l.item_id limit %(limit)s",
                {"kind": kind, "q": query.strip(), "limit": limit, "category": category or None},
            ).fetchall()
        return [
            {
                "item_type": r[0],
                "item_id": r[1],
                "version": r[2],
                "description": r[3],
                "category": r[4],
                "tags": r[5].split(),
                "namespace": r[6],
                "signer": r[7],
                "downloads": r[8],
                "score": round(float(r[9]), 4),
                "source": "registry",
            }
            for r in rows
        ]

    def kinds_of(self, item_id: str) -> list[str]:
        """The item types published under ``item_id`` (any version, yanked ones too)."""
        with self._conn() as conn:
            rows = conn.execute(
                "select distinct item_type from item_versions where item_id = %s order by item_type",
                (item_id,),
            ).fetchall()
        return [r[0] for r in rows]

    def kind_of(self, item_id: str, kind: str | None = None) -> str:
        """``kind`` when given, else the one item type ``item_id`` is published as (an error naming the
        choices when there are none or several)."""
        if kind:
            return kind
        found = self.kinds_of(item_id)
        if len(found) != 1:
            raise RegistryRefused(
                f"'{item_id}' is {'published as ' + ' and '.join(found) if found else 'not in the registry'}",
                hint="say which with --type"
                if found
                else f"`kiwi search --source registry {item_id}` lists what is published",
            )
        return found[0]

    def latest_versions(self, kind: str, ids: list[str]) -> dict[str, str]:
        if not ids:
            return {}
        with self._conn() as conn:
            rows = conn.execute(
                "select distinct on (item_id) item_id, version from item_versions "
                "where item_type = %s and item_id = any(%s) and not yanked order by item_id, version_order desc",
                (kind, ids),
            ).fetchall()
        return dict(rows)

    def versions(self, kind: str, item_id: str) -> list[dict[str, Any]]:
        """Every published version of ``item_id``, newest first, yanked ones too (marked): what
        `kiwi registry versions` shows, and what a pull of ``ID@VERSION`` picks from."""
        with self._conn() as conn:
            rows = conn.execute(
                "select v.version, v.published_at, v.namespace, v.signer, v.size_bytes, v.yanked, "
                "(select count(*) from kiwi_downloads d where d.item_type = v.item_type and d.item_id = v.item_id "
                "and d.version = v.version) from item_versions v where v.item_type = %s and v.item_id = %s "
                "order by v.version_order desc",
                (kind, item_id),
            ).fetchall()
        if not rows:
            raise RegistryRefused(
                f"no {kind} '{item_id}' in the registry",
                hint=f"`kiwi search --source registry {item_id}` lists what is published",
            )
        return [
            {
                "version": r[0],
                "published_at": r[1].isoformat(),
                "namespace": r[2],
                "signer": r[3],
                "size_bytes": r[4],
                "yanked": r[5],
                "downloads": r[6],
            }
            for r in rows
        ]

    def fetch(self, kind: str, item_id: str, version: str | None = None) -> tuple[Bundle, dict[str, Any]]:
        """One version (the latest not yanked when ``version`` is None), checked: its files hash to the
        stored hash and the publisher's key signed that hash. A row that fails is refused."""
        from kiwi.keys import verify_bytes

        with self._conn() as conn:
            row = conn.execute(
                "select v.version, v.content, v.content_hash, v.bundle_signature, v.signer, v.namespace, "
                "v.description, v.category, v.tags, v.yanked, "
                "array(select k.public_key from kiwi_publisher_keys k "
                "where k.namespace = v.namespace and k.key_name = v.signer) "
                "from item_versions v "
                "where v.item_type = %s and v.item_id = %s and (%s::text is null and not v.yanked or v.version = %s) "
                "order by v.version_order desc limit 1",
                (kind, item_id, version, version),
            ).fetchone()
            if row is None:
                raise RegistryRefused(
                    f"no {kind} '{item_id}'{f' version {version}' if version else ''} in the registry"
                    + ("" if version else " (or only yanked versions)"),
                    hint=f"`kiwi search --source registry {item_id}` lists what is published",
                )
            files = (
                dict(
                    conn.execute(
                        "select path, content from tool_version_files where item_id = %s and version = %s",
                        (item_id, row[0]),
                    ).fetchall()
                )
                if kind == "tool"
                else {}
            )
            conn.execute(
                "insert into kiwi_downloads (item_type, item_id, version) values (%s, %s, %s) on conflict do nothing",
                (kind, item_id, row[0]),
            )
        bundle = Bundle(kind, item_id, row[0], row[1], files, row[6], row[7], row[8].split())
        digest = bundle.digest()
        if digest != row[2]:
            raise RegistryRefused(
                f"{kind} '{item_id}' {row[0]} in the registry does not match its published hash: refused",
                hint="the row was changed after publishing; tell the registry's administrator",
            )
        # Any key the namespace has had under the version's signer name (its current one or an earlier).
        if not any(verify_bytes(key, bundle_message(digest, row[4]), row[3]) for key in row[10]):
            raise RegistryRefused(
                f"{kind} '{item_id}' {row[0]} is not signed by its publisher '{row[5]}': refused",
                hint="the signature or the publisher's key was changed; tell the registry's administrator",
            )
        return bundle, {
            "version": row[0],
            "namespace": row[5],
            "signer": row[4],
            "content_hash": digest,
            "yanked": row[9],
        }


def _ed25519_public(text: str) -> bool:
    """Whether ``text`` is an Ed25519 public key as Kiwi writes one (``ed25519:`` and 32 bytes, base64url)."""
    import base64

    from kiwi.keys import PREFIX

    if not text.startswith(PREFIX):
        return False
    body = text[len(PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (ValueError, TypeError):
        return False
    return len(raw) == 32
