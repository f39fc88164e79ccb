//! The Lua scripts beside this crate, one per operation, each touching the keys of one hash slot
//! (one key, or a record and its audit trail).
//! `redis::Script` runs them with EVALSHA and falls back to sending the body after a NOSCRIPT.

use redis::Script;
use std::sync::OnceLock;

/// What a reservation and a takeover share: how a new record is written.
const NEW_RECORD: &str = include_str!("../lua/new_record.lua");

pub(crate) struct Scripts {
    pub(crate) reserve: Script,
    pub(crate) replace: Script,
    pub(crate) complete: Script,
    pub(crate) release: Script,
    pub(crate) renew: Script,
    pub(crate) lookup: Script,
    pub(crate) list: Script,
    pub(crate) resolve: Script,
    pub(crate) reconciliations: Script,
}

pub(crate) fn scripts() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        reserve: Script::new(&[NEW_RECORD, include_str!("../lua/reserve.lua")].concat()),
        replace: Script::new(&[NEW_RECORD, include_str!("../lua/replace.lua")].concat()),
        complete: Script::new(include_str!("../lua/complete.lua")),
        release: Script::new(include_str!("../lua/release.lua")),
        renew: Script::new(include_str!("../lua/renew.lua")),
        lookup: Script::new(include_str!("../lua/lookup.lua")),
        list: Script::new(include_str!("../lua/list.lua")),
        resolve: Script::new(include_str!("../lua/resolve.lua")),
        reconciliations: Script::new(include_str!("../lua/reconciliations.lua")),
    })
}
