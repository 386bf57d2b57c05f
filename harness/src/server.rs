//! A redis-server process for tests, examples and benchmarks: started on a free loopback port
//! (retrying on a port clash), killed on drop, and able to be killed, paused and restarted. It
//! uses only the standard library.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where to find the binary: `REDLATCH_REDIS_SERVER`, else `redis-server` on `PATH`.
pub(crate) fn binary() -> String {
    std::env::var("REDLATCH_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// The server `url` names, or, without one, a server of our own: what the examples, the
/// benchmarks and the command-line tool run against. Keep the server alive while the URL is used.
///
/// # Errors
///
/// Why no server of our own could be started (redis-server missing, or not answering), with an
/// install hint.
pub fn try_named_or_own(url: Option<String>) -> Result<(Option<RedisServer>, String), String> {
    match url.filter(|u| !u.is_empty()) {
        Some(url) => Ok((None, url)),
        None => {
            let server = RedisServer::try_start()?;
            let url = server.url();
            Ok((Some(server), url))
        }
    }
}

/// [`try_named_or_own`] for programs that do not handle the failure: it is printed on stderr
/// and the process exits with status 1 (no panic).
pub fn named_or_own(url: Option<String>) -> (Option<RedisServer>, String) {
    try_named_or_own(url).unwrap_or_else(|err| {
        eprintln!("{err}");
        std::process::exit(1)
    })
}

/// Why a start attempt failed: for good (the binary cannot be run), or on this port only.
enum SpawnError {
    Fatal(String),
    Port(String),
}

/// A redis-server child process owned by the caller.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free loopback port. Panics, with an install hint, if redis-server
    /// cannot be run.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line arguments (`["--maxmemory", "1mb"]`, ...).
    /// Panics, with an install hint, if redis-server cannot be run.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::try_start_with(extra).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`start`](Self::start) that returns the failure instead of panicking.
    pub fn try_start() -> Result<Self, String> {
        Self::try_start_with(&[])
    }

    /// [`start_with`](Self::start_with) that returns the failure (redis-server missing or not
    /// answering, with an install hint) instead of panicking.
    pub fn try_start_with(extra: &[&str]) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!(
            "redlatch-redis-{}-{}",
            std::process::id(),
            uuid_like()
        ));
        let mut last_error = String::new();
        for _ in 0..10 {
            let port = free_port();
            let mut server = Self {
                child: None,
                port,
                dir: dir.clone(),
                extra: extra.iter().map(|s| s.to_string()).collect(),
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                // Dropping `server` removes the directory (`spawn` makes it again).
                Err(SpawnError::Fatal(e)) => return Err(e),
                Err(SpawnError::Port(e)) => last_error = e,
            }
        }
        Err(format!(
            "redis-server did not start after 10 ports: {last_error}"
        ))
    }

    fn spawn(&mut self) -> Result<(), SpawnError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| {
            SpawnError::Fatal(format!(
                "cannot create {} for redis-server: {e}",
                self.dir.display()
            ))
        })?;
        let log = self.dir.join("redis.log");
        let child = Command::new(binary())
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                SpawnError::Fatal(format!(
                    "cannot run `{}` ({e}). Install Redis first: `apt-get install -y redis-server` \
                     (Debian/Ubuntu) or `brew install redis`, or set REDIS_URL (`redlatch`: --url) to a server \
                     to use, or REDLATCH_REDIS_SERVER to the binary.",
                    binary()
                ))
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(SpawnError::Port(format!(
                    "redis-server exited with {status}: {log}"
                )));
            }
            // Another process may have taken the port between its choice and the bind (a
            // proxy, another test's server): the server that answers must be this child.
            if ping(self.port) && self.answers_as_own() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        Err(SpawnError::Port(format!(
            "redis-server on port {} did not answer PING",
            self.port
        )))
    }

    /// Whether the server on the port is this one: its working directory is this server's own
    /// (`CONFIG GET dir`; unique to it, and true of a wrapped binary too).
    fn answers_as_own(&self) -> bool {
        let own = std::fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone());
        config_dir(self.port).is_some_and(|dir| std::path::Path::new(&dir) == own)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Whether the process is running (not killed, or restarted since).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            if self.spawn().is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let status = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status()
                .expect("run kill");
            assert!(status.success(), "kill {signal} failed");
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume();
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a loopback port")
}

/// The working directory of the server on `port` (`CONFIG GET dir`).
fn config_dir(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    stream.write_all(b"CONFIG GET dir\r\n").ok()?;
    // `*2`, then two bulk strings (`$<length>`, the text): `dir` and the path.
    let mut reader = std::io::BufReader::new(stream);
    let mut line = || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut reader, &mut line).ok()?;
        Some(line.trim_end().to_owned())
    };
    (line()? == "*2").then_some(())?;
    line()?;
    (line()? == "dir").then_some(())?;
    line()?;
    line()
}

pub(crate) fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{nanos:x}")
}
