//! Owner tokens: who holds a lock.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

pub(crate) const SHORT_ID_LEN: usize = 8;

/// The identity of a lock owner: a random (version 4) UUID, 122 random bits, written as 32
/// lowercase hex digits.
///
/// Every [`lock`](crate::Mutex::lock) makes a new owner, so two calls never share ownership by
/// accident. A holder re-enters with [`MutexGuard::reenter`](crate::MutexGuard::reenter), or
/// carries the token (as a string) to another task or process and calls
/// [`Mutex::lock_as`](crate::Mutex::lock_as) there.
///
/// The token is a capability: whoever has it can re-enter and release the lock. Its `Debug`
/// output is redacted and redlatch never logs it; `Display` writes it out in full, for the
/// places where you mean to hand it on.
///
/// ```
/// use redlatch::OwnerToken;
///
/// let owner = OwnerToken::new();
/// let carried = owner.to_string();
/// assert_eq!(carried.len(), 32);
/// assert_eq!(carried.parse::<OwnerToken>().unwrap(), owner);
/// assert_eq!(format!("{owner:?}"), "OwnerToken(..)");
/// assert!("not a token".parse::<OwnerToken>().is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(uuid::Uuid);

impl OwnerToken {
    /// A new random owner.
    ///
    /// ```
    /// let (a, b) = (redlatch::OwnerToken::new(), redlatch::OwnerToken::new());
    /// assert_ne!(a, b);
    /// ```
    pub fn new() -> Self {
        Self(uuid::Uuid::new_v4())
    }

    /// The first 8 hex digits: how [`LockClient::inspect`](crate::LockClient::inspect) names
    /// holders and waiters. Enough to tell owners apart, not enough to act as one.
    ///
    /// ```
    /// let owner = redlatch::OwnerToken::new();
    /// assert!(owner.to_string().starts_with(&owner.short_id()));
    /// ```
    pub fn short_id(&self) -> String {
        let mut id = self.as_field();
        id.truncate(SHORT_ID_LEN);
        id
    }

    pub(crate) fn as_field(&self) -> String {
        let mut buf = [0u8; uuid::fmt::Simple::LENGTH];
        self.0.simple().encode_lower(&mut buf).to_owned()
    }
}

impl Default for OwnerToken {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OwnerToken(..)")
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.simple(), f)
    }
}

impl FromStr for OwnerToken {
    type Err = Error;

    /// Parses the 32-hex-digit form; a UUID's other forms (hyphenated, braced, `urn:uuid:`) are
    /// accepted too, and read as the same token.
    fn from_str(s: &str) -> Result<Self, Error> {
        uuid::Uuid::try_parse(s)
            .map(Self)
            .map_err(|_| Error::invalid("owner token", "expected 32 hex digits (a UUID)"))
    }
}
