//! A Lua script and one call of it: run by SHA (`EVALSHA`), or by source (`EVAL`) on a server
//! whose script cache does not have it (`NOSCRIPT`: after a restart, a failover or a
//! `SCRIPT FLUSH`). `EVAL` runs and caches the script in one step, so no flush between a load
//! and a retry can fail the call.

use redis::{Cmd, ToRedisArgs};

/// One Lua script: its source and SHA1.
#[derive(Debug)]
pub(crate) struct Script {
    source: &'static str,
    hash: String,
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

    /// A call of this script with no keys or arguments yet.
    pub(crate) fn call(&self) -> Call<'_> {
        Call {
            script: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// A script call: its keys and arguments.
#[derive(Debug)]
pub(crate) struct Call<'a> {
    script: &'a Script,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Call<'_> {
    pub(crate) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    fn command(&self, verb: &str, script: &str) -> Cmd {
        let mut cmd = redis::cmd(verb);
        cmd.arg(script)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }

    /// `EVALSHA`: runs the script from the server's cache.
    pub(crate) fn by_hash(&self) -> Cmd {
        self.command("EVALSHA", &self.script.hash)
    }

    /// `EVAL`: sends the source, for a server that does not have it cached.
    pub(crate) fn by_source(&self) -> Cmd {
        self.command("EVAL", self.script.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_names_its_keys_before_its_arguments() {
        let script = Script::new("return 1");
        assert_eq!(script.hash(), "e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
        let mut call = script.call();
        call.key("k1").key("k2").arg(7).arg("x");
        let expected = redis::cmd("EVALSHA")
            .arg(script.hash())
            .arg(2)
            .arg("k1")
            .arg("k2")
            .arg(7)
            .arg("x")
            .get_packed_command();
        assert_eq!(call.by_hash().get_packed_command(), expected);
        let by_source = call.by_source().get_packed_command();
        assert!(String::from_utf8_lossy(&by_source).contains("return 1"));
    }
}
