//! The README's configuration table must match the command line definition.

use clap::CommandFactory;
use ray_history_collector::cli::Cli;

#[test]
fn every_flag_and_variable_is_documented_with_its_default() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let rows: Vec<&str> = readme.lines().filter(|l| l.starts_with("| `--")).collect();
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
            .unwrap_or_else(|| panic!("{flag} is missing from the README configuration table"));
        let env = arg
            .get_env()
            .expect("every flag has an environment variable");
        assert!(
            row.contains(&format!("`{}`", env.to_string_lossy())),
            "{flag}: README row does not name {env:?}: {row}"
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
                "{flag}: README row does not show default {shown}: {row}"
            );
        }
        documented += 1;
    }
    assert_eq!(
        documented,
        rows.len(),
        "README documents flags that do not exist"
    );
}
