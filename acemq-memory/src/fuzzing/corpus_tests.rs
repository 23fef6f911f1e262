//! Replays the `broker` fuzz target's committed seeds
//! (`fuzz/corpus/broker/`) and saved crash inputs
//! (`fuzz/regressions/broker/`) through the entry point the target calls,
//! on stable, in every `cargo test` (unit tests: the harness is compiled
//! only for tests and fuzzing). A missing or empty corpus is a failure, so
//! this cannot silently check nothing.
//!
//! The seeds are written by `fuzzing::seeds()`:
//! `ACEMQ_WRITE_SEEDS=1 cargo test -p acemq-memory --lib fuzzing::corpus_tests`
//! rewrites them after the input format changes.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use crate::fuzzing;

fn dir(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(kind)
        .join("broker")
}

/// The files of `dir`, dotfiles (`.gitkeep`) left out; panics if it is missing.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|err| panic!("cannot read {}: {err}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file() && !path.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .collect();
    files.sort();
    files
}

/// Runs every file through the entry point; panics listing those that panicked.
fn replay(files: &[PathBuf]) {
    eprintln!("replaying {} inputs", files.len());
    let failed: Vec<String> = files
        .iter()
        .filter(|path| {
            let data = std::fs::read(path).expect("a readable input");
            catch_unwind(AssertUnwindSafe(|| fuzzing::client_bytes(&data))).is_err()
        })
        .map(|path| path.display().to_string())
        .collect();
    assert!(
        failed.is_empty(),
        "inputs that panicked (see above):\n{}",
        failed.join("\n")
    );
}

#[test]
fn the_seeds_are_the_committed_corpus() {
    let corpus = dir("corpus");
    if std::env::var("ACEMQ_WRITE_SEEDS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(&corpus).expect("the corpus directory");
        for (i, (name, bytes)) in fuzzing::seeds().iter().enumerate() {
            std::fs::write(corpus.join(format!("{i:02}-{name}")), bytes).expect("a seed written");
        }
    }
    for (i, (name, bytes)) in fuzzing::seeds().iter().enumerate() {
        let path = corpus.join(format!("{i:02}-{name}"));
        let on_disk =
            std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (ACEMQ_WRITE_SEEDS=1 writes it)", path.display()));
        assert_eq!(&on_disk, bytes, "{} differs from fuzzing::seeds()", path.display());
    }
}

#[test]
fn the_corpus_replays_without_panics() {
    let files = inputs(&dir("corpus"));
    assert!(!files.is_empty(), "the corpus {} is empty", dir("corpus").display());
    replay(&files);
}

#[test]
fn the_regressions_replay_without_panics() {
    replay(&inputs(&dir("regressions")));
}

/// The `served` target takes the same input as `broker` (a mode byte, then
/// the client's bytes): every seed goes through it too, read in each of
/// the three ways.
#[test]
fn the_corpus_replays_through_the_served_connection() {
    let files = inputs(&dir("corpus"));
    assert!(!files.is_empty(), "the corpus {} is empty", dir("corpus").display());
    let mut failed = Vec::new();
    for path in &files {
        let data = std::fs::read(path).expect("a readable input");
        for reading in [0u8, 1, 2] {
            let mut input = data.clone();
            if let Some(mode) = input.first_mut() {
                *mode = (*mode & !(3 << 3)) | (reading << 3);
            }
            if catch_unwind(AssertUnwindSafe(|| fuzzing::served_connection(&input))).is_err() {
                failed.push(format!("{} (reading {reading})", path.display()));
            }
        }
    }
    assert!(failed.is_empty(), "inputs that panicked:\n{}", failed.join("\n"));
}
