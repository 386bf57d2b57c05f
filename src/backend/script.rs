//! A Lua script and one call of it: run by SHA (`EVALSHA`), or by source (`EVAL`) on a server
//! whose script cache does not have it (`NOSCRIPT`: after a restart, a failover or a
//! `SCRIPT FLUSH`). `EVAL` runs and caches the script in one step, so no flush between a load
//! and a retry can fail the call.
//!
//! A call writes its keys and arguments straight into the command, keys first: a caller says
//! how many keys it will give, as `EVALSHA` wants the count before them.

use redis::{Cmd, ToRedisArgs};

/// One Lua script in its two forms, which differ in how they publish wake-ups: with `PUBLISH`
/// (one server: every subscriber of the server hears it) or `SPUBLISH` (Redis Cluster: the
/// channel lives in the name's hash slot, and only that shard's subscribers hear it). Each form
/// is its file(s) after a one-line prelude that sets `PUBLISH` to the command.
///
/// A script that must run once per request runs its code through `lua/v1/once_lib.lua` in the
/// forms its [`Logged`] says: each call of such a form carries one more key, the name's request
/// log (its first key and `:once`), and one more argument, a request id, so a request sent
/// again after a lost reply (by the cluster client, or by a wait that asks again) is answered
/// from the log instead of running again.
#[derive(Debug)]
pub(crate) struct Script {
    plain: Form,
    sharded: Form,
    logged: Logged,
}

/// Which forms of a script run through the request log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Logged {
    /// Neither: the script may run twice with the effect of once, or is never sent again.
    Never,
    /// The cluster form: the cluster client re-sends a request whose reply it lost (a
    /// release).
    Sharded,
    /// Both: a wait asks again after a lost answer on any server (an acquisition).
    Always,
}

#[derive(Debug)]
struct Form {
    source: &'static str,
    hash: String,
}

impl Form {
    fn new(source: &'static str) -> Self {
        Self {
            source,
            hash: redis::Script::new(source).get_hash().to_owned(),
        }
    }
}

/// How scripts publish their wake-ups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Publish {
    /// `PUBLISH`: one server.
    Plain,
    /// `SPUBLISH`: Redis Cluster's sharded channels.
    Sharded,
}

/// How a call names its script: by hash or source, and in which form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct By {
    /// `EVAL` with the source (for a server that does not have it cached) instead of
    /// `EVALSHA`.
    pub(crate) source: bool,
    /// The form of the script.
    pub(crate) publish: Publish,
}

impl By {
    /// `EVALSHA` of the `publish` form.
    pub(crate) const fn hash(publish: Publish) -> Self {
        Self {
            source: false,
            publish,
        }
    }

    /// The same form by `EVAL`: from the source (a call sent by hash is turned into this
    /// one with [`by_source`], which keeps its request id).
    #[cfg(test)]
    pub(crate) const fn source(self) -> Self {
        Self {
            source: true,
            ..self
        }
    }
}

impl Script {
    /// A script from its `PUBLISH` and `SPUBLISH` forms; `logged`: which of them are wrapped by
    /// the request log (they take one more key and one more argument).
    pub(crate) fn new(plain: &'static str, sharded: &'static str, logged: Logged) -> Self {
        Self {
            plain: Form::new(plain),
            sharded: Form::new(sharded),
            logged,
        }
    }

    fn form(&self, publish: Publish) -> &Form {
        match publish {
            Publish::Plain => &self.plain,
            Publish::Sharded => &self.sharded,
        }
    }

    /// The SHA1 of the `publish` form's source, as `EVALSHA` names it.
    #[cfg(test)]
    pub(crate) fn hash(&self, publish: Publish) -> &str {
        &self.form(publish).hash
    }

    /// `SCRIPT LOAD` of the `publish` form.
    pub(crate) fn load(&self, publish: Publish) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.form(publish).source);
        cmd
    }

    /// A call of this script, named `by` hash or source, that will be given `keys` keys and
    /// then its arguments.
    pub(crate) fn call(&self, by: By, keys: usize) -> Call {
        let form = self.form(by.publish);
        let (verb, script) = if by.source {
            ("EVAL", form.source)
        } else {
            ("EVALSHA", form.hash.as_str())
        };
        let once = match self.logged {
            Logged::Never => false,
            Logged::Sharded => by.publish == Publish::Sharded,
            Logged::Always => true,
        };
        // Room for the usual call without growing: a few keys and a dozen short arguments.
        let mut cmd = Cmd::with_capacity(16 + 2 * keys, 256 + 64 * keys + script.len());
        cmd.arg(verb).arg(script).arg(keys + usize::from(once));
        Call {
            cmd,
            keys_left: keys,
            once: once.then(Once::default),
            source: form.source,
        }
    }
}

/// A script call being written: its keys, then its arguments.
#[derive(Debug)]
pub(crate) struct Call {
    cmd: Cmd,
    /// Keys still to come before the first argument.
    keys_left: usize,
    /// For a script run once per request: its request log key, once known.
    once: Option<Once>,
    /// The source of the script's form, for [`by_source`].
    source: &'static str,
}

#[derive(Debug, Default)]
struct Once {
    /// The request log of the call's name: its first key and `:once`.
    log: Option<String>,
    /// The request may run twice with the effect of once: it is sent without an id, and the
    /// log is neither read nor written.
    repeatable: bool,
    /// The request's id, when the caller gives one (a request sent again after a lost answer
    /// carries the first one's); else a new one.
    id: Option<u128>,
}

