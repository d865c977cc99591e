//! `inspect … --train-run <run>` and `inspect … --compare-runs A B`: one Ray Train run in
//! full, and two runs side by side.
//!
//! A run's settings are what Ray sent in its latest `EXPORT_TRAIN_RUN` event, kept whole
//! (`report.rs`): `run_settings` is shown as an indented tree of every member it holds, and
//! the event's other members (those this version does not know included) under their own
//! names, so a field Ray adds in a later release is shown, not dropped.
//!
//! Two runs are compared on what it takes to reproduce them: `run_settings`,
//! `framework_versions` and `ray_train_version`. Each difference is a path
//! (`train_loop_config.lr`, `datasets[1]`) and both values, a member present on one side only
//! included; then the outcome (status, duration, attempts, failed attempts). The exit code
//! answers "is this the same configuration?": 0 equal, 1 different, 2 not comparable (a run
//! or session that cannot be found, a bucket that cannot be read, or a run whose
//! `run_settings` were never recorded, whose settings are unknown: [`COMPARE_ERROR_EXIT`]),
//! as `diff` and `cmp` do. A value longer than [`MAX_DIFF_VALUE_CHARS`] is shown as a window
//! around where the two values first differ.
//!
//! Every value from the bucket is escaped for the terminal (`render::clean`); the tree is
//! at most [`MAX_TREE_DEPTH`] deep (deeper members are shown as one JSON line). In a
//! comparison, each setting that differs (its path and both values, JSON) shows every
//! control, bidirectional, zero-width or other invisible character as JSON's `\uXXXX`
//! ([`visible_json`]), so two values that differ only by such characters never print alike
//! (review r37j D3: a `U+202E` and a `U+202D` both printed as a space).

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use super::error::InspectError;
use super::render::{clean, clean_long, human_duration, opt, opt_time, Table};
use crate::reader::report::{
    ClusterIdentity, JobEntry, Problems, SessionReport, StatusEntry, TrainRunEntry,
};

/// Exit code of `--compare-runs` when the runs cannot be compared (1 means "they differ").
pub const COMPARE_ERROR_EXIT: u8 = 2;

/// Nesting shown as a tree; deeper members are one JSON line (Ray's settings are 4 deep).
const MAX_TREE_DEPTH: usize = 32;

/// Longest value shown in a difference line; JSON's whole value is in `--json`.
const MAX_DIFF_VALUE_CHARS: usize = 300;

/// Runs listed in the error for a run that is not there.
const MAX_KNOWN_RUNS_SHOWN: usize = 10;

/// The run named `wanted` (its id, else its name) in `report`.
pub(super) fn find_run<'a>(
    report: &'a SessionReport,
    wanted: &str,
) -> Result<&'a TrainRunEntry, InspectError> {
    if let Some(run) = report.train_runs.iter().find(|r| r.run_id == wanted) {
        return Ok(run);
    }
    let by_name: Vec<&TrainRunEntry> = report
        .train_runs
        .iter()
        .filter(|r| r.name.as_deref() == Some(wanted))
        .collect();
    match by_name.as_slice() {
        [one] => Ok(one),
        [] => {
            let mut known: Vec<String> = report
                .train_runs
                .iter()
                .take(MAX_KNOWN_RUNS_SHOWN)
                .map(|r| format!("{} ({})", r.run_id, r.name.as_deref().unwrap_or("-")))
                .collect();
            if report.train_runs.len() > MAX_KNOWN_RUNS_SHOWN {
                known.push(format!(
                    "and {} more",
                    report.train_runs.len() - MAX_KNOWN_RUNS_SHOWN
                ));
            }
            Err(InspectError::NoSuchTrainRun {
                wanted: wanted.to_string(),
                session: report.session.clone(),
                known: if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                },
            })
        }
        several => Err(InspectError::AmbiguousTrainRun {
            wanted: wanted.to_string(),
            session: report.session.clone(),
            ids: several
                .iter()
                .map(|r| r.run_id.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// A `--compare-runs` operand: `[SESSION:]RUN`. The part before the first `:` is a session
/// when it is one (`session_…` or `latest`); a run name may hold a `:` otherwise.
pub(super) fn split_run_ref(arg: &str) -> (Option<&str>, &str) {
    match arg.split_once(':') {
        Some((session, run))
            if !run.is_empty() && (session.starts_with("session_") || session == "latest") =>
        {
            (Some(session), run)
        }
        _ => (None, arg),
    }
}

/// `--train-run --json`: the run with where it was found.
#[derive(Debug, Serialize)]
pub(super) struct TrainRunDocument<'a> {
    pub(super) storage: &'a str,
    pub(super) cluster: &'a ClusterIdentity,
    pub(super) session: &'a str,
    pub(super) train_run: &'a TrainRunEntry,
    /// The session's entry of the run's job (as in the report's `jobs`): Ray's own Train
    /// answer joins the same job as `job_details`. Null when the session has no such job.
    pub(super) job: Option<&'a JobEntry>,
    pub(super) problems: &'a Problems,
}

/// The session's entry of `run`'s job, if the session knows it.
pub(super) fn run_job<'a>(report: &'a SessionReport, run: &TrainRunEntry) -> Option<&'a JobEntry> {
    let id = run.job_id.as_deref()?;
    report.jobs.iter().find(|j| j.job_id == id)
}

