//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) and any saved
//! crash inputs (`fuzz/regressions/<target>/`) through the same entry points
//! the cargo-fuzz targets call, on stable Rust, in every `cargo test`: unit
//! tests, because the harness is compiled only for tests and fuzzing.
//!
//! The seeds are written by `fuzz/make_corpus.py`. A missing or empty corpus
//! directory is a failure, so this test cannot silently check nothing.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use crate::{fuzzing, FieldTable, Frame, FrameDecoder};
use bytes::Bytes;

type Entry = fn(&[u8]);

const TARGETS: [(&str, Entry); 4] = [
    ("decode_frames", fuzzing::decode_frames),
    ("roundtrip", fuzzing::roundtrip),
    ("field_table", fuzzing::field_table),
    ("trackers", fuzzing::trackers),
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("fuzz")
}

/// Every regular file under `dir`, recursively, skipping dotfiles (`.gitkeep`).
/// Panics if `dir` does not exist.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|err| panic!("cannot read {}: {err}", d.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            let hidden = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'));
            if hidden {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Runs every file through `entry`; returns the failures as "file: message".
fn replay(files: &[PathBuf], entry: Entry) -> Vec<String> {
    let mut failures = Vec::new();
    for path in files {
        let data = std::fs::read(path).unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| entry(&data))) {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".into());
            failures.push(format!("{}: {msg}", path.display()));
        }
    }
    failures
}

#[test]
fn corpus_replays_without_panics() {
    let mut failures = Vec::new();
    for (target, entry) in TARGETS {
        let dir = fuzz_dir().join("corpus").join(target);
        let files = files_under(&dir);
        assert!(!files.is_empty(), "corpus directory {} is empty", dir.display());
        eprintln!("{target}: replaying {} corpus files", files.len());
        failures.extend(replay(&files, entry));
    }
    assert!(
        failures.is_empty(),
        "fuzz corpus inputs panicked:\n{}",
        failures.join("\n")
    );
}

#[test]
fn regressions_replay_without_panics() {
    let mut failures = Vec::new();
    for (target, entry) in TARGETS {
        // The directories are committed (with a .gitkeep); they may be empty.
        let dir = fuzz_dir().join("regressions").join(target);
        assert!(dir.is_dir(), "regression directory {} is missing", dir.display());
        let files = files_under(&dir);
        eprintln!("{target}: replaying {} regression files", files.len());
        failures.extend(replay(&files, entry));
    }
    assert!(
        failures.is_empty(),
        "fuzz regression inputs panicked:\n{}",
        failures.join("\n")
    );
}

/// The decoder `fuzzing::decode_frames` builds for a selector byte.
fn decoder_for(selector: u8) -> FrameDecoder {
    let (frame_max, depth) = fuzzing::limits(selector);
    FrameDecoder::new(frame_max).with_max_depth(depth)
}

/// The decode_frames seeds must mostly be real frames, or the fuzzer starts
/// from noise. (A few seeds are deliberately broken streams.)
#[test]
fn decode_frames_seeds_are_frames() {
    let dir = fuzz_dir().join("corpus").join("decode_frames");
    let files = files_under(&dir);
    assert!(!files.is_empty(), "corpus directory {} is empty", dir.display());
    // `CORPUS_STATS=1 cargo test -p acemq-codec --lib fuzzing -- --nocapture`
    // lists every seed with its frame count and how decoding stopped.
    let verbose = std::env::var_os("CORPUS_STATS").is_some();
    let (mut decoding, mut frames_total) = (0, 0);
    for path in &files {
        let data = std::fs::read(path).expect("a corpus file");
        // The first byte is the fuzz target's limit selector.
        let Some((&selector, rest)) = data.split_first() else {
            continue;
        };
        let decoder = decoder_for(selector);
        let mut buf = Bytes::copy_from_slice(rest);
        let mut frames = 0;
        let mut kinds = String::new();
        let end = loop {
            match decoder.decode_slice(&buf) {
                Ok((frame, used)) => {
                    kinds.push(match frame {
                        Frame::Method(..) => 'M',
                        Frame::Header(..) => 'H',
                        Frame::UndecodableHeader(..) => 'U',
                        Frame::Body(..) => 'B',
                        Frame::Heartbeat => 'h',
                    });
                    frames += 1;
                    buf = buf.slice(used..);
                }
                Err(err) => break err,
            }
        };
        if verbose {
            eprintln!("  {:<36} {frames:>3} frames {kinds:<12} then {end}", file_name(path));
        }
        if frames > 0 {
            decoding += 1;
        }
        frames_total += frames;
    }
    eprintln!(
        "decode_frames: {decoding} of {} seeds decode at least one frame, {frames_total} frames in all",
        files.len()
    );
    assert!(
        decoding * 10 >= files.len() * 8,
        "only {decoding} of {} decode_frames seeds decode a frame",
        files.len()
    );
}

/// The field_table seeds: listed with how they decode under their selector's
/// nesting limit when `CORPUS_STATS` is set; most must decode.
#[test]
fn field_table_seeds_are_tables() {
    let dir = fuzz_dir().join("corpus").join("field_table");
    let files = files_under(&dir);
    assert!(!files.is_empty(), "corpus directory {} is empty", dir.display());
    let verbose = std::env::var_os("CORPUS_STATS").is_some();
    let mut decoding = 0;
    for path in &files {
        let data = std::fs::read(path).expect("a corpus file");
        let Some((&selector, rest)) = data.split_first() else {
            continue;
        };
        let result = FieldTable::decode(&Bytes::copy_from_slice(rest), decoder_for(selector).max_depth());
        if verbose {
            match &result {
                Ok(t) => eprintln!("  {:<36} {} entries", file_name(path), t.len()),
                Err(err) => eprintln!("  {:<36} {err}", file_name(path)),
            }
        }
        decoding += usize::from(result.is_ok());
    }
    assert!(
        decoding * 10 >= files.len() * 8,
        "only {decoding} of {} field_table seeds decode",
        files.len()
    );
}
