//! The generated files of the camelCase converter are what their generators give today.
//!
//! `src/events/camel/fields.rs` (by `scripts/gen-event-fields.py`) and
//! `tests/data/posts-snake.camel-expected.jsonl` (by `scripts/gen-camel-expected.py`) are both
//! made from the installed Ray's protobuf descriptors, deterministically. Regenerating them
//! must give the committed bytes: a Ray upgrade that changes the schema shows up here, with
//! the command that updates the files.
//!
//! Needs `RHC_PYTHON` (a Python with `ray`, from `./scripts/install-test-deps.sh`); skipped
//! without it, unless `RHC_REQUIRE_SERVICES=1`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn ray_python() -> Option<PathBuf> {
    match std::env::var_os("RHC_PYTHON") {
        Some(python) if !python.is_empty() => Some(PathBuf::from(python)),
        _ => {
            assert!(
                std::env::var_os("RHC_REQUIRE_SERVICES").is_none_or(|v| v != "1"),
                "RHC_PYTHON is not set but RHC_REQUIRE_SERVICES=1; run ./scripts/test.sh"
            );
            eprintln!("skipping: RHC_PYTHON is not set, so Ray is not available");
            None
        }
    }
}

/// Runs a generator script from the crate root; its stdout.
fn generate(python: &Path, args: &[&str]) -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let output = Command::new(python)
        .args(args)
        .current_dir(root)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    assert!(
        output.status.success(),
        "{} {args:?}: {}\n{}",
        python.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

fn committed(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn field_table_is_fresh() {
    let Some(python) = ray_python() else { return };
    let fresh = generate(&python, &["scripts/gen-event-fields.py"]);
    assert!(
        fresh == committed("src/events/camel/fields.rs"),
        "src/events/camel/fields.rs is stale; regenerate it with\n  \
         $RHC_PYTHON scripts/gen-event-fields.py src/events/camel/fields.rs"
    );
}

#[test]
fn oracle_is_fresh() {
    let Some(python) = ray_python() else { return };
    let fresh = generate(
        &python,
        &[
            "scripts/gen-camel-expected.py",
            "tests/data/posts-snake.jsonl",
        ],
    );
    assert!(
        fresh == committed("tests/data/posts-snake.camel-expected.jsonl"),
        "tests/data/posts-snake.camel-expected.jsonl is stale; regenerate it with\n  \
         $RHC_PYTHON scripts/gen-camel-expected.py tests/data/posts-snake.jsonl \
         tests/data/posts-snake.camel-expected.jsonl"
    );
}