/// One run in full, as text.
pub(super) fn render_train_run(report: &SessionReport, run: &TrainRunEntry, out: &mut String) {
    let _ = writeln!(
        out,
        "RAY TRAIN RUN {} ({})\nsession {} of {} in {}",
        clean(&run.run_id),
        opt(&run.name),
        clean(&report.session),
        clean(&report.cluster.history_prefix),
        clean(&report.storage)
    );
    let _ = writeln!(out, "  job:                {}", opt(&run.job_id));
    if let Some(job) = run_job(report, run) {
        let _ = writeln!(
            out,
            "  job status:         {}\n  job entrypoint:     {}\n  job driver pid:     {}\n  \
             job started:        {}\n  job ended:          {}",
            clean(&job.status),
            job.entrypoint
                .as_deref()
                .map(clean_long)
                .unwrap_or_else(|| "-".into()),
            job.driver_pid
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into()),
            opt_time(&job.started),
            opt_time(&job.ended)
        );
    }
    let _ = writeln!(out, "  status:             {}", opt(&run.status));
    if let Some(d) = &run.status_detail {
        let _ = writeln!(out, "  status detail:      {}", clean_long(d));
    }
    let _ = writeln!(
        out,
        "  started:            {}\n  ended:              {}\n  duration:           {}",
        opt_time(&run.started),
        opt_time(&run.ended),
        run.duration_ns
            .map(human_duration)
            .unwrap_or_else(|| "-".into())
    );
    let _ = writeln!(
        out,
        "  workers:            {}\n  framework:          {}",
        run.workers
            .map(|n| n.to_string())
            .unwrap_or_else(|| "-".into()),
        opt(&run.framework)
    );
    let _ = writeln!(
        out,
        "  ray_train_version:  {}",
        scalar(&run.ray_train_version)
    );
    let _ = writeln!(out, "  framework_versions:");
    match &run.framework_versions {
        Value::Object(m) if m.is_empty() => {
            let _ = writeln!(out, "    (none)");
        }
        versions => tree(versions, 2, out),
    }
    let _ = writeln!(
        out,
        "  controller actor:   {}\n  controller log:     {} (a path on the head node)",
        opt(&run.controller_actor_id),
        run.controller_log_file_path
            .as_deref()
            .map(clean_long)
            .unwrap_or_else(|| "-".into())
    );

    let _ = writeln!(out, "\nSTATUS HISTORY");
    history_lines(&run.status_history, "  ", out);

    let _ = writeln!(out, "\nRUN SETTINGS");
    if run.run_settings.is_null() {
        let _ = writeln!(out, "  (none sent)");
    } else {
        tree(&run.run_settings, 1, out);
    }
    if !run.other_fields.is_empty() {
        let _ = writeln!(out, "\nOTHER FIELDS");
        tree(&Value::Object(run.other_fields.clone()), 1, out);
    }

    let _ = writeln!(out, "\nATTEMPTS ({})", run.attempts.len());
    for a in &run.attempts {
        let _ = writeln!(
            out,
            "\n  attempt {}: {}, {} → {}",
            clean(&a.attempt_id),
            opt(&a.status),
            opt_time(&a.started),
            opt_time(&a.ended)
        );
        if let Some(d) = &a.status_detail {
            let _ = writeln!(out, "    status detail: {}", clean_long(d));
        }
        let _ = writeln!(out, "    status history:");
        history_lines(&a.status_history, "      ", out);
        let _ = writeln!(out, "    resources:");
        if a.resources.is_null() {
            let _ = writeln!(out, "      -");
        } else {
            tree(&a.resources, 3, out);
        }
        if !a.other_fields.is_empty() {
            let _ = writeln!(out, "    other fields:");
            tree(&Value::Object(a.other_fields.clone()), 3, out);
        }
        if a.workers.is_empty() {
            let _ = writeln!(out, "    workers: none reported");
            continue;
        }
        let _ = writeln!(out, "    workers:");
        let mut workers = Table::new(&[
            ">RANK",
            ">LOCAL RANK",
            ">NODE RANK",
            "NODE IP",
            ">PID",
            "ACCELERATORS",
            "RESOURCES",
            "STATUS",
            "NODE ID",
        ]);
        let num = |n: Option<i64>| n.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
        for w in &a.workers {
            let gpus = if w.gpu_ids.is_empty() {
                "-".to_string()
            } else {
                format!(
                    "GPU {}",
                    w.gpu_ids
                        .iter()
                        .map(|g| g.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                )
            };
            workers.row(vec![
                num(w.world_rank),
                num(w.local_rank),
                num(w.node_rank),
                opt(&w.node_ip),
                num(w.pid),
                gpus,
                clean(&resources_text(&w.resources)),
                opt(&w.status),
                opt(&w.node_id),
            ]);
        }
        workers.render("      ", out);
        let _ = writeln!(out, "    worker logs:");
        for w in &a.workers {
            let rank = num(w.world_rank);
            match &w.log_command {
                Some(c) => {
                    let _ = writeln!(out, "      rank {rank}: {}", clean_long(c));
                }
                None => {
                    let _ = writeln!(out, "      rank {rank}: - (no actor id reported)");
                }
            }
            if let Some(p) = &w.log_file_path {
                let _ = writeln!(out, "        Train log on its node: {}", clean_long(p));
            }
            // The table's cell is cut at its width (marked): whole here.
            let resources = resources_text(&w.resources);
            if resources.chars().count() > super::render::MAX_CELL_CHARS {
                let _ = writeln!(out, "        resources: {}", clean_long(&resources));
            }
            let beside: serde_json::Map<String, Value> = match &w.resources {
                Value::Object(m) if m.contains_key("resources") => m
                    .iter()
                    .filter(|(k, _)| k.as_str() != "resources")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                _ => serde_json::Map::new(),
            };
            if !beside.is_empty() {
                let _ = writeln!(out, "        resources, other members:");
                tree(&Value::Object(beside), 5, out);
            }
            if !w.other_fields.is_empty() {
                let _ = writeln!(out, "        other fields:");
                tree(&Value::Object(w.other_fields.clone()), 5, out);
            }
        }
    }
}

