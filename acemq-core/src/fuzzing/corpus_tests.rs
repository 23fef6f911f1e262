//! Replays the committed seeds (`fuzz/corpus/<target>/`) and saved crash
//! inputs (`fuzz/regressions/<target>/`) of acemq-core's fuzz targets through
//! the entry points the targets call, on stable, in every `cargo test`:
//! `connection` (`crate::proto::fuzzing`) and `delivery`
//! (`crate::fuzzing`). Unit tests, because the harness is compiled only for
//! tests and fuzzing. A missing or empty corpus is a failure, so this
//! cannot silently check nothing.
//!
//! The seeds the generators write (`proto::fuzzing::seeds()`,
//! `fuzzing::seeds()`) must be in the corpus as written:
//! `ACEMQ_WRITE_SEEDS=1 cargo test -p acemq-core --lib fuzzing::corpus_tests` rewrites
//! them after an input format changes. The `delivery` corpus also keeps what
//! the fuzzer found (minimised with `cargo fuzz cmin`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use crate::fuzzing;
use crate::proto::fuzzing as proto_fuzzing;

/// A target: its name, its entry point and its seed generator.
struct Target {
    name: &'static str,
    entry: fn(&[u8]),
    seeds: fn() -> Vec<(&'static str, Vec<u8>)>,
}

const TARGETS: [Target; 2] = [
    Target {
        name: "connection",
        entry: proto_fuzzing::client_connection,
        seeds: proto_fuzzing::seeds,
    },
    Target {
        name: "delivery",
        entry: fuzzing::delivery,
        seeds: fuzzing::seeds,
    },
];

fn dir(kind: &str, target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(kind)
        .join(target)
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

/// Runs every file through `entry`; panics listing those that panicked.
fn replay(files: &[PathBuf], entry: fn(&[u8])) {
    eprintln!("replaying {} inputs", files.len());
    let failed: Vec<String> = files
        .iter()
        .filter(|path| {
            let data = std::fs::read(path).expect("a readable input");
            catch_unwind(AssertUnwindSafe(|| entry(&data))).is_err()
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
fn the_corpus_replays_without_panics() {
    for target in &TARGETS {
        let corpus = dir("corpus", target.name);
        let files = inputs(&corpus);
        assert!(!files.is_empty(), "the corpus {} is empty", corpus.display());
        replay(&files, target.entry);
    }
}

#[test]
fn the_regressions_replay_without_panics() {
    for target in &TARGETS {
        // Committed with a .gitkeep: it may be empty, never missing.
        replay(&inputs(&dir("regressions", target.name)), target.entry);
    }
}

#[test]
fn the_committed_seeds_are_the_generators() {
    let write = std::env::var_os("ACEMQ_WRITE_SEEDS").is_some();
    for target in &TARGETS {
        let corpus = dir("corpus", target.name);
        for (name, bytes) in (target.seeds)() {
            let path = corpus.join(name);
            if write {
                std::fs::create_dir_all(&corpus).expect("the corpus directory");
                std::fs::write(&path, &bytes).expect("a written seed");
            } else {
                let committed = std::fs::read(&path).ok();
                assert_eq!(
                    committed.as_deref(),
                    Some(&bytes[..]),
                    "{} is not what {}'s seeds() writes; rerun with ACEMQ_WRITE_SEEDS=1",
                    path.display(),
                    target.name
                );
            }
        }
    }
}
