-- Every key a namespace has published with, not only its current one: a publisher who registers a new
-- key (kiwi registry add-publisher again) keeps the versions signed with the old one pullable. New
-- versions are still signed with the current key (kiwi_publishers.public_key); a key is taken out of
-- the history by the registry's owner (`delete from kiwi_publisher_keys where ...`), after which the
-- versions it signed are refused on pull.
create table if not exists kiwi_publisher_keys (
    namespace text not null references kiwi_publishers (namespace),
    key_name text not null,
    public_key text not null,
    added_at timestamptz not null default now(),
    primary key (namespace, key_name, public_key)
);
insert into kiwi_publisher_keys (namespace, key_name, public_key)
    select namespace, key_name, public_key from kiwi_publishers
    on conflict do nothing;

grant select on kiwi_publisher_keys to kiwi_reader;
alter table kiwi_publisher_keys enable row level security;
drop policy if exists read_all on kiwi_publisher_keys;
create policy read_all on kiwi_publisher_keys for select using (true);