/// A worker's `resources` (`{"resources": {"CPU": 1.0}}`) as `CPU: 1`.
fn resources_text(v: &Value) -> String {
    let inner = v.get("resources").unwrap_or(v);
    match inner {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| format!("{k}: {}", scalar(v)))
            .collect::<Vec<_>>()
            .join(", "),
        Value::Null => "-".into(),
        other => scalar(other),
    }
}

fn history_lines(history: &[StatusEntry], indent: &str, out: &mut String) {
    if history.is_empty() {
        let _ = writeln!(out, "{indent}-");
    }
    for s in history {
        let _ = write!(out, "{indent}{}  {}", opt_time(&s.time), clean(&s.status));
        if let Some(d) = &s.detail {
            let _ = write!(out, "  {}", clean_long(d));
        }
        out.push('\n');
    }
}

/// A scalar as text: strings bare (escaped), others as JSON; `""`, `{}` and `[]` shown so.
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) if s.is_empty() => "\"\"".into(),
        Value::String(s) => clean_long(s),
        Value::Null => "null".into(),
        other => clean_long(&other.to_string()),
    }
}

/// `v` as an indented tree at `level` (two spaces a level): `key: value` for scalars and
/// empty containers, `key:` then its members below for the rest; array items as `- `.
fn tree(v: &Value, level: usize, out: &mut String) {
    let indent = "  ".repeat(level);
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                member_line(&indent, &clean(k), child, level, out);
            }
        }
        Value::Array(items) => {
            for child in items {
                member_line(&indent, "-", child, level, out);
            }
        }
        scalar_value => {
            let _ = writeln!(out, "{indent}{}", scalar(scalar_value));
        }
    }
}

