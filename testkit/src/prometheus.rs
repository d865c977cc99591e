//! A real Prometheus (Debian's `prometheus` package, `RHC_PROMETHEUS`) on 127.0.0.1, with a
//! configuration and a rule file written by the test, and its own HTTP API read back:
//! `/api/v1/alerts` (pending and firing alerts) and `/api/v1/rules` (every rule's state).
//! Stopped (SIGKILL) and its data directory removed when dropped.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::http::try_http_request;
use crate::services::{tool, try_launch, ServerProcess};

/// A Prometheus process and its working directory (configuration, rules, TSDB).
pub struct Prometheus {
    process: ServerProcess,
    _dir: tempfile::TempDir,
}

/// An alert of `/api/v1/alerts`: its name, state (`pending` or `firing`) and labels.
#[derive(Debug, Clone)]
pub struct Alert {
    pub name: String,
    pub state: String,
    pub labels: Value,
}

impl Prometheus {
    /// Starts `RHC_PROMETHEUS` scraping `targets` (`127.0.0.1:PORT`, `/metrics`) every second
    /// and evaluating `rules` (a rule file's text) every second. `None` (after printing
    /// `skipping: ...`) when `RHC_PROMETHEUS` is unset and services are not required.
    pub fn start(targets: &[String], rules: &str) -> Option<Prometheus> {
        let Some(program) = tool("RHC_PROMETHEUS") else {
            eprintln!(
                "skipping: RHC_PROMETHEUS is not set, so Prometheus is not available \
                 (run ./scripts/test.sh; Debian's prometheus package)"
            );
            return None;
        };
        Some(Self::start_program(program, targets, rules))
    }

    /// Starts the Prometheus at `program`; panics with its log when it does not come up.
    pub fn start_program(program: PathBuf, targets: &[String], rules: &str) -> Prometheus {
        let dir = tempfile::Builder::new()
            .prefix("rhc-prometheus-")
            .tempdir()
            .expect("temp dir for prometheus");
        let rules_path = dir.path().join("rules.yaml");
        std::fs::write(&rules_path, rules).expect("write the rule file");
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config(targets, &rules_path)).expect("write the config");
        let data = dir.path().join("data");
        let args = move |port: u16| {
            vec![
                format!("--config.file={}", config_path.display()),
                format!("--storage.tsdb.path={}", data.display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
                "--log.level=warn".to_string(),
            ]
        };
        let process = match try_launch("prometheus", program, args, "/-/ready") {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        Prometheus { process, _dir: dir }
    }

    fn api(&self, path: &str) -> Result<Value, String> {
        let url = format!("http://127.0.0.1:{}{path}", self.process.port());
        let r = try_http_request("GET", &url, &[], b"").map_err(|e| format!("GET {url}: {e}"))?;
        if r.status != 200 {
            return Err(format!(
                "GET {url}: {} {}",
                r.status,
                String::from_utf8_lossy(&r.body)
            ));
        }
        serde_json::from_slice(&r.body).map_err(|e| format!("GET {url}: {e}"))
    }

    /// The pending and firing alerts (`/api/v1/alerts`).
    pub fn alerts(&self) -> Result<Vec<Alert>, String> {
        let v = self.api("/api/v1/alerts")?;
        let list = v["data"]["alerts"].as_array().cloned().unwrap_or_default();
        Ok(list
            .into_iter()
            .map(|a| Alert {
                name: a["labels"]["alertname"].as_str().unwrap_or("").to_string(),
                state: a["state"].as_str().unwrap_or("").to_string(),
                labels: a["labels"].clone(),
            })
            .collect())
    }

    /// The state of alerting rule `name` (`inactive`, `pending`, `firing`), from
    /// `/api/v1/rules`; `None` when no such rule is loaded.
    pub fn rule_state(&self, name: &str) -> Result<Option<String>, String> {
        let v = self.api("/api/v1/rules")?;
        let groups = v["data"]["groups"].as_array().cloned().unwrap_or_default();
        Ok(groups
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .find(|r| r["name"] == name)
            .and_then(|r| r["state"].as_str().map(str::to_string)))
    }

    /// Health of the scrape targets (`up`, `down`, `unknown`), from `/api/v1/targets`.
    pub fn target_health(&self) -> Result<Vec<String>, String> {
        let v = self.api("/api/v1/targets")?;
        Ok(v["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|t| t["health"].as_str().unwrap_or("").to_string())
            .collect())
    }
}

/// The configuration: one job scraping `targets` every second, rules evaluated every second.
fn config(targets: &[String], rules: &Path) -> String {
    let targets = targets
        .iter()
        .map(|t| format!("\"{t}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - \"{}\"\n\
         scrape_configs:\n  - job_name: ray-history-collector\n    static_configs:\n      - targets: [{targets}]\n",
        rules.display()
    )
}
