//! `ray-history-collector inspect <storage>`: reads back what collectors wrote to a bucket.
//!
//! A cluster that is gone leaves only its bucket behind. This command answers the first
//! questions about it without a History Server: which clusters and sessions are there, which
//! jobs ran, how their tasks ended and why the failed ones failed, which actors lived, and how
//! Ray Train runs went. It reads what this collector writes and what KubeRay's Go collector
//! writes (plain `.jsonl` or gzip, legacy JSON-array files, names with or without the
//! `-<n>.jsonl[.gz]` tail), in camelCase or snake_case (`PRESERVE_PROTO_FIELD_NAME=1`).
//!
//! The reading itself (which objects, in what bounded memory, how the bucket's contents and
//! shape are distrusted, how events are merged) is [`crate::reader`]'s, shared with `serve`.
//! This module is the command's face over it: it opens the bucket the flags name, picks the
//! session, and prints what the reader gives: the text report (`render.rs`, every value from
//! the bucket cleaned of control characters), the JSON document below (escaped as safe for a
//! terminal), `--timeline` (`timeline.rs`), `--html` (`html.rs`), `--logs` (`logs.rs`) and
//! the Ray Train views (`train.rs`). Its errors are escaped before they are printed.
//!
//! # JSON output (`--json`)
//!
//! One document. Times are RFC 3339 UTC strings; ids are lower-case hex; absent values are
//! `null`. Field names are stable.
//!
//! Without `--session`:
//!
//! ```text
//! { "storage": "file:///bucket",
//!   "clusters": [ { "kind": "raycluster"|"rayjob"|"rayservice", "namespace", "owner" (null for
//!       raycluster), "cluster", "history_prefix",
//!       "sessions": [ { "session", "started" (wall clock from the session name, the head's
//!           local time, no zone: "2026-11-22T02:06:36.260774"), "nodes", "objects", "bytes",
//!           "event_objects", "events_from", "events_until" (start and end of the first and
//!           last hour partition) } ] } ],
//!   "problems": { "unreadable_objects", "bad_lines", "skipped_entries",
//!                 "details": [ { "key", "error" } ] } }
//! ```
//!
//! With `--session`:
//!
//! ```text
//! { "storage", "cluster": { "kind", "namespace", "owner", "cluster", "history_prefix" },
//!   "session", "started",
//!   "filter": { "job", "since", "until" (the instant given, or the end of the day or hour
//!               given) },
//!   "objects": { "event_objects_listed", "read" (read to their end), "unreadable",
//!                "skipped_by_time", "bytes_read", "not_event_objects" },
//!   "events": { "total", "duplicates", "outside_time_window", "other_job", "by_type": {..} },
//!   "nodes": [ { "node_id", "ip", "hostname", "is_head", "state", "started", "ended",
//!                "death_reason", "death_message", "last_heard" (the latest event that
//!                speaks of it), "resources": {..}, "objects", "bytes",
//!                "log_objects", "log_bytes" } ],
//!   "jobs": [ { "job_id", "status" ("CREATED"|"FINISHED"|"UNKNOWN"), "entrypoint",
//!               "driver_pid", "driver_node_id", "driver_ip", "started", "ended",
//!               "tasks": { "total", "by_state": {..} } } ],
//!   "tasks": { "total", "by_state": { "FINISHED": n, "FAILED": n, .. } },
//!   "failed_tasks_total",
//!   "failed_tasks": [ { "task_id", "attempt", "name", "job_id", "task_type", "failed_at",
//!                       "error_type", "error_message", "node_id", "worker_id",
//!                       "log_command" (the inspect command that prints its stderr; null
//!                       when the task id in the events is not an id),
//!                       "cause" (in words: "worker killed by the memory monitor"),
//!                       "worker": { "worker_id", "pid", "node_id", "state", "died_at",
//!                                   "exit_type", "exit_detail" } | null,
//!                       "node": { "node_id", "state", "died_at", "death_reason",
//!                                 "death_message" } | null } ],
//!   "failure_causes": [ { "cause", "error_type", "exit_type", "node_id",
//!                         "node_death_reason", "attempts", "actors", "first_at", "last_at",
//!                         "detail", "log_command",
//!                         "examples": [ { "kind" ("task"|"actor"), "id", "attempt", "name",
//!                                         "job_id", "failed_at" } ] } ],
//!   "worker_deaths_total",
//!   "worker_deaths": [ { "worker_id", "worker_type", "pid", "node_id", "job_id", "died_at",
//!                        "exit_type", "exit_detail", "log_command" } ],
//!   "session_end": { "last_event", "nodes_died": [ {node link} ],
//!                    "jobs_unfinished": [ { "job_id", "started", "reason" } ],
//!                    "tasks_unfinished": [ { "state", "job_id", "node_id", "count",
//!                                            "reason" } ],
//!                    "tasks_unfinished_total" },
//!   "hangs": { "pending_after_seconds", "placement_groups_source",
//!              "placement_groups": [ { "placement_group_id", "name", "creator_job_id",
//!                                      "state", "scheduling_state", "strategy",
//!                                      "bundles": [ {resource: amount} ], "requested_at",
//!                                      "unsatisfiable" } ],
//!              "pending_tasks": [ { "task_id", "attempt", "name", "job_id", "state",
//!                                   "since", "pending_seconds", "resources",
//!                                   "unsatisfiable" } ],
//!              "pending_tasks_total" },
//!   "actors": [ { "actor_id", "class_name", "name", "job_id", "state", "node_id", "pid",
//!                 "death_reason", "death_message", "worker" (its worker, by node and pid) } ],
//!   "train_runs" (by start time): [ { "run_id", "name", "job_id",
//!                     "status" (the latest event's; `ABORTED` for a `RUNNING` run whose
//!                               controller actor is `DEAD`, as Ray's Train head answers it),
//!                     "status_detail" (whole up to 4 MiB, else cut in the middle, marked), "started",
//!                     "ended", "framework_versions": {..},
//!                     "workers" (of the latest attempt), "framework",
//!                     "run_settings" (as Ray sent it, every member), "ray_train_version",
//!                     "controller_log_file_path", "controller_actor_id",
//!                     "other_fields": {..} (the run event's other members, by their names),
//!                     "train_run_command" (the inspect command that prints it in full),
//!                     "status_history": [ { "status", "time", "detail" } ] (an
//!                               `ABORTED` run's last entry at its controller's death),
//!                     "attempts" (by start time):
//!                                   [ { "attempt_id", "status", "status_detail", "started",
//!                                     "ended", "status_history": [..], "resources",
//!                                     "other_fields": {..},
//!                                     "workers": [ { "world_rank", "local_rank", "node_rank",
//!                                                    "actor_id", "node_id", "node_ip", "pid",
//!                                                    "status" (the actor's state when
//!                                                    known, as Ray's Train head answers it),
//!                                                    "gpu_ids", "log_file_path",
//!                                                    "resources", "log_command",
//!                                                    "other_fields": {..} } ] } ] } ],
//!   "problems": { "unreadable_objects", "bad_lines", "skipped_entries",
//!                 "details": [ { "key", "error" } ] } }
//! ```
//!
//! `failed_tasks` holds at most `--failed-limit` attempts, earliest failure first;
//! `failed_tasks_total` counts them all. A status history lists each change of status once.
//! `problems.unreadable_objects` counts objects that could not be fetched or decoded and
//! listings that failed; `problems.bad_lines` counts lines (or array elements) that are not
//! JSON objects or not Ray events; `problems.skipped_entries` counts the entries of a
//! `file://` bucket not read (links, special files, bad names); `details` says which and why
//! (at most 200 entries; keys escaped as in the text report).
//!
//! `--timeline FILE` (`timeline.rs`) and `--html FILE` (`html.rs`) write their files besides
//! the report; their formats are described there.
//!
//! `--train-run <run>` prints one of the session's `train_runs` entries instead of the
//! report (`--json`: `{ "storage", "cluster", "session", "train_run", "problems" }`);
//! `--compare-runs A B` compares two of them, B from another bucket with `--compare-storage`
//! (`train.rs`, which describes its document and exit codes).