fn member_line(indent: &str, label: &str, child: &Value, level: usize, out: &mut String) {
    let sep = if label == "-" { " " } else { ": " };
    let nested = match child {
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => false,
    };
    if !nested {
        let _ = writeln!(out, "{indent}{label}{sep}{}", scalar(child));
    } else if level >= MAX_TREE_DEPTH {
        let _ = writeln!(
            out,
            "{indent}{label}{sep}{}",
            clean_long(&child.to_string())
        );
    } else {
        let _ = writeln!(out, "{indent}{}", label.to_string() + sep.trim_end());
        tree(child, level + 1, out);
    }
}

/// One setting that differs between two runs: where, and both values (`None`: absent, left
/// out of `--json`, so a member Ray sent as `null` and one it did not send read apart).
#[derive(Debug, Serialize)]
pub(super) struct Difference {
    pub(super) path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) a: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) b: Option<Value>,
}

/// The members of two runs compared as settings, by the path prefix they get.
fn compared(run: &TrainRunEntry) -> Value {
    let mut m = serde_json::Map::new();
    if let Value::Object(settings) = &run.run_settings {
        for (k, v) in settings {
            m.insert(k.clone(), v.clone());
        }
    } else if !run.run_settings.is_null() {
        m.insert("run_settings".into(), run.run_settings.clone());
    }
    m.insert("framework_versions".into(), run.framework_versions.clone());
    m.insert("ray_train_version".into(), run.ray_train_version.clone());
    Value::Object(m)
}

/// Why the settings of `a` and `b` cannot be compared: a run whose `run_settings` were never
/// recorded (Ray before its richer run metadata, or a run known only by its attempts) has
/// unknown settings, which are neither equal nor different to anything.
pub(super) fn not_comparable(a: &TrainRunEntry, b: &TrainRunEntry) -> Option<String> {
    let missing: Vec<&str> = [("A", a), ("B", b)]
        .into_iter()
        .filter(|(_, r)| r.run_settings.is_null())
        .map(|(label, _)| label)
        .collect();
    match missing.as_slice() {
        [] => None,
        [one] => Some(format!("run {one}'s run_settings were not recorded")),
        _ => Some("neither run's run_settings were recorded".into()),
    }
}

/// The differences between `a` and `b`, depth first, in key order (arrays by index).
pub(super) fn differences(a: &TrainRunEntry, b: &TrainRunEntry) -> Vec<Difference> {
    let mut out = Vec::new();
    diff(&compared(a), &compared(b), String::new(), 0, &mut out);
    out
}

fn child_path(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    match (path.is_empty(), plain) {
        (true, true) => key.to_string(),
        (false, true) => format!("{path}.{key}"),
        _ => format!("{path}[{}]", Value::String(key.to_string())),
    }
}

