//! The workspace's binaries (`acemq`, `acemq-memory`) as the suites run
//! them: child processes found beside the test's own executable, built
//! there first when missing or stale, waited for under a deadline, their
//! output collected whatever its size.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long building a binary may take.
const BUILD_LIMIT: Duration = Duration::from_secs(600);

/// `target/<profile>/`, where this test's executable lives (in `deps/`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut dir = exe.parent().expect("the test binary's directory");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("the profile directory");
    }
    dir.to_path_buf()
}

/// Whether `path`, or a file under it, was modified after `time`.
fn newer_than(path: &Path, time: std::time::SystemTime) -> bool {
    let Ok(meta) = path.metadata() else { return false };
    if meta.is_dir() {
        std::fs::read_dir(path)
            .map(|entries| entries.flatten().any(|e| newer_than(&e.path(), time)))
            .unwrap_or(false)
    } else {
        meta.modified().is_ok_and(|m| m > time)
    }
}

/// The binary `name` beside this test's own, built there first (`cargo
/// build <args>`) when it is missing or older than one of `sources`
/// (paths from the repository's root): `cargo test` does not build
/// another package's binary.
fn binary(name: &str, sources: &[&str], args: &[&str]) -> PathBuf {
    let profile = profile_dir();
    let binary = profile.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let stale = match binary.metadata().and_then(|m| m.modified()) {
        Ok(built) => sources.iter().any(|s| newer_than(&root.join(s), built)),
        Err(_) => true,
    };
    if stale {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .arg("build")
            .arg("--quiet")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("CARGO_TARGET_DIR", profile.parent().expect("the target directory"));
        if profile.ends_with("release") {
            build.arg("--release");
        }
        let mut child = build.spawn().expect("cargo starts");
        let status = wait_for(&mut child, BUILD_LIMIT, &format!("cargo build of {name}"));
        assert!(status.success(), "building {name} failed: {status}");
    }
    assert!(binary.exists(), "no binary at {}", binary.display());
    binary
}

/// The operator CLI, `acemq` (package acemq-cli).
pub fn acemq() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        binary(
            "acemq",
            &[
                "acemq-core/cli/src",
                "acemq-core/cli/Cargo.toml",
                "acemq-core/src",
                "acemq-core/Cargo.toml",
                "amqp-codec/src",
                "amqp-codec/Cargo.toml",
            ],
            &["-p", "acemq-cli", "--bin", "acemq"],
        )
    })
}

/// The broker as a server, `acemq-memory`.
pub fn acemq_memory() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        binary(
            "acemq-memory",
            &[
                "acemq-memory/src",
                "acemq-memory/Cargo.toml",
                "amqp-codec/src",
                "amqp-codec/Cargo.toml",
            ],
            &["-p", "acemq-memory", "--bin", "acemq-memory"],
        )
    })
}

/// Waits for `child` to exit, killing it and failing after `limit`.
pub fn wait_for(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Everything `pipe` says, collected by a thread (so that a full pipe
/// never blocks the child).
pub fn drain(mut pipe: impl Read + Send + 'static) -> (Arc<Mutex<String>>, std::thread::JoinHandle<()>) {
    let text = Arc::new(Mutex::new(String::new()));
    let sink = text.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (text, reader)
}

/// One run of the `acemq` binary: its arguments, exit code and output.
pub struct Run {
    /// The command line after `acemq`.
    pub args: Vec<String>,
    /// The exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "acemq {:?} exited {:?}\n--- stdout\n{}--- stderr\n{}",
            self.args, self.code, self.stdout, self.stderr
        )
    }
}

impl Run {
    /// Fails the test unless it exited with `code`.
    pub fn assert_code(&self, code: i32) -> &Run {
        assert_eq!(self.code, Some(code), "{self:?}");
        self
    }

    /// Its stdout as one JSON document (failing the test if it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
}

/// Runs `acemq ARGS` with `AMQP_URL` = `url` (unset when `None`) and
/// `AMQP_CA_FILE` unset, `input` on its stdin (closed when `None`), failing
/// the test after `limit`.
pub async fn run_acemq(url: Option<&str>, args: &[&str], input: Option<Vec<u8>>, limit: Duration) -> Run {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let url = url.map(str::to_string);
    let label = format!("acemq {}", args.join(" "));
    crate::step(
        label,
        tokio::task::spawn_blocking(move || {
            let mut command = Command::new(acemq());
            command
                .args(&args)
                .env_remove("AMQP_URL")
                .env_remove("AMQP_CA_FILE")
                .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if let Some(url) = &url {
                command.env("AMQP_URL", url);
            }
            let mut child = command.spawn().expect("acemq starts");
            if let Some(input) = input {
                let mut stdin = child.stdin.take().expect("a piped stdin");
                // A writer of its own: a CLI that does not read must not
                // block the test past its limit.
                std::thread::spawn(move || {
                    use std::io::Write;
                    let _ = stdin.write_all(&input);
                });
            }
            let (stdout, out_reader) = drain(child.stdout.take().expect("a piped stdout"));
            let (stderr, err_reader) = drain(child.stderr.take().expect("a piped stderr"));
            let status = wait_for(&mut child, limit, &format!("acemq {args:?}"));
            let _ = out_reader.join();
            let _ = err_reader.join();
            let text = |t: Arc<Mutex<String>>| t.lock().unwrap_or_else(|p| p.into_inner()).clone();
            Run {
                args,
                code: status.code(),
                stdout: text(stdout),
                stderr: text(stderr),
            }
        }),
    )
    .await
    .expect("the CLI's runner does not panic")
}
