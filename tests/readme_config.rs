//! The configuration table (docs/configuration.md, where the README's table moved) must match
//! the command line definition.

use clap::CommandFactory;
use ray_history_collector::cli::Cli;

#[test]
fn every_flag_and_variable_is_documented_with_its_default() {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    let rows: Vec<&str> = page.lines().filter(|l| l.starts_with("| `--")).collect();
    let cmd = Cli::command();
    let mut documented = 0;
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if arg.is_hide_set() || long == "help" || long == "version" {
            continue;
        }
        let flag = format!("`--{long}`");
        let row = rows
            .iter()
            .find(|r| r.starts_with(&format!("| {flag} |")))
            .unwrap_or_else(|| {
                panic!("{flag} is missing from the configuration table of docs/configuration.md")
            });
        let env = arg
            .get_env()
            .expect("every flag has an environment variable");
        assert!(
            row.contains(&format!("`{}`", env.to_string_lossy())),
            "{flag}: docs/configuration.md row does not name {env:?}: {row}"
        );
        for default in arg.get_default_values() {
            let d = default.to_string_lossy();
            let shown = if d.is_empty() {
                "empty".to_string()
            } else {
                format!("`{d}`")
            };
            assert!(
                row.contains(&shown),
                "{flag}: docs/configuration.md row does not show default {shown}: {row}"
            );
        }
        documented += 1;
    }
    assert_eq!(
        documented,
        rows.len(),
        "docs/configuration.md documents flags that do not exist"
    );
}

/// `serve`'s flags have their own table in docs/configuration.md (rows `| serve `--flag` |`):
/// every flag there, and nothing else.
#[test]
fn every_serve_flag_is_documented_with_its_default() {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    let rows: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("| serve `--"))
        .collect();
    let cmd = Cli::command();
    let serve = cmd
        .get_subcommands()
        .find(|c| c.get_name() == "serve")
        .expect("a serve subcommand");
    let mut documented = 0;
    for arg in serve.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if arg.is_hide_set() || long == "help" || long == "version" {
            continue;
        }
        let row = rows
            .iter()
            .find(|r| r.starts_with(&format!("| serve `--{long}` |")))
            .unwrap_or_else(|| panic!("serve --{long} is missing from docs/configuration.md"));
        if let Some(env) = arg.get_env() {
            assert!(
                row.contains(&format!("`{}`", env.to_string_lossy())),
                "serve --{long}: the row does not name {env:?}: {row}"
            );
        }
        for default in arg.get_default_values() {
            let d = default.to_string_lossy();
            let shown = if d.is_empty() {
                "empty".to_string()
            } else {
                format!("`{d}`")
            };
            assert!(
                row.contains(&shown),
                "serve --{long}: the row does not show default {shown}: {row}"
            );
        }
        documented += 1;
    }
    assert_eq!(
        documented,
        rows.len(),
        "docs/configuration.md documents serve flags that do not exist"
    );
}
