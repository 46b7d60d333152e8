//! Shared by the CLI's test binaries: the default model's path, and a `folio serve`
//! child process on a free port: its address and ready line, its stderr kept (for
//! failure messages; the log says which snapshot was restored), SIGKILL on demand,
//! killed when dropped.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

pub fn model() -> PathBuf {
    let p = std::env::var_os("FOLIO_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup.sh",
        p.display()
    );
    p
}

pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    /// The line that said the server is ready.
    pub ready_line: String,
    stderr: Arc<Mutex<String>>,
}

/// `folio serve --port 0 ARGS` (info logs on), ready when this returns.
pub fn start(args: &[&str]) -> Server {
    start_with(Command::new(env!("CARGO_BIN_EXE_folio")), args)
}

/// `folio serve` under `prlimit --fsize=BYTES`: files it writes cannot grow past
/// `bytes` (writes past it fail with EFBIG, as on a full disk).
pub fn start_limited(fsize: u64, args: &[&str]) -> Server {
    let mut cmd = Command::new("prlimit");
    cmd.arg(format!("--fsize={fsize}:{fsize}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_folio"));
    start_with(cmd, args)
}

fn start_with(mut cmd: Command, args: &[&str]) -> Server {
    let mut child = cmd
        .args(["serve", "--port", "0"])
        .args(args)
        .env("FOLIO_MODEL", model())
        .env("FOLIO_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn folio serve");
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut err_pipe = child.stderr.take().unwrap();
    let sink = Arc::clone(&stderr);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = err_pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let (tx, rx) = mpsc::channel();
    let out_pipe = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out_pipe).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let mut server = Server {
        child,
        addr: "127.0.0.1:1".parse().unwrap(),
        ready_line: String::new(),
        stderr,
    };
    let line = rx
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|e| {
            panic!(
                "no ready line from folio serve ({e}); stderr:\n{}",
                server.stderr()
            )
        });
    server.addr = line
        .split_once("at http://")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected ready line: {line:?}"));
    server.ready_line = line;
    server
}

impl Server {
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The log once it holds `needle`, or as it is after `within`. The server writes
    /// its log on its own threads and this reads it on another, so a line written
    /// before an answer (a snapshot restored at start) may arrive after it.
    pub fn stderr_with(&self, needle: &str, within: Duration) -> String {
        let until = std::time::Instant::now() + within;
        loop {
            let log = self.stderr();
            if log.contains(needle) || std::time::Instant::now() >= until {
                return log;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Resident memory in KiB (VmRSS), if the process still runs.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
