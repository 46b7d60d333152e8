//! `folio serve` as its real clients see it, in a venv at `target/openai-venv` (made
//! and filled on first use): the official `openai` Python package runs
//! scripts/test_openai.py against a server started from the built binary, which must
//! then stop cleanly on SIGTERM; the official `anthropic` package runs
//! scripts/test_anthropic.py against the Messages API; the `openai` package runs
//! scripts/test_responses.py against the Responses API; and Debian's headless `chromium`, driven by
//! selenium through `chromedriver`, uses the web page (scripts/test_web.py). Needs
//! python3 (and PyPI the first time); the browser test needs `chromium` and
//! `chromium-driver` (scripts/test.sh installs them).

#[allow(dead_code)]
#[path = "common/server.rs"]
mod server;

use server::Server;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

const SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The cargo target folder the binary was built in (`target/release/folio` → `target`).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_folio"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| repo().join("target"))
}

fn show(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The venv's python, with `package` importable: the venv and the package are made
/// the first time only.
fn venv_python(package: &str) -> PathBuf {
    // The tests of this file run at once and share the venv: one makes or fills it
    // at a time (two `python3 -m venv --clear` at once leave it without pip).
    static VENV: Mutex<()> = Mutex::new(());
    let _one = VENV.lock().unwrap_or_else(|e| e.into_inner());
    let found = Command::new("python3").arg("--version").output();
    assert!(
        matches!(&found, Ok(o) if o.status.success()),
        "python3 is needed to run the official openai client against `folio serve` \
         (install python3 with its venv module): {found:?}"
    );
    let venv = target_dir().join("openai-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        let out = Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv)
            .output()
            .expect("run python3 -m venv");
        assert!(
            out.status.success(),
            "python3 -m venv {} failed (is python3-venv installed?): {}",
            venv.display(),
            show(&out)
        );
    }
    let has_openai = |python: &Path| {
        Command::new(python)
            .args(["-c", &format!("import {package}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has_openai(&python) {
        eprintln!("installing the {package} package into {}", venv.display());
        let out = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                package,
            ])
            .output()
            .expect("run pip");
        assert!(
            out.status.success(),
            "pip install {package} into {} failed: {}",
            venv.display(),
            show(&out)
        );
        assert!(
            has_openai(&python),
            "pip installed {package} but {} cannot import it",
            python.display()
        );
    }
    python
}

/// Starts `folio serve` on a free port; returns it and the OpenAI base URL its ready
/// line gives (`http://127.0.0.1:PORT/v1`).
fn start() -> (Server, String) {
    let server = server::start(&[]);
    let line = &server.ready_line;
    let url = line
        .split_once("(OpenAI API: ")
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .filter(|u| u.starts_with("http://") && u.ends_with("/v1"))
        .unwrap_or_else(|| panic!("unexpected ready line: {line:?}"))
        .to_string();
    assert!(
        line.starts_with("folio: serving "),
        "unexpected ready line: {line:?}"
    );
    (server, url)
}

/// Sends SIGTERM and waits for the server to exit.
fn terminate(server: &mut Server) -> ExitStatus {
    let pid = server.child.id().to_string();
    let sent = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -TERM {pid} failed: {sent}");
    let deadline = Instant::now() + EXIT_TIMEOUT;
    loop {
        if let Some(status) = server.child.try_wait().expect("wait for folio serve") {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "folio serve still runs {EXIT_TIMEOUT:?} after SIGTERM; stderr:\n{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `cmd` to the end, killing it after `limit`.
fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the script");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait for the script"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("the script ran past {limit:?} and was killed");
        }
    }
}

/// Runs `scripts/{script}` with `python` against `url` to its end; fails with the
/// server's log when the script does.
fn run_script(python: &Path, script: &str, url: &str, server: &Server) {
    let script = repo().join("scripts").join(script);
    let mut cmd = Command::new(python);
    cmd.arg(&script)
        .arg(url)
        .env("PYTHONUNBUFFERED", "1")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost");
    for var in [
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
    ] {
        cmd.env_remove(var);
    }
    let out = output_within(cmd, SCRIPT_TIMEOUT);
    println!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "{} {url} failed ({}); server stderr:\n{}",
        script.display(),
        out.status,
        server.stderr()
    );
}

#[test]
fn official_anthropic_client_against_the_messages_api() {
    let python = venv_python("anthropic");
    let (mut server, url) = start();
    let root = url
        .strip_suffix("/v1")
        .expect("the ready line's URL ends in /v1");
    run_script(&python, "test_anthropic.py", root, &server);
    assert!(terminate(&mut server).success());
}

#[test]
fn official_openai_client_against_the_responses_api() {
    let python = venv_python("openai");
    venv_python("jsonschema");
    let (mut server, url) = start();
    run_script(&python, "test_responses.py", &url, &server);
    assert!(terminate(&mut server).success());
}

#[test]
fn official_openai_client_against_the_real_server() {
    let began = Instant::now();
    let python = venv_python("openai");
    venv_python("jsonschema");
    let (mut server, url) = start();
    eprintln!("folio serve is ready at {url} ({:.1?})", began.elapsed());
    run_script(&python, "test_openai.py", &url, &server);

    let status = terminate(&mut server);
    assert!(
        status.success(),
        "folio serve exited with {status} after SIGTERM; stderr:\n{}",
        server.stderr()
    );
    eprintln!(
        "the official openai client passed; the server stopped on SIGTERM ({:.1?} in all)",
        began.elapsed()
    );
}

#[test]
fn the_web_page_in_headless_chromium() {
    for tool in ["chromium", "chromedriver"] {
        let found = Command::new(tool).arg("--version").output();
        assert!(
            matches!(&found, Ok(o) if o.status.success()),
            "{tool} is needed for the web page test: apt-get install chromium chromium-driver \
             (scripts/test.sh does): {found:?}"
        );
    }
    let python = venv_python("selenium");
    let (mut server, url) = start();
    let base = url.trim_end_matches("/v1").to_string();
    let shots = target_dir().join("web");
    std::fs::create_dir_all(&shots).expect("make target/web");
    let mut cmd = Command::new(&python);
    cmd.arg(repo().join("scripts/test_web.py"))
        .arg(&base)
        .arg(&shots)
        .env("PYTHONUNBUFFERED", "1")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost");
    let out = output_within(cmd, SCRIPT_TIMEOUT);
    println!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the web page test failed ({}); server stderr:\n{}",
        out.status,
        server.stderr()
    );
    assert!(terminate(&mut server).success());
}
