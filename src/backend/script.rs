//! A Lua script and one call of it: run by SHA (`EVALSHA`), or by source (`EVAL`) on a server
//! whose script cache does not have it (`NOSCRIPT`: after a restart, a failover or a
//! `SCRIPT FLUSH`). `EVAL` runs and caches the script in one step, so no flush between a load
//! and a retry can fail the call.
//!
//! A call writes its keys and arguments straight into the command, keys first: a caller says
//! how many keys it will give, as `EVALSHA` wants the count before them.

use redis::{Cmd, ToRedisArgs};

/// One Lua script: its source and SHA1.
#[derive(Debug)]
pub(crate) struct Script {
    source: &'static str,
    hash: String,
}

/// How a call names its script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum By {
    /// `EVALSHA`: from the server's script cache.
    Hash,
    /// `EVAL`: the source, for a server that does not have it cached.
    Source,
}

impl Script {
    pub(crate) fn new(source: &'static str) -> Self {
        Self {
            source,
            hash: redis::Script::new(source).get_hash().to_owned(),
        }
    }

    /// The SHA1 of the source, as `EVALSHA` names it.
    #[cfg(test)]
    pub(crate) fn hash(&self) -> &str {
        &self.hash
    }

    /// `SCRIPT LOAD` of this script.
    pub(crate) fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source);
        cmd
    }

    /// A call of this script, named `by` hash or source, that will be given `keys` keys and
    /// then its arguments.
    pub(crate) fn call(&self, by: By, keys: usize) -> Call {
        // Room for the usual call without growing: a few keys and a dozen short arguments.
        let (verb, script) = match by {
            By::Hash => ("EVALSHA", self.hash.as_str()),
            By::Source => ("EVAL", self.source),
        };
        let mut cmd = Cmd::with_capacity(16 + 2 * keys, 256 + 64 * keys + script.len());
        cmd.arg(verb).arg(script).arg(keys);
        Call {
            cmd,
            keys_left: keys,
        }
    }
}

/// A script call being written: its keys, then its arguments.
#[derive(Debug)]
pub(crate) struct Call {
    cmd: Cmd,
    /// Keys still to come before the first argument.
    keys_left: usize,
}

impl Call {
    pub(crate) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        debug_assert!(self.keys_left > 0, "more keys than the call was made for");
        self.keys_left = self.keys_left.saturating_sub(1);
        self.cmd.arg(key);
        self
    }

    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        debug_assert_eq!(self.keys_left, 0, "an argument before the last key");
        self.cmd.arg(arg);
        self
    }

    /// The command, ready to send.
    pub(crate) fn into_cmd(self) -> Cmd {
        debug_assert_eq!(self.keys_left, 0, "fewer keys than the call was made for");
        self.cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_names_its_keys_before_its_arguments() {
        let script = Script::new("return 1");
        assert_eq!(script.hash(), "e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
        let write = |by| {
            let mut call = script.call(by, 2);
            call.key("k1").key("k2").arg(7).arg("x");
            call.into_cmd().get_packed_command()
        };
        let expected = redis::cmd("EVALSHA")
            .arg(script.hash())
            .arg(2)
            .arg("k1")
            .arg("k2")
            .arg(7)
            .arg("x")
            .get_packed_command();
        assert_eq!(write(By::Hash), expected);
        let by_source = write(By::Source);
        assert!(String::from_utf8_lossy(&by_source).starts_with("*7\r\n$4\r\nEVAL\r\n"));
        assert!(String::from_utf8_lossy(&by_source).contains("return 1"));
    }
}
