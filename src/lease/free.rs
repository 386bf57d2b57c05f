//! [`FreeNames`]: the names a client last saw free, where its next fresh acquisition is tried
//! in one round trip of plain commands before any script.

use foldhash::HashMap;
use std::sync::Mutex as StdMutex;

/// At most this many names are kept; the set starts afresh when it is full.
const MOST: usize = 4096;

/// The names this client last saw free: its last acquisition there found nobody else holding,
/// its last release there left nobody holding or waiting, or a plain mutex's release that a
/// waiter of this client heard of left it free. Their next fresh acquisition is tried in plain
/// commands (the protocol's `Take`), which cost the server a fraction of a script but cannot
/// wait, queue or re-enter; every other name begins with its script, so a busy name costs no
/// extra round trip (but a woken waiter's, when the name was taken again meanwhile). With each
/// name, the last fencing token this client knows was issued there (the end of the block a
/// hold of its own took, or what a busy answer told of another owner's), which its next
/// proposal passes.
#[derive(Debug, Default)]
pub(crate) struct FreeNames(StdMutex<HashMap<String, Seen>>);

/// What the client last saw of a name.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    last: u64,
    free: bool,
}

impl FreeNames {
    /// The last token this client knows was issued at the name whose main key is `key`, if it
    /// last saw the name free (0 when it did not keep one).
    pub(crate) fn last(&self, key: &str) -> Option<u64> {
        self.map()
            .get(key)
            .filter(|seen| seen.free)
            .map(|seen| seen.last)
    }

    /// A hold of a fresh owner was granted at the name, with tokens up to `last` (0: none);
    /// `free`, the grant shows nobody else held it (a plain mutex's), else what was seen stands.
    pub(crate) fn granted(&self, key: &str, last: u64, free: bool) {
        self.update(key, |seen| {
            seen.last = seen.last.max(last);
            seen.free |= free;
        });
    }

    /// The name was found taken by others, or in a state unknown (an error).
    pub(crate) fn taken(&self, key: &str) {
        if let Some(seen) = self.map().get_mut(key) {
            seen.free = false;
        }
    }

    /// The name was found held by another owner; `last`, the last token issued there when the
    /// answer told it.
    pub(crate) fn busy(&self, key: &str, last: Option<u64>) {
        match last {
            Some(last) => self.update(key, |seen| {
                seen.last = seen.last.max(last);
                seen.free = false;
            }),
            None => self.taken(key),
        }
    }

    /// This client let a hold of the name go: `free` when it told nobody and left nobody
    /// holding or waiting.
    pub(crate) fn released(&self, key: &str, free: bool) {
        if free {
            self.freed(key);
        } else {
            self.taken(key);
        }
    }

    /// A release, heard by its wake-up message, left the name free: this client's next fresh
    /// acquisition there is tried in plain commands (what was seen of its tokens stands).
    pub(crate) fn freed(&self, key: &str) {
        self.update(key, |seen| seen.free = true);
    }

    fn update(&self, key: &str, change: impl FnOnce(&mut Seen)) {
        let mut map = self.map();
        if let Some(seen) = map.get_mut(key) {
            change(seen);
            return;
        }
        if map.len() >= MOST {
            map.clear();
        }
        let mut seen = Seen::default();
        change(&mut seen);
        map.insert(key.to_owned(), seen);
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        // Every update is one insert, assignment or clear: a poisoned lock still holds a valid
        // map.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_seen_of_a_name_is_kept_and_the_map_stays_bounded() {
        let free = FreeNames::default();
        assert_eq!(free.last("a"), None);
        free.granted("a", 7, true);
        assert_eq!(free.last("a"), Some(7));
        free.granted("a", 3, false);
        assert_eq!(free.last("a"), Some(7), "the last token never goes back");
        free.taken("a");
        assert_eq!(free.last("a"), None);
        free.released("a", true);
        assert_eq!(
            free.last("a"),
            Some(7),
            "the last token is kept while taken"
        );
        free.granted("b", 5, false);
        assert_eq!(
            free.last("b"),
            None,
            "a queued grant alone does not say free"
        );
        free.busy("c", Some(9));
        assert_eq!(free.last("c"), None, "busy is not free");
        free.freed("c");
        assert_eq!(
            free.last("c"),
            Some(9),
            "a busy answer's token is passed once the name is freed"
        );
        free.busy("c", Some(4));
        free.freed("c");
        assert_eq!(free.last("c"), Some(9), "the last token never goes back");
        for i in 0..MOST + 10 {
            free.released(&i.to_string(), true);
        }
        assert!(free.map().len() <= MOST);
        assert_eq!(free.last(&(MOST + 9).to_string()), Some(0));
    }
}