fn diff(a: &Value, b: &Value, path: String, depth: usize, out: &mut Vec<Difference>) {
    if a == b {
        return;
    }
    match (a, b) {
        (Value::Object(ma), Value::Object(mb)) if depth < MAX_TREE_DEPTH => {
            let keys: std::collections::BTreeSet<&String> = ma.keys().chain(mb.keys()).collect();
            for k in keys {
                let p = child_path(&path, k);
                match (ma.get(k), mb.get(k)) {
                    (Some(x), Some(y)) => diff(x, y, p, depth + 1, out),
                    (x, y) => out.push(Difference {
                        path: p,
                        a: x.cloned(),
                        b: y.cloned(),
                    }),
                }
            }
        }
        (Value::Array(xa), Value::Array(xb)) if depth < MAX_TREE_DEPTH => {
            for i in 0..xa.len().max(xb.len()) {
                let p = format!("{path}[{i}]");
                match (xa.get(i), xb.get(i)) {
                    (Some(x), Some(y)) => diff(x, y, p, depth + 1, out),
                    (x, y) => out.push(Difference {
                        path: p,
                        a: x.cloned(),
                        b: y.cloned(),
                    }),
                }
            }
        }
        _ => out.push(Difference {
            path,
            a: Some(a.clone()),
            b: Some(b.clone()),
        }),
    }
}

/// Where one compared run is.
#[derive(Debug, Serialize)]
pub(super) struct RunSide {
    /// The operand as given.
    pub(super) arg: String,
    /// The bucket it was read from.
    pub(super) storage: String,
    pub(super) cluster: String,
    pub(super) session: String,
    pub(super) run_id: String,
    pub(super) name: Option<String>,
    pub(super) status: Option<String>,
    pub(super) started: Option<String>,
    pub(super) ended: Option<String>,
    pub(super) duration_seconds: Option<f64>,
    pub(super) attempts: usize,
    /// Attempts that ended `ERRORED`.
    pub(super) failed_attempts: usize,
    pub(super) workers: Option<u64>,
    pub(super) train_run_command: String,
}

impl RunSide {
    pub(super) fn new(arg: &str, report: &SessionReport, run: &TrainRunEntry) -> RunSide {
        RunSide {
            arg: arg.to_string(),
            storage: report.storage.clone(),
            cluster: report.cluster.history_prefix.clone(),
            session: report.session.clone(),
            run_id: run.run_id.clone(),
            name: run.name.clone(),
            status: run.status.clone(),
            started: run.started.clone(),
            ended: run.ended.clone(),
            duration_seconds: run.duration_ns.map(|ns| ns as f64 / 1e9),
            attempts: run.attempts.len(),
            failed_attempts: run
                .attempts
                .iter()
                .filter(|a| a.status.as_deref() == Some("ERRORED"))
                .count(),
            workers: run.workers,
            train_run_command: run.train_run_command.clone(),
        }
    }
}

/// `--compare-runs --json`.
#[derive(Debug, Serialize)]
pub(super) struct Comparison {
    pub(super) a: RunSide,
    pub(super) b: RunSide,
    /// True when no setting differs (the exit code is then 0); false when they differ or
    /// could not be compared.
    pub(super) settings_equal: bool,
    /// Why the settings could not be compared (a side's `run_settings` not recorded; the
    /// exit code is then 2), or null.
    pub(super) not_compared: Option<String>,
    pub(super) differences: Vec<Difference>,
    /// Each session read: `{ "session", "problems" }` as in the session report.
    pub(super) problems: Vec<Value>,
}

/// True for a character a reader cannot see or tell from another one: what
/// [`crate::util::escape::is_unsafe_char`] refuses, every space but `' '`, and Unicode's other
/// default-ignorable characters (soft hyphen, fillers, variation selectors, tags).
fn invisible(c: char) -> bool {
    crate::util::escape::is_unsafe_char(c)
        || (c.is_whitespace() && c != ' ')
        || matches!(
            c,
            '\u{ad}'
                | '\u{34f}'
                | '\u{115f}'
                | '\u{1160}'
                | '\u{17b4}'
                | '\u{17b5}'
                | '\u{180b}'..='\u{180f}'
                | '\u{3164}'
                | '\u{fe00}'..='\u{fe0f}'
                | '\u{ffa0}'
                | '\u{1bca0}'..='\u{1bca3}'
                | '\u{1d173}'..='\u{1d17a}'
                | '\u{e0000}'..='\u{e0fff}'
        )
}

