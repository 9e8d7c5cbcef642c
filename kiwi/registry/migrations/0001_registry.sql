-- Kiwi's shared registry, migration 0001: publishers, items (directives, tools, knowledge), immutable
-- versions with their hash and signatures, a tool's files, full-text search, row-level security.
-- Applied by `kiwi registry migrate` (any PostgreSQL >= 14) or `supabase db push` (deploy/supabase).

-- Who may publish: a namespace per publisher, the database role that acts for it, and the public key
-- its items are signed with (Ed25519, as `kiwi keys list` shows it).
create table if not exists kiwi_publishers (
    namespace text primary key check (namespace ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    role_name text not null unique,
    key_name text not null,
    public_key text not null,
    created_at timestamptz not null default now()
);

-- One row per item id, owned by the namespace that first published it (the seed's tables).
create table if not exists directives (
    id text primary key check (id ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'),
    namespace text not null references kiwi_publishers (namespace),
    created_at timestamptz not null default now()
);
create table if not exists tools (like directives including all);
alter table tools drop constraint if exists tools_namespace_fkey;
alter table tools add constraint tools_namespace_fkey foreign key (namespace) references kiwi_publishers (namespace);
create table if not exists knowledge (like directives including all);
alter table knowledge drop constraint if exists knowledge_namespace_fkey;
alter table knowledge add constraint knowledge_namespace_fkey foreign key (namespace) references kiwi_publishers (namespace);

-- Every published version, immutable but for its yanked flag and download count.
create table if not exists item_versions (
    item_type text not null check (item_type in ('directive', 'tool', 'knowledge')),
    item_id text not null,
    version text not null check (version ~ '^[0-9]{1,9}\.[0-9]{1,9}\.[0-9]{1,9}$'),
    version_order integer[] not null,
    namespace text not null references kiwi_publishers (namespace),
    description text not null default '',
    category text not null default '',
    tags text not null default '',
    content text not null,                 -- the item's main file, its signature line included
    content_hash text not null,            -- SHA-256 of every file (see kiwi.registry.bundle_hash)
    bundle_signature text not null,        -- the publisher's Ed25519 signature over that hash
    signer text not null,
    size_bytes integer not null,
    yanked boolean not null default false,
    published_at timestamptz not null default now(),
    search tsvector generated always as (
        setweight(to_tsvector('english', replace(replace(item_id, '_', ' '), '-', ' ')), 'A')
        || setweight(to_tsvector('english', description), 'B')
        || setweight(to_tsvector('english', category || ' ' || tags), 'B')
        || setweight(to_tsvector('english', left(content, 100000)), 'D')
    ) stored,
    primary key (item_type, item_id, version)
);
create index if not exists item_versions_search on item_versions using gin (search);
create index if not exists item_versions_latest on item_versions (item_type, item_id, version_order desc);

-- A tool's other files (tool.yaml is the version's content).
create table if not exists tool_version_files (
    item_type text not null default 'tool' check (item_type = 'tool'),
    item_id text not null,
    version text not null,
    path text not null check (path !~ '(^/|\.\.)'),
    content text not null,
    primary key (item_id, version, path),
    foreign key (item_type, item_id, version) references item_versions (item_type, item_id, version)
);

-- The namespace of the role running the statement, and the owner of an item id.
-- Every name in these functions is schema-qualified and their search_path is fixed, so a role cannot
-- shadow kiwi_publishers (or any table here) with a temporary table of its own to pass the policies.
create or replace function kiwi_my_namespace() returns text
    language sql stable set search_path = pg_catalog, public as $$
    select namespace from public.kiwi_publishers where role_name = current_user $$;

create or replace function kiwi_item_namespace(kind text, item text) returns text
    language sql stable set search_path = pg_catalog, public as $$
    select case kind
        when 'directive' then (select namespace from public.directives where id = item)
        when 'tool' then (select namespace from public.tools where id = item)
        when 'knowledge' then (select namespace from public.knowledge where id = item)
    end $$;

revoke execute on function kiwi_my_namespace(), kiwi_item_namespace(text, text) from public;

-- Downloads: one row per version and role that pulled it (the role is the database's, not the caller's
-- say), so a count is of distinct pullers and no reader can inflate it by calling anything again.
create table if not exists kiwi_downloads (
    item_type text not null,
    item_id text not null,
    version text not null,
    role_name text not null default current_user,
    downloaded_at timestamptz not null default now(),
    primary key (item_type, item_id, version, role_name),
    foreign key (item_type, item_id, version) references item_versions (item_type, item_id, version)
);

-- Roles: everyone reads; publishers insert under their own namespace and yank their own versions.
do $$ begin
    if not exists (select from pg_roles where rolname = 'kiwi_reader') then create role kiwi_reader nologin; end if;
    if not exists (select from pg_roles where rolname = 'kiwi_publisher') then create role kiwi_publisher nologin; end if;
end $$;
grant kiwi_reader to kiwi_publisher;
grant select on kiwi_publishers, directives, tools, knowledge, item_versions, tool_version_files to kiwi_reader;
grant execute on function kiwi_my_namespace(), kiwi_item_namespace(text, text) to kiwi_reader;
grant select on kiwi_downloads to kiwi_reader;
grant insert (item_type, item_id, version) on kiwi_downloads to kiwi_reader;
grant insert (id, namespace) on directives, tools, knowledge to kiwi_publisher;
-- Content columns only: yanked and published_at keep their defaults.
grant insert (item_type, item_id, version, version_order, namespace, description, category, tags, content,
    content_hash, bundle_signature, signer, size_bytes) on item_versions to kiwi_publisher;
grant insert on tool_version_files to kiwi_publisher;
grant update (yanked) on item_versions to kiwi_publisher;

alter table kiwi_publishers enable row level security;
alter table directives enable row level security;
alter table tools enable row level security;
alter table knowledge enable row level security;
alter table item_versions enable row level security;
alter table tool_version_files enable row level security;
alter table kiwi_downloads enable row level security;

drop policy if exists read_all on kiwi_publishers;
create policy read_all on kiwi_publishers for select using (true);
drop policy if exists read_all on directives;
create policy read_all on directives for select using (true);
drop policy if exists read_all on tools;
create policy read_all on tools for select using (true);
drop policy if exists read_all on knowledge;
create policy read_all on knowledge for select using (true);
drop policy if exists read_all on item_versions;
create policy read_all on item_versions for select using (true);
drop policy if exists read_all on tool_version_files;
create policy read_all on tool_version_files for select using (true);
drop policy if exists read_all on kiwi_downloads;
create policy read_all on kiwi_downloads for select using (true);
drop policy if exists own_download on kiwi_downloads;
create policy own_download on kiwi_downloads for insert with check (role_name = current_user);

drop policy if exists own_namespace on directives;
create policy own_namespace on directives for insert with check (namespace = kiwi_my_namespace());
drop policy if exists own_namespace on tools;
create policy own_namespace on tools for insert with check (namespace = kiwi_my_namespace());
drop policy if exists own_namespace on knowledge;
create policy own_namespace on knowledge for insert with check (namespace = kiwi_my_namespace());
drop policy if exists own_namespace on item_versions;
create policy own_namespace on item_versions for insert
    with check (namespace = kiwi_my_namespace() and kiwi_item_namespace(item_type, item_id) = namespace);
drop policy if exists own_yank on item_versions;
create policy own_yank on item_versions for update
    using (namespace = kiwi_my_namespace()) with check (namespace = kiwi_my_namespace());
drop policy if exists own_files on tool_version_files;
create policy own_files on tool_version_files for insert
    with check (kiwi_item_namespace('tool', item_id) = kiwi_my_namespace());