use std::io::Write as _;
use std::sync::Arc;

use anyhow::Context as _;
use object_store::ObjectStore;
use serde::Serialize;

use crate::cli::InspectArgs;
use crate::reader::discover::{self, choose_session, discover, ClusterId};
use crate::reader::filter::Filter;
use crate::reader::local;
use crate::reader::report::SessionReport;
use crate::reader::task::TaskStore;
use crate::reader::walk::list_report;
use crate::reader::{open_bucket, session_report, OpenBucket};
use crate::storage::StorageSpec;
use crate::util::escape;

mod error;
mod html;
mod logs;
mod render;
mod timeline;
mod train;

pub use error::InspectError;
use render::{render_list, render_session};

/// What `inspect` found, for its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The report (or log, or run) was printed: exit 0.
    Done,
    /// `--compare-runs`: the two runs' settings are equal (exit 0).
    SameSettings,
    /// `--compare-runs`: the two runs' settings differ (exit 1).
    SettingsDiffer,
    /// `--compare-runs`: the runs were found but a side's settings were never recorded, so
    /// they could not be compared (exit [`COMPARE_ERROR_EXIT`], 2).
    NotCompared,
}

pub use train::COMPARE_ERROR_EXIT;

/// Runs `inspect`: prints the report on stdout.
///
/// Its error, printed by the caller, may quote names from the bucket: every character a
/// terminal could act on is escaped in it ([`escape`]).
pub async fn run(
    args: InspectArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Outcome> {
    run_unescaped(args, env)
        .await
        .map_err(|e| anyhow::anyhow!("{}", escape::escape_text(&format!("{e:#}"))))
}

async fn run_unescaped(
    args: InspectArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Outcome> {
    let bucket = Bucket::open(&args, env).await?;
    if let Some(operands) = &args.compare_runs {
        let other = match &args.compare_storage {
            Some(url) => {
                let mut b_args = args.clone();
                b_args.storage = url.clone();
                Some(Bucket::open(&b_args, env).await?)
            }
            None => None,
        };
        let b = other.as_ref().unwrap_or(&bucket);
        return compare_runs(&args, operands, [&bucket, b]).await;
    }
    let Bucket {
        spec,
        store,
        skips,
        found,
        filter,
    } = bucket;
    let mut out = String::new();
    match &args.session {
        None => {
            let mut report = list_report(&store, &spec, found, &filter).await;
            report.problems.add_skips(&skips);
            if args.json {
                out = to_json(&report)?;
            } else {
                render_list(&report, &mut out);
            }
        }
        Some(wanted) => {
            let (chosen, passed_over) = choose_session(&store, &spec, &found, wanted).await?;
            if let Some(id) = &args.logs {
                let printed = logs::print_logs(&store, &spec, chosen, &filter, &args, id).await;
                logs::tell_skips(&skips);
                return printed.map(|()| Outcome::Done);
            }
            if let Some(wanted) = &args.train_run {
                let mut report = quiet_report(&store, &spec, chosen, &filter, &args).await?;
                for (session, why) in passed_over {
                    report.problems.note(&session, why);
                }
                report.problems.add_skips(&skips);
                let run = train::find_run(&report, wanted)?;
                if args.json {
                    out = to_json(&train::TrainRunDocument {
                        storage: &report.storage,
                        cluster: &report.cluster,
                        session: &report.session,
                        train_run: run,
                        job: train::run_job(&report, run),
                        problems: &report.problems,
                    })?;
                } else {
                    train::render_train_run(&report, run, &mut out);
                    render::render_problems(&report.problems, &mut out);
                }
                print_out(&out)?;
                return Ok(Outcome::Done);
            }
            let mut trace = match &args.timeline {
                Some(path) => Some(
                    timeline::TraceWriter::create(path)
                        .with_context(|| format!("creating {}", path.display()))?,
                ),
                None => None,
            };
            let mut gantt = args.html.as_ref().map(|_| html::Gantt::default());
            let drawing = trace.is_some() || gantt.is_some();
            let mut report = session_report(
                &store,
                &spec,
                chosen,
                &filter,
                args.failed_limit,
                TaskStore::new(None),
                &mut |key, t, symbols| {
                    if !drawing {
                        return;
                    }
                    if let Some(slice) = timeline::slice_of(key, t, symbols) {
                        if let Some(w) = &mut trace {
                            w.slice(&slice);
                        }
                        if let Some(g) = &mut gantt {
                            g.add(slice);
                        }
                    }
                },
            )
            .await?;
            for (session, why) in passed_over {
                report.problems.note(&session, why);
            }
            report.problems.add_skips(&skips);
            if let (Some(w), Some(path)) = (trace, &args.timeline) {
                let n = w
                    .finish(&report)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!(
                    "timeline: {n} task attempt(s) written to {}",
                    path.display()
                );
            }
            if let (Some(g), Some(path)) = (gantt, &args.html) {
                std::fs::write(path, html::render_html(&report, &g))
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("html: written to {}", path.display());
            }
            if args.json {
                out = to_json(&report)?;
            } else {
                render_session(&report, &mut out);
            }
        }
    }
    print_out(&out)?;
    Ok(Outcome::Done)
}

/// One bucket opened for reading: where it is, its sessions, and the filters to read with.
struct Bucket {
    spec: StorageSpec,
    store: Arc<dyn ObjectStore>,
    skips: Arc<local::SkipLog>,
    found: discover::Discovered,
    filter: Filter,
}

impl Bucket {
    /// Opens `args.storage` and finds its clusters and sessions (no object is read).
    async fn open(
        args: &InspectArgs,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Bucket> {
        let spec = StorageSpec::parse(&args.storage)
            .and_then(|s| s.with_extra_root(&args.storage_root_dir))
            .with_context(|| format!("reading the storage location {:?}", args.storage))?;
        let filter = Filter::from_args(args)?;
        let OpenBucket {
            store,
            spec: _,
            skips,
        } = open_bucket(&spec, env)?;
        let found = discover(&store, &spec, args).await?;
        Ok(Bucket {
            spec,
            store,
            skips,
            found,
            filter,
        })
    }
}

/// A session's report with nothing drawn.
async fn quiet_report(
    store: &Arc<dyn ObjectStore>,
    spec: &StorageSpec,
    chosen: (ClusterId, String),
    filter: &Filter,
    args: &InspectArgs,
) -> anyhow::Result<SessionReport> {
    session_report(
        store,
        spec,
        chosen,
        filter,
        args.failed_limit,
        TaskStore::new(None),
        &mut |_, _, _| {},
    )
    .await
}

/// `--compare-runs A B`: reads each operand's session (once when they share it) from its
/// bucket (`buckets[0]` for A, `buckets[1]` for B), finds the runs, prints what differs.
async fn compare_runs(
    args: &InspectArgs,
    operands: &[String],
    buckets: [&Bucket; 2],
) -> anyhow::Result<Outcome> {
    let [a_arg, b_arg] = operands else {
        return Err(InspectError::BadArgument {
            flag: "--compare-runs",
            value: operands.join(" "),
            reason: "needs two runs",
        }
        .into());
    };
    let mut reports: Vec<(usize, SessionReport)> = Vec::new();
    let mut picks: Vec<(usize, &str)> = Vec::new();
    for (side, operand) in [a_arg, b_arg].into_iter().enumerate() {
        let bucket = buckets[side];
        let same_bucket = std::ptr::eq(buckets[0], buckets[1]);
        let bucket_no = if same_bucket { 0 } else { side };
        let (session, run) = train::split_run_ref(operand);
        let session =
            session
                .or(args.session.as_deref())
                .ok_or_else(|| InspectError::RunWithoutSession {
                    run: operand.clone(),
                })?;
        let (chosen, passed_over) =
            choose_session(&bucket.store, &bucket.spec, &bucket.found, session).await?;
        let prefix = chosen.0.layout(&bucket.spec.root).history_prefix();
        let known = reports.iter().position(|(n, r)| {
            *n == bucket_no && r.session == chosen.1 && r.cluster.history_prefix == prefix
        });
        let at = match known {
            Some(at) => at,
            None => {
                let mut report =
                    quiet_report(&bucket.store, &bucket.spec, chosen, &bucket.filter, args).await?;
                for (session, why) in passed_over {
                    report.problems.note(&session, why);
                }
                if !reports.iter().any(|(n, _)| *n == bucket_no) {
                    report.problems.add_skips(&bucket.skips);
                }
                reports.push((bucket_no, report));
                reports.len() - 1
            }
        };
        picks.push((at, run));
    }
    let (report_a, run_a) = (&reports[picks[0].0].1, picks[0].1);
    let (report_b, run_b) = (&reports[picks[1].0].1, picks[1].1);
    let a = train::find_run(report_a, run_a)?;
    let b = train::find_run(report_b, run_b)?;
    let not_compared = train::not_comparable(a, b);
    // Unknown settings are not compared: no differences listed, exit 2.
    let differences = if not_compared.is_some() {
        Vec::new()
    } else {
        train::differences(a, b)
    };
    let comparison = train::Comparison {
        a: train::RunSide::new(a_arg, report_a, a),
        b: train::RunSide::new(b_arg, report_b, b),
        settings_equal: not_compared.is_none() && differences.is_empty(),
        not_compared,
        differences,
        problems: reports
            .iter()
            .map(|(_, r)| {
                serde_json::json!({
                    "session": r.session,
                    "problems": serde_json::to_value(&r.problems).unwrap_or_default(),
                })
            })
            .collect(),
    };
    let mut out = String::new();
    if args.json {
        out = to_json(&comparison)?;
    } else {
        train::render_comparison(&comparison, &mut out);
        for (_, r) in reports.iter().filter(|(_, r)| !r.problems.is_empty()) {
            let _ = std::fmt::Write::write_fmt(
                &mut out,
                format_args!("\nsession {}:", render::clean(&r.session)),
            );
            render::render_problems(&r.problems, &mut out);
        }
    }
    print_out(&out)?;
    Ok(if comparison.not_compared.is_some() {
        Outcome::NotCompared
    } else if comparison.settings_equal {
        Outcome::SameSettings
    } else {
        Outcome::SettingsDiffer
    })
}

/// The report as JSON. `serde_json` escapes C0 controls but writes DEL, C1 controls and
/// `U+202E` raw; they are escaped here too (`\u0085`: the same JSON string), so the
/// document is safe on a terminal.
fn to_json<T: Serialize>(report: &T) -> anyhow::Result<String> {
    let raw = serde_json::to_string_pretty(report).context("serialising the report")?;
    let mut s = String::with_capacity(raw.len() + 1);
    for c in raw.chars() {
        if escape::is_unsafe_char(c) && c != '\n' {
            // Outside strings there is only ASCII whitespace; these are all in the BMP.
            let _ = std::fmt::Write::write_fmt(&mut s, format_args!("\\u{:04x}", c as u32));
        } else {
            s.push(c);
        }
    }
    s.push('\n');
    Ok(s)
}

/// Writes the report; a closed pipe (`| head`) is not an error.
fn print_out(text: &str) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut lock = stdout.lock();
    match lock.write_all(text.as_bytes()).and_then(|()| lock.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing the report to stdout"),
    }
}
