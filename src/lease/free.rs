//! [`FreeNames`]: the names a client last saw free, where its next fresh acquisition is tried
//! in one round trip of plain commands before any script.

use std::collections::HashMap;
use std::sync::Mutex as StdMutex;

/// At most this many names are kept; the set starts afresh when it is full.
const MOST: usize = 4096;

/// The keys of the names this client last saw free: its last acquisition there found nobody
/// else holding, and its last release there told nobody. Their next fresh acquisition is tried
/// in plain commands (the protocol's `Take`), which cost the server a fraction of a script but
/// cannot wait, queue or re-enter; every other name begins with its script, so a busy name
/// costs no extra round trip. With each name, the last fencing token this client issued there
/// (the end of the block it took), which the next proposal must pass.
#[derive(Debug, Default)]
pub(crate) struct FreeNames(StdMutex<HashMap<String, u64>>);

impl FreeNames {
    /// The last token this client issued at the name whose main key is `key`, if it last saw
    /// the name free (0 when it did not keep one).
    pub(crate) fn last(&self, key: &str) -> Option<u64> {
        self.map().get(key).copied()
    }

    /// The name whose main key is `key` was seen taken by others, or in a state unknown.
    pub(crate) fn forget(&self, key: &str) {
        self.map().remove(key);
    }

    /// The name whose main key is `key` was seen free; `last`, the last token this client
    /// issued there, if it knows.
    pub(crate) fn note(&self, key: &str, last: u64) {
        let mut map = self.map();
        if let Some(kept) = map.get_mut(key) {
            *kept = (*kept).max(last);
            return;
        }
        if map.len() >= MOST {
            map.clear();
        }
        map.insert(key.to_owned(), last);
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        // Every update is one insert, remove, assignment or clear: a poisoned lock still holds
        // a valid map.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_and_go_and_the_set_stays_bounded() {
        let free = FreeNames::default();
        assert_eq!(free.last("a"), None);
        free.note("a", 7);
        assert_eq!(free.last("a"), Some(7));
        free.note("a", 3);
        assert_eq!(free.last("a"), Some(7), "the last token never goes back");
        free.forget("a");
        assert_eq!(free.last("a"), None);
        for i in 0..MOST + 10 {
            free.note(&i.to_string(), 0);
        }
        assert!(free.map().len() <= MOST);
        assert_eq!(free.last(&(MOST + 9).to_string()), Some(0));
    }
}
