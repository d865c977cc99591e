//! With the `igzip` feature only: checks that the tools `isal-sys` needs to build ISA-L
//! from source are on PATH, and if not says in one line what to install, instead of its
//! build script's `autoreconf: not found` and a panic. The default build needs none of them.

use std::path::Path;

/// The commands ISA-L's autotools build runs, and the Debian/Ubuntu package of each.
const TOOLS: [(&str, &str); 5] = [
    ("nasm", "nasm"),
    ("autoreconf", "autoconf"),
    ("automake", "automake"),
    ("libtoolize", "libtool"),
    ("make", "make"),
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PATH");
    if std::env::var_os("CARGO_FEATURE_IGZIP").is_none() {
        return;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let on_path = |cmd: &str| std::env::split_paths(&path).any(|d| is_executable(&d.join(cmd)));
    let missing: Vec<&str> = TOOLS
        .iter()
        .filter(|(cmd, _)| !on_path(cmd))
        .map(|(_, package)| *package)
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "error: the `igzip` feature builds ISA-L from source and needs {}: install them \
             (Debian/Ubuntu: `apt-get install {}`, or ./scripts/install-build-deps.sh), or build \
             without `--features igzip` (the default build needs only Rust and a C compiler)",
            missing.join(", "),
            missing.join(" ")
        );
        std::process::exit(1);
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}