/// JSON text (or a path of JSON-quoted keys) with each [`invisible`] character written as
/// JSON's `\uXXXX` (a surrogate pair above `U+FFFF`): still the same JSON, and, since a
/// backslash of the value is already `\\` in it, two different values never print alike.
fn visible_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if invisible(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{u:04x}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Both values of a difference as shown: whole up to [`MAX_DIFF_VALUE_CHARS`]; a longer one
/// as a window of that many characters around the first character where the two differ,
/// each cut end marked `…` and the window's start said (`[from character N] `), so two
/// values that share a long start still show where they part.
pub(super) fn diff_values(a: &Option<Value>, b: &Option<Value>) -> (String, String) {
    let text = |v: &Option<Value>| -> Option<Vec<char>> {
        v.as_ref()
            .map(|v| visible_json(&v.to_string()).chars().collect())
    };
    let (ta, tb) = (text(a), text(b));
    // One window for both, so they line up: a little of the common part before the first
    // difference, the rest after it, within the shorter value.
    let from = match (&ta, &tb) {
        (Some(x), Some(y)) => {
            let common = x.iter().zip(y.iter()).take_while(|(p, q)| p == q).count();
            common
                .saturating_sub(MAX_DIFF_VALUE_CHARS / 5)
                .min(x.len().min(y.len()).saturating_sub(MAX_DIFF_VALUE_CHARS))
        }
        _ => 0,
    };
    let show = |t: Option<Vec<char>>| -> String {
        let Some(t) = t else {
            return "(absent)".into();
        };
        if t.len() <= MAX_DIFF_VALUE_CHARS {
            return t.into_iter().collect();
        }
        let to = (from + MAX_DIFF_VALUE_CHARS).min(t.len());
        let body: String = t[from..to].iter().collect();
        let head = if from > 0 {
            format!("[from character {}] …", from + 1)
        } else {
            String::new()
        };
        let tail = if to < t.len() { "…" } else { "" };
        format!("{head}{body}{tail}")
    };
    (show(ta), show(tb))
}

/// Both runs as text: settings that differ, then the outcome.
pub(super) fn render_comparison(c: &Comparison, out: &mut String) {
    for (label, s) in [("A", &c.a), ("B", &c.b)] {
        let _ = writeln!(
            out,
            "{label}: run {} ({}) in session {} of {} in {}",
            clean(&s.run_id),
            opt(&s.name),
            clean(&s.session),
            clean(&s.cluster),
            clean(&s.storage)
        );
    }
    if let Some(why) = &c.not_compared {
        let _ = writeln!(
            out,
            "\nSETTINGS: could not be compared: {why} (unknown settings are neither equal nor different)"
        );
    } else if c.differences.is_empty() {
        let _ = writeln!(
            out,
            "\nSETTINGS: equal (run_settings, framework_versions, ray_train_version)"
        );
    } else {
        let _ = writeln!(out, "\nSETTINGS THAT DIFFER ({})", c.differences.len());
        for d in &c.differences {
            let (a, b) = diff_values(&d.a, &d.b);
            let _ = writeln!(out, "  {}\n    A: {a}\n    B: {b}", visible_json(&d.path));
        }
    }
    let _ = writeln!(out, "\nOUTCOME");
    let mut t = Table::new(&["", "A", "B"]);
    let dur = |s: &RunSide| {
        s.duration_seconds
            .map(|d| human_duration((d * 1e9) as i64))
            .unwrap_or_else(|| "-".into())
    };
    let n = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    t.row(vec!["status".into(), opt(&c.a.status), opt(&c.b.status)]);
    t.row(vec!["duration".into(), dur(&c.a), dur(&c.b)]);
    t.row(vec![
        "attempts".into(),
        c.a.attempts.to_string(),
        c.b.attempts.to_string(),
    ]);
    t.row(vec![
        "failed attempts".into(),
        c.a.failed_attempts.to_string(),
        c.b.failed_attempts.to_string(),
    ]);
    t.row(vec!["workers".into(), n(c.a.workers), n(c.b.workers)]);
    t.row(vec![
        "started".into(),
        opt_time(&c.a.started),
        opt_time(&c.b.started),
    ]);
    t.render("  ", out);
    let _ = writeln!(
        out,
        "\nin full:\n  A: {}\n  B: {}",
        clean_long(&c.a.train_run_command),
        clean_long(&c.b.train_run_command)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invisible_characters_show_as_json_escapes() {
        let shown = |s: &str| visible_json(&Value::String(s.into()).to_string());
        assert_eq!(shown("v\u{202e}1"), "\"v\\u202e1\"");
        assert_ne!(shown("v\u{202e}1"), shown("v\u{202d}1"));
        assert_ne!(shown("a\u{a0}b"), shown("a b"));
        assert_eq!(shown("\u{e0041}"), "\"\\udb40\\udc41\"");
        // The same JSON: it reads back as the value.
        let back: Value = serde_json::from_str(&shown("x\u{200b}\u{9b}\\u202e")).unwrap();
        assert_eq!(back, "x\u{200b}\u{9b}\\u202e");
        assert_eq!(shown("日本語 ok"), "\"日本語 ok\"");
    }

    #[test]
    fn long_values_show_where_they_differ() {
        let long = |tail: &str| Some(Value::String(format!("{}{tail}", "x".repeat(1000))));
        let (a, b) = diff_values(&long("10 end"), &long("100 end"));
        assert_ne!(a, b);
        assert!(a.contains("10 end") && b.contains("100 end"), "{a}\n{b}");
        assert!(a.starts_with("[from character "), "{a}");
        let (a, b) = diff_values(&long(""), &Some(Value::Bool(true)));
        assert!(a.ends_with('…') && b == "true", "{a}");
        let (a, b) = diff_values(&Some(json_str("short")), &None);
        assert_eq!((a.as_str(), b.as_str()), ("\"short\"", "(absent)"));
    }

    fn json_str(s: &str) -> Value {
        Value::String(s.to_string())
    }

    #[test]
    fn operands_split_on_a_session_only() {
        assert_eq!(
            split_run_ref("session_2026-11-22_02-08-16_569038_24326:probe-run"),
            (
                Some("session_2026-11-22_02-08-16_569038_24326"),
                "probe-run"
            )
        );
        assert_eq!(split_run_ref("latest:abc"), (Some("latest"), "abc"));
        assert_eq!(split_run_ref("run:with:colons"), (None, "run:with:colons"));
        assert_eq!(split_run_ref("latest:"), (None, "latest:"));
    }

    #[test]
    fn paths_name_nested_members_and_indices() {
        let mut out = Vec::new();
        let a = serde_json::json!({"x": {"lr": 0.01, "odd key": 1}, "l": [1, 2]});
        let b = serde_json::json!({"x": {"lr": 0.001, "odd key": 2}, "l": [1], "n": true});
        diff(&a, &b, String::new(), 0, &mut out);
        let paths: Vec<&str> = out.iter().map(|d| d.path.as_str()).collect();
        assert_eq!(paths, ["l[1]", "n", "x.lr", "x[\"odd key\"]"]);
        assert_eq!(out[0].b, None);
        assert_eq!(out[1].a, None);
    }

    #[test]
    fn the_tree_is_indented_and_keeps_empty_containers() {
        let mut out = String::new();
        tree(
            &serde_json::json!({"a": {"b": 1, "c": {}}, "d": [{"e": "x"}], "f": ""}),
            1,
            &mut out,
        );
        assert_eq!(
            out,
            "  a:\n    b: 1\n    c: {}\n  d:\n    -\n      e: x\n  f: \"\"\n"
        );
    }
}
