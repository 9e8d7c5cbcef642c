"""Where items live and how they are found: project ``.ai/`` over user ``~/.ai/``, and a search index.

The index is a SQLite FTS5 database (BM25 ranking) kept in ``.ai/.cache/index.sqlite``. Every
query first re-scans the item folders by file size and modification time and re-parses only
what changed, so results always match the files without a full rebuild.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kiwi import projectfiles
from kiwi.errors import ItemInvalid, ItemNotFound, Problem
from kiwi.items.directive import Directive, parse_directive_lenient
from kiwi.items.files import NotAnItemFile, read_item_bytes
from kiwi.items.knowledge import KnowledgeEntry, parse_knowledge
from kiwi.items.tools import ToolManifest, legacy_script_manifest, parse_manifest, runnable_problems

ItemType = Literal["directive", "tool", "knowledge"]
ITEM_TYPES: tuple[ItemType, ...] = ("directive", "tool", "knowledge")
# Other names for item types: Kiwi MCP called legacy tools under .ai/scripts "scripts".
ITEM_ALIASES: dict[str, ItemType] = {"script": "tool"}


def item_kind(name: str) -> str:
    """An item type as asked for, with its alias resolved (``script`` is ``tool``)."""
    return ITEM_ALIASES.get(name, name)


SOURCES = ("project", "user")
_SCHEMA_VERSION = 3


def user_space() -> Path:
    """``AI_USER_SPACE`` or ``~/.ai``."""
    return Path(os.environ.get("AI_USER_SPACE") or Path.home() / ".ai").expanduser()


def find_project_root(start: Path | None = None) -> Path:
    """The nearest folder at or above ``start`` holding ``.ai/``; else ``start`` itself.

    With no ``start``, ``KIWI_PROJECT`` (set by ``--project``) names the project when it is set.
    """
    if start is None and os.environ.get("KIWI_PROJECT"):
        return Path(os.environ["KIWI_PROJECT"]).expanduser().resolve()
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / ".ai").is_dir() and candidate != Path.home():
            return candidate
    return here


def project_root_problem(root: Path) -> str:
    """Why ``root`` cannot be a project an agent works in, or ''. Everything below a project's root is the
    agent's to read and write as its grants say: the filesystem's root, the home folder, or a folder holding
    the user's keys, Kiwi's state (the payload store, the dev server's database) or the user space would put
    the human's private signing key and every run's data within a ``read **``."""
    from kiwi.devserver import data_dir
    from kiwi.keys import keys_dir

    root = root.resolve()
    if root == Path(root.anchor):
        return f"{root} is the filesystem's root"
    private = {
        "your home folder": Path.home(),
        "your keys": keys_dir(),
        "Kiwi's state (KIWI_HOME)": data_dir(),
        "your user space (~/.ai)": user_space(),
    }
    for what, place in private.items():
        place = place.expanduser().resolve()
        if place == root or root in place.parents:
            return f"{root} holds {what} ({place})"
    return ""


@dataclass
class ItemRecord:
    """One item as indexed: enough to list, rank and locate it."""

    item_type: ItemType
    item_id: str
    source: str
    path: str
    name: str = ""
    description: str = ""
    category: str = ""
    tags: list[str] = field(default_factory=list)
    valid: bool = True
    problems: list[str] = field(default_factory=list)
    score: float = 0.0
    snippet: str = ""
    shadows: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items()}
        data["score"] = round(self.score, 4)
        return data


@dataclass
class LoadedItem:
    record: ItemRecord
    text: str
    parsed: Directive | ToolManifest | KnowledgeEntry | None
    problems: list[Problem]


def parse_item(item_type: ItemType, path: Path, text: str | None = None) -> tuple[Any, list[Problem]]:
    """Parse one item file; returns (parsed or None, problems). Never raises for bad content."""
    shown = str(path)
    try:
        if text is None:
            try:
                raw = read_item_bytes(path)
            except NotAnItemFile as exc:
                return None, [Problem(str(exc), shown)]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return None, [
                    Problem(f"not UTF-8 text (byte {exc.start}); items are UTF-8 text files", shown)
                ]
        if item_type == "directive":
            return parse_directive_lenient(text, shown)
        if item_type == "tool":
            if path.suffix == ".py":
                return legacy_script_manifest(path), []
            manifest, problems = parse_manifest(text, shown)
            return manifest, problems + runnable_problems(manifest)
        return parse_knowledge(text, shown)
    except ItemInvalid as exc:
        return None, exc.problems
    except OSError as exc:
        return None, [Problem(f"cannot read: {exc.strerror}", shown)]
    except RecursionError:
        # (A backstop: the YAML and XML parsers bound nesting themselves.)
        return None, [Problem("nested too deeply to read", shown)]


def _describe(item_type: ItemType, parsed: Any, path: Path) -> dict[str, Any]:
    if isinstance(parsed, Directive):
        m = parsed.metadata
        steps = " ".join(f"{s.name} {s.description} {s.action}" for s in parsed.steps)
        return {
            "item_id": parsed.name,
            "name": parsed.name,
            "description": m.description,
            "category": m.category,
            "tags": m.tags,
            "content": steps,
        }
    if isinstance(parsed, ToolManifest):
        params = " ".join(f"{p.name} {p.description}" for p in parsed.parameters)
        return {
            "item_id": parsed.tool_id,
            "name": parsed.tool_id,
            "description": parsed.description,
            "category": parsed.category,
            "tags": parsed.tags,
            "content": params,
        }
    if isinstance(parsed, KnowledgeEntry):
        return {
            "item_id": parsed.zettel_id,
            "name": parsed.title,
            "description": parsed.title,
            "category": parsed.category,
            "tags": parsed.tags,
            "content": parsed.body,
        }
    stem = path.stem if path.name != "tool.yaml" else path.parent.name
    return {
        "item_id": stem.split(".")[0],
        "name": stem,
        "description": "",
        "category": "",
        "tags": [],
        "content": "",
    }


def _iter_files(base: Path, item_type: ItemType, within: Path | None = None) -> Iterator[Path]:
    """The item files of one type in ``base``; for the project's (``within``: its root), a link at ``.ai`` or
    at the type's folder is ItemInvalid naming it (kiwi.projectfiles), never items read from where it points."""
    roots = {"directive": ["directives"], "tool": ["tools", "scripts"], "knowledge": ["knowledge"]}[item_type]
    for folder in roots:
        top = base / folder
        if within is not None and not projectfiles.real_folder(within, f".ai/{folder}"):
            continue
        if not top.is_dir():
            continue
        stack = [top]
        while stack:
            current = stack.pop()
            try:
                entries = list(os.scandir(current))
            except OSError:
                continue
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in (
                        "node_modules",
                        "__pycache__",
                        ".venv",
                        "lib",
                    ):
                        stack.append(Path(entry.path))
                    continue
                # Regular files only (a link to one counts): reading a FIFO would wait forever.
                if _wanted(item_type, folder, entry.name) and entry.is_file():
                    yield Path(entry.path)


def _wanted(item_type: ItemType, folder: str, name: str) -> bool:
    if item_type in ("directive", "knowledge"):
        return name.endswith(".md")
    if folder == "scripts":
        return name.endswith(".py") and not name.startswith("_")
    return name.endswith((".yaml", ".yml"))


class ItemStore:
    """Items of one project and its user space, with a persistent, incrementally updated index."""

    def __init__(
        self, project_root: Path | None = None, user: Path | None = None, index_path: Path | None = None
    ) -> None:
        self.project_root = (project_root or find_project_root()).resolve()
        self.user = (user or user_space()).expanduser()
        self.spaces: dict[str, Path] = {"project": self.project_root / ".ai", "user": self.user}
        if self.user.resolve() == self.spaces["project"].resolve():
            self.spaces.pop("user")
        self.index_path = index_path or self.project_root / ".ai" / ".cache" / "index.sqlite"
        self._index_given = index_path is not None
        self._db: sqlite3.Connection | None = None

    # ---- index ----------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        try:
            if not self._index_given and not projectfiles.real_folder(self.project_root, ".ai"):
                # No project here (a folder without .ai/): an index on disk would make one, and every command
                # after would take the folder for a project. The user's items are indexed in memory.
                raise OSError("no project folder")
            self.index_path.parent.mkdir(parents=True, exist_ok=True)
            if not self._index_given:
                projectfiles.real_folder(self.project_root, ".ai/.cache")  # (a link there: ItemInvalid)
            db = sqlite3.connect(self.index_path)
        except (OSError, sqlite3.Error):
            db = sqlite3.connect(":memory:")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version != _SCHEMA_VERSION:
            db.executescript("""
                DROP TABLE IF EXISTS items; DROP TABLE IF EXISTS items_fts;
                CREATE TABLE items (
                    rowid INTEGER PRIMARY KEY, path TEXT UNIQUE NOT NULL, item_type TEXT NOT NULL,
                    item_id TEXT NOT NULL, source TEXT NOT NULL, mtime_ns INTEGER NOT NULL, size INTEGER NOT NULL,
                    name TEXT, description TEXT, category TEXT, tags TEXT, valid INTEGER NOT NULL,
                    problems TEXT NOT NULL);
                CREATE INDEX items_by_id ON items(item_id, item_type);
                CREATE VIRTUAL TABLE items_fts USING fts5(name, description, category, tags, content,
                    tokenize = 'unicode61 remove_diacritics 2');
            """)
            db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
            db.commit()
        self._db = db
        return db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def refresh(self) -> dict[str, int]:
        """Bring the index up to date with the files; returns counts of added/updated/removed/unchanged."""
        db = self._connect()
        known = {row[0]: (row[1], row[2]) for row in db.execute("SELECT path, mtime_ns, size FROM items")}
        seen: set[str] = set()
        counts = {"added": 0, "updated": 0, "removed": 0, "unchanged": 0}
        with db:
            for source, base in self.spaces.items():
                for item_type in ITEM_TYPES:
                    within = self.project_root if source == "project" else None
                    for path in _iter_files(base, item_type, within):
                        key = str(path)
                        seen.add(key)
                        try:
                            st = path.stat()
                        except OSError:
                            continue
                        if known.get(key) == (st.st_mtime_ns, st.st_size):
                            counts["unchanged"] += 1
                            continue
                        counts["updated" if key in known else "added"] += 1
                        self._index_one(db, source, item_type, path, st)
            for key in set(known) - seen:
                rowid = db.execute("SELECT rowid FROM items WHERE path=?", (key,)).fetchone()[0]
                db.execute("DELETE FROM items WHERE rowid=?", (rowid,))
                db.execute("DELETE FROM items_fts WHERE rowid=?", (rowid,))
                counts["removed"] += 1
        return counts

    def _index_one(
        self, db: sqlite3.Connection, source: str, item_type: ItemType, path: Path, st: os.stat_result
    ) -> None:
        parsed, problems = parse_item(item_type, path)
        if (
            item_type == "knowledge"
            and parsed is None
            and path.suffix == ".md"
            and "zettel_id" not in _head(path)
        ):
            return
        info = _describe(item_type, parsed, path)
        errors = [str(p) for p in problems if p.severity == "error"]
        valid = parsed is not None and not errors
        row = db.execute("SELECT rowid FROM items WHERE path=?", (str(path),)).fetchone()
        values = (
            str(path),
            item_type,
            info["item_id"],
            source,
            st.st_mtime_ns,
            st.st_size,
            info["name"],
            info["description"],
            info["category"],
            json.dumps(info["tags"]),
            int(valid),
            json.dumps([str(p) for p in problems]),
        )
        if row:
            db.execute(
                """UPDATE items SET path=?, item_type=?, item_id=?, source=?, mtime_ns=?, size=?, name=?,
                          description=?, category=?, tags=?, valid=?, problems=? WHERE rowid=?""",
                (*values, row[0]),
            )
            db.execute("DELETE FROM items_fts WHERE rowid=?", (row[0],))
            rowid = row[0]
        else:
            rowid = db.execute(
                """INSERT INTO items (path, item_type, item_id, source, mtime_ns, size, name,
                                  description, category, tags, valid, problems) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)""",
                values,
            ).lastrowid
        db.execute(
            "INSERT INTO items_fts (rowid, name, description, category, tags, content) VALUES (?,?,?,?,?,?)",
            (
                rowid,
                info["name"].replace("_", " ") + " " + info["item_id"],
                info["description"],
                info["category"].replace("/", " "),
                " ".join(info["tags"]),
                info["content"],
            ),
        )

    # ---- queries --------------------------------------------------------
    def _record(self, row: sqlite3.Row | tuple) -> ItemRecord:
        (path, item_type, item_id, source, name, description, category, tags, valid, problems, *rest) = row
        return ItemRecord(
            item_type=item_type,
            item_id=item_id,
            source=source,
            path=path,
            name=name or "",
            description=description or "",
            category=category or "",
            tags=json.loads(tags or "[]"),
            valid=bool(valid),
            problems=json.loads(problems or "[]"),
            score=float(-rest[0]) if rest and rest[0] is not None else 0.0,
            snippet=rest[1] if len(rest) > 1 else "",
        )

    _COLUMNS = "i.path, i.item_type, i.item_id, i.source, i.name, i.description, i.category, i.tags, i.valid, i.problems"

    def list_items(self, item_type: ItemType | None = None, *, refresh: bool = True) -> list[ItemRecord]:
        if refresh:
            self.refresh()
        sql = f"SELECT {self._COLUMNS} FROM items i"
        args: tuple = ()
        if item_type:
            sql += " WHERE i.item_type=?"
            args = (item_type,)
        return [
            self._record(r) for r in self._connect().execute(sql + " ORDER BY i.item_type, i.item_id", args)
        ]

    def search(
        self,
        query: str,
        *,
        item_type: ItemType | None = None,
        category: str | None = None,
        source: str = "all",
        limit: int = 10,
        refresh: bool = True,
    ) -> list[ItemRecord]:
        """Multi-term BM25 search over name, description, category, tags and content. A query of no words (``""``,
        ``*``) lists the items (of ``item_type``, ``category``, ``source``) by type and id, as the registry's search
        does: `kiwi search --type directive` and `search(item_type='directive')` list the directives."""
        if refresh:
            self.refresh()
        terms = re.findall(r"[^\W_]+", query.lower())
        if not terms:
            return self._match(None, item_type, category, source, limit)
        results = self._match(" ".join(f'"{t}"*' for t in terms), item_type, category, source, limit)
        if not results and len(terms) > 1:
            results = self._match(" OR ".join(f'"{t}"*' for t in terms), item_type, category, source, limit)
        return results

    def _match(
        self, fts_query: str | None, item_type: str | None, category: str | None, source: str, limit: int
    ) -> list[ItemRecord]:
        """The items matching ``fts_query`` best first; with None, every item by type and id."""
        sql = (
            f"SELECT {self._COLUMNS}, bm25(items_fts, 10.0, 5.0, 3.0, 3.0, 1.0) AS rank, "
            "snippet(items_fts, 4, '[', ']', '…', 12) FROM items_fts JOIN items i ON i.rowid = items_fts.rowid "
            "WHERE items_fts MATCH ?"
            if fts_query is not None
            else f"SELECT {self._COLUMNS}, NULL, '' FROM items i WHERE 1 = 1"
        )
        args: list[Any] = [fts_query] if fts_query is not None else []
        if item_type:
            sql += " AND i.item_type = ?"
            args.append(item_type)
        if category:
            sql += " AND (i.category = ? OR i.category LIKE ?)"
            args += [category, category.rstrip("/") + "/%"]
        if source in SOURCES:
            sql += " AND i.source = ?"
            args.append(source)
        sql += (
            " ORDER BY rank LIMIT ?" if fts_query is not None else " ORDER BY i.item_type, i.item_id LIMIT ?"
        )
        args.append(max(1, min(limit, 200)))
        records = [self._record(r) for r in self._connect().execute(sql, args)]
        if records:
            # One query for every record's other copies (the same id in another file or space).
            marks = ",".join("?" * len(records))
            rows = (
                self._connect()
                .execute(
                    f"SELECT item_type, item_id, source, path FROM items WHERE item_id IN ({marks})",
                    [r.item_id for r in records],
                )
                .fetchall()
            )
            for record in records:
                record.shadows = [
                    f"{src}: {path}"
                    for kind, item_id, src, path in rows
                    if kind == record.item_type and item_id == record.item_id and path != record.path
                ]
        return records

    def find(
        self, item_type: ItemType, item_id: str, *, source: str = "all", refresh: bool = True
    ) -> ItemRecord:
        """Locate one item, project space first; the same id elsewhere is reported in ``shadows``."""
        if refresh:
            self.refresh()
        rows = [
            self._record(r)
            for r in self._connect().execute(
                f"SELECT {self._COLUMNS} FROM items i WHERE i.item_type=? AND i.item_id=?",
                (item_type, item_id),
            )
        ]
        elsewhere = [r.source for r in rows if source in SOURCES and r.source != source]
        if source in SOURCES:
            rows = [r for r in rows if r.source == source]
        if not rows and elsewhere:
            # (README trial s39: `load(source="user")` of a project item said it was in neither space, and "did you
            # mean" the same id.)
            raise ItemNotFound(
                f"no {item_type} '{item_id}' in the {source} space ({self.spaces.get(source, self.user)}); it is in the "
                f"{' and '.join(dict.fromkeys(elsewhere))} space",
                hint=f"ask for source='{elsewhere[0]}' (or leave source out: the project's first)",
            )
        if not rows:
            similar = [r.item_id for r in self.search(item_id, item_type=item_type, limit=3, refresh=False)]
            hint = (
                f"did you mean: {', '.join(similar)}?"
                if similar
                else f"run `kiwi search --type {item_type}` to list them"
                if (self.project_root / ".ai").is_dir()
                else f"{self.project_root} is no Kiwi project (no .ai/ at or above it): `kiwi init` makes one "
                "here, or run this from your project's folder (or with --project PATH)"
            )
            raise ItemNotFound(
                f"no {item_type} '{item_id}' in {', '.join(str(p) for p in self.spaces.values())}", hint=hint
            )
        rows.sort(key=lambda r: (SOURCES.index(r.source), r.path))
        chosen = rows[0]
        chosen.shadows = [f"{r.source}: {r.path}" for r in rows[1:]]
        return chosen

    def load(self, item_type: ItemType, item_id: str, *, source: str = "all") -> LoadedItem:
        record = self.find(item_type, item_id, source=source)
        path = Path(record.path)
        try:
            text = read_item_bytes(path).decode("utf-8", errors="replace")
        except NotAnItemFile as exc:
            raise ItemInvalid([Problem(str(exc), str(path))]) from None
        parsed, problems = parse_item(item_type, path, text)
        return LoadedItem(record, text, parsed, problems)

    def load_directive(self, name: str) -> tuple[Directive, str, Path]:
        """A valid directive by name, or ItemNotFound / ItemInvalid."""
        item = self.load("directive", name)
        if item.parsed is None or any(p.severity == "error" for p in item.problems):
            raise ItemInvalid(item.problems)
        assert isinstance(item.parsed, Directive)
        return item.parsed, item.text, Path(item.record.path)

    def local_tools(self) -> dict[str, ToolManifest]:
        """Valid local tools by id; the project's copy wins over the user's."""
        tools: dict[str, ToolManifest] = {}
        records = sorted(self.list_items("tool"), key=lambda r: SOURCES.index(r.source))
        for record in records:
            if record.valid and record.item_id not in tools:
                parsed, _ = parse_item("tool", Path(record.path))
                if isinstance(parsed, ToolManifest):
                    tools[parsed.tool_id] = parsed
        return tools


def _head(path: Path) -> str:
    try:
        return read_item_bytes(path, head=2048).decode("utf-8", errors="replace")
    except OSError:
        return ""