impl Call {
    pub(crate) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        debug_assert!(self.keys_left > 0, "more keys than the call was made for");
        self.keys_left = self.keys_left.saturating_sub(1);
        if let Some(once) = &mut self.once
            && once.log.is_none()
        {
            let mut log = Vec::new();
            for arg in key.to_redis_args() {
                log.extend_from_slice(&arg);
            }
            log.extend_from_slice(b":once");
            once.log = Some(String::from_utf8_lossy(&log).into_owned());
        }
        self.cmd.arg(key);
        if self.keys_left == 0
            && let Some(Once { log: Some(log), .. }) = &self.once
        {
            self.cmd.arg(log.as_str());
        }
        self
    }

    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        debug_assert_eq!(self.keys_left, 0, "an argument before the last key");
        self.cmd.arg(arg);
        self
    }

    /// Marks a call of a script run once per request as one that may run twice with the
    /// effect of once (an acquisition for a fresh owner finds its own hold the second time):
    /// it skips the request log.
    pub(crate) fn repeatable(&mut self) -> &mut Self {
        if let Some(once) = &mut self.once {
            once.repeatable = true;
        }
        self
    }

    /// Gives a call run once per request the id `id` (the same for a request sent again after
    /// its answer was lost), rather than a new one.
    pub(crate) fn request_id(&mut self, id: Option<u128>) -> &mut Self {
        if let Some(once) = &mut self.once {
            once.id = id;
        }
        self
    }

    /// The command, ready to send, and the source of its script (for [`by_source`], should
    /// the server lack the script).
    pub(crate) fn into_parts(self) -> (Cmd, &'static str) {
        let source = self.source;
        (self.into_cmd(), source)
    }

    /// The command, ready to send (a call run once per request gets its request id last, or
    /// an empty one when it is repeatable).
    pub(crate) fn into_cmd(mut self) -> Cmd {
        debug_assert_eq!(self.keys_left, 0, "fewer keys than the call was made for");
        match &self.once {
            Some(Once {
                repeatable: true, ..
            }) => {
                self.cmd.arg("");
            }
            Some(Once { id, .. }) => {
                let id = id.unwrap_or_else(|| fastrand::u128(..));
                self.cmd.arg(format!("{id:032x}"));
            }
            None => {}
        }
        self.cmd
    }
}

/// The `EVAL` of `source` with the keys and arguments of `by_hash`, an `EVALSHA` call: for a
/// server that does not have the script cached.
pub(crate) fn by_source(by_hash: &Cmd, source: &str) -> Cmd {
    let mut cmd = Cmd::with_capacity(by_hash.args_iter().count(), source.len() + 256);
    cmd.arg("EVAL").arg(source);
    for arg in by_hash.args_iter().skip(2) {
        if let redis::Arg::Simple(bytes) = arg {
            cmd.arg(bytes);
        }
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_names_its_keys_before_its_arguments() {
        let script = Script::new("return 1", "return 2", Logged::Never);
        let plain = By::hash(Publish::Plain);
        assert_eq!(
            script.hash(Publish::Plain),
            "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
        );
        assert_ne!(script.hash(Publish::Sharded), script.hash(Publish::Plain));
        let write = |by| {
            let mut call = script.call(by, 2);
            call.key("k1").key("k2").arg(7).arg("x");
            call.into_cmd().get_packed_command()
        };
        let expected = redis::cmd("EVALSHA")
            .arg(script.hash(Publish::Plain))
            .arg(2)
            .arg("k1")
            .arg("k2")
            .arg(7)
            .arg("x")
            .get_packed_command();
        assert_eq!(write(plain), expected);
        let by_source = write(plain.source());
        assert!(String::from_utf8_lossy(&by_source).starts_with("*7\r\n$4\r\nEVAL\r\n"));
        assert!(String::from_utf8_lossy(&by_source).contains("return 1"));
        let mut call = script.call(plain, 2);
        call.key("k1").key("k2").arg(7).arg("x");
        let (cmd, source) = call.into_parts();
        assert_eq!(
            super::by_source(&cmd, source).get_packed_command(),
            by_source
        );
    }

    #[test]
    fn a_call_run_once_carries_its_request_log_and_an_id() {
        let script = Script::new("return 1", "return 2", Logged::Sharded);
        let write = |by| {
            let mut call = script.call(by, 2);
            call.key("p:{n}").key("p:{n}:fence").arg(7);
            call.into_cmd()
        };
        let args = |cmd: &redis::Cmd| -> Vec<String> {
            cmd.args_iter()
                .map(|a| match a {
                    redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => String::new(),
                })
                .collect()
        };
        let sharded = args(&write(By::hash(Publish::Sharded)));
        assert_eq!(sharded[2..6], ["3", "p:{n}", "p:{n}:fence", "p:{n}:once"]);
        assert_eq!(sharded[6], "7");
        assert_eq!(sharded[7].len(), 32, "a request id");
        let again = args(&write(By::hash(Publish::Sharded)));
        assert_ne!(sharded[7], again[7], "one id per request");
        let mut repeatable = script.call(By::hash(Publish::Sharded), 1);
        repeatable.key("p:{n}").repeatable().arg(1);
        assert_eq!(
            args(&repeatable.into_cmd())[2..],
            ["2", "p:{n}", "p:{n}:once", "1", ""]
        );
        // One server does not re-send: the plain form has neither.
        let plain = args(&write(By::hash(Publish::Plain)));
        assert_eq!(plain[2..], ["2", "p:{n}", "p:{n}:fence", "7"]);
        // A script logged in both forms: the plain form has both too, and a given id is kept.
        let both = Script::new("return 1", "return 2", Logged::Always);
        let mut call = both.call(By::hash(Publish::Plain), 1);
        call.key("p:{n}").arg(7).request_id(Some(0xab));
        assert_eq!(
            args(&call.into_cmd())[2..],
            ["2", "p:{n}", "p:{n}:once", "7", &format!("{:032x}", 0xab)]
        );
    }
}
