//! `inspect … --timeline FILE`: the session in the Chrome trace event format (JSON), which
//! Perfetto (ui.perfetto.dev) and `chrome://tracing` load.
//!
//! - A process per node (`Node <ip> <node id>`), a thread per worker (`worker:<worker id>`,
//!   the name `ray timeline` gives it too).
//! - A complete slice (`ph: X`) per task attempt that ran: from the start of its profiled
//!   execution (`task::<name>`, when the worker's profile events were exported) or else its
//!   first RUNNING, to the end of that execution or else its final state. Name: the
//!   function; args: task id, attempt, state, job, error.
//! - An instant event (`ph: i`) per failed attempt, at its FAILED time, on its worker.
//! - A process `Session` with a thread per job (a slice from start to end), per Ray Train
//!   run (the run's slice, its attempts nested in it) and per actor (ALIVE to DEAD).
//!
//! Slices are written as the attempts are folded ([`TraceWriter::slice`]), so the file can
//! be as big as the session without the session being held in memory. Times are
//! microseconds since the Unix epoch, as in `ray timeline`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde::Serialize;
use serde_json::{json, Value};

use super::render::error_summary;
use crate::reader::filter::parse_time_ns;
use crate::reader::report::SessionReport;
use crate::reader::task::{AttemptKey, Sym, Symbols, TaskState, NO_TIME};

/// The lane of a driver's own task.
pub(super) const DRIVER: &str = "driver";

/// The `Session` process (jobs, Train runs, actors); nodes are numbered from 1.
const SESSION_PID: u32 = 0;

/// One attempt as drawn: where it ran and when.
#[derive(Debug, Clone)]
pub(super) struct Slice {
    pub(super) task_id: String,
    pub(super) attempt: i32,
    pub(super) name: String,
    pub(super) state: String,
    pub(super) job: Option<String>,
    pub(super) node: Option<String>,
    pub(super) worker: Option<String>,
    pub(super) start_ns: i64,
    pub(super) end_ns: i64,
    pub(super) failed_ns: Option<i64>,
    pub(super) error_type: Option<String>,
    pub(super) error: Option<String>,
    /// Times from the worker's profile events (else from state transitions).
    pub(super) profiled: bool,
}

/// The slice of an attempt, or `None` for one that never ran.
pub(super) fn slice_of(key: &AttemptKey, t: &TaskState, symbols: &Symbols) -> Option<Slice> {
    if !t.known {
        return None;
    }
    let profiled = t.exec_start != NO_TIME;
    let (start, end, worker) = if profiled {
        (t.exec_start, t.exec_end, t.exec_worker)
    } else if t.running_ns != NO_TIME {
        let end = if t.latest_ns != NO_TIME && t.latest_ns >= t.running_ns {
            t.latest_ns
        } else {
            t.running_ns
        };
        (t.running_ns, end, t.worker)
    } else {
        return None;
    };
    let extra = t.extra.as_deref();
    let node = [t.node, symbols.node_of(worker), symbols.node_of(t.worker)]
        .into_iter()
        .find(|n| !n.is_none())
        .unwrap_or(Sym::NONE);
    Some(Slice {
        task_id: key.id.hex(),
        attempt: key.attempt,
        name: symbols.owned(t.name).unwrap_or_else(|| "task".into()),
        state: t.state(symbols).to_string(),
        job: symbols.owned(t.job),
        node: symbols.owned(node),
        worker: symbols
            .owned(worker)
            .or_else(|| symbols.owned(t.worker))
            .or_else(|| symbols.owned(t.exec_worker))
            .or_else(|| {
                // The driver's own task runs in the driver, not in a worker.
                (symbols.get(t.task_type) == Some("DRIVER_TASK")).then(|| DRIVER.to_string())
            }),
        start_ns: start,
        end_ns: end.max(start),
        failed_ns: (t.failed_ns != NO_TIME).then_some(t.failed_ns),
        error_type: extra.and_then(|e| e.error_type.clone()),
        error: extra
            .and_then(|e| e.error_message.as_deref())
            .map(error_summary),
        profiled,
    })
}

fn micros(ns: i64) -> f64 {
    ns as f64 / 1000.0
}

#[derive(Serialize)]
struct Complete<'a> {
    name: &'a str,
    cat: &'a str,
    ph: &'static str,
    ts: f64,
    dur: f64,
    pid: u32,
    tid: u32,
    args: Value,
}

#[derive(Serialize)]
struct Instant<'a> {
    name: &'a str,
    cat: &'a str,
    ph: &'static str,
    s: &'static str,
    ts: f64,
    pid: u32,
    tid: u32,
    args: Value,
}

/// Streams a trace to a file.
pub(super) struct TraceWriter {
    out: BufWriter<File>,
    first: bool,
    /// node id (or "" for unknown) → pid.
    nodes: HashMap<String, u32>,
    /// (pid, worker id) → tid.
    workers: HashMap<(u32, String), u32>,
    pub(super) slices: u64,
    error: Option<std::io::Error>,
}

impl TraceWriter {
    pub(super) fn create(path: &Path) -> std::io::Result<TraceWriter> {
        let mut out = BufWriter::new(File::create(path)?);
        out.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n")?;
        Ok(TraceWriter {
            out,
            first: true,
            nodes: HashMap::new(),
            workers: HashMap::new(),
            slices: 0,
            error: None,
        })
    }

    fn event<T: Serialize>(&mut self, e: &T) {
        if self.error.is_some() {
            return;
        }
        let sep: &[u8] = if self.first { b"" } else { b",\n" };
        self.first = false;
        let r = self
            .out
            .write_all(sep)
            .and_then(|()| serde_json::to_writer(&mut self.out, e).map_err(std::io::Error::from));
        if let Err(e) = r {
            self.error = Some(e);
        }
    }

    fn pid_of(&mut self, node: Option<&str>) -> u32 {
        let next = self.nodes.len() as u32 + 1;
        *self
            .nodes
            .entry(node.unwrap_or("").to_string())
            .or_insert(next)
    }

    fn tid_of(&mut self, pid: u32, worker: Option<&str>) -> u32 {
        let next = self.workers.len() as u32 + 1;
        *self
            .workers
            .entry((pid, worker.unwrap_or("").to_string()))
            .or_insert(next)
    }

    /// Writes an attempt's slice (and its failure).
    pub(super) fn slice(&mut self, s: &Slice) {
        let pid = self.pid_of(s.node.as_deref());
        let tid = self.tid_of(pid, s.worker.as_deref());
        let args = json!({
            "task_id": s.task_id,
            "attempt": s.attempt,
            "state": s.state,
            "job_id": s.job,
            "worker_id": s.worker,
            "error_type": s.error_type,
            "error": s.error,
            "times_from": if s.profiled { "profile events" } else { "state transitions" },
        });
        self.event(&Complete {
            name: &s.name,
            cat: "task",
            ph: "X",
            ts: micros(s.start_ns),
            dur: micros(s.end_ns) - micros(s.start_ns),
            pid,
            tid,
            args: args.clone(),
        });
        self.slices += 1;
        if let Some(at) = s.failed_ns {
            self.event(&Instant {
                name: &format!("FAILED {}", s.name),
                cat: "failure",
                ph: "i",
                s: "t",
                ts: micros(at),
                pid,
                tid,
                args,
            });
        }
    }

    /// Writes the session's tracks and the names of processes and threads, and closes the
    /// file.
    pub(super) fn finish(mut self, report: &SessionReport) -> std::io::Result<u64> {
        let mut tid = 0u32;
        let mut track = |w: &mut TraceWriter, name: String| {
            tid += 1;
            w.event(
                &json!({"name": "thread_name", "ph": "M", "pid": SESSION_PID, "tid": tid,
                            "args": {"name": name}}),
            );
            tid
        };
        let span = |from: &Option<String>, to: &Option<String>| -> Option<(i64, i64)> {
            let start = parse_time_ns(from.as_deref()?)?;
            let end = to.as_deref().and_then(parse_time_ns).unwrap_or(start);
            Some((start, end.max(start)))
        };
        for j in &report.jobs {
            let t = track(&mut self, format!("job {}", j.job_id));
            if let Some((start, end)) = span(&j.started, &j.ended) {
                let name = format!("job {}", j.job_id);
                self.event(&Complete {
                    name: &name,
                    cat: "job",
                    ph: "X",
                    ts: micros(start),
                    dur: micros(end) - micros(start),
                    pid: SESSION_PID,
                    tid: t,
                    args: json!({"job_id": j.job_id, "status": j.status,
                                 "entrypoint": j.entrypoint}),
                });
            }
        }
        for r in &report.train_runs {
            let name = format!("train run {}", r.name.as_deref().unwrap_or(&r.run_id));
            let t = track(&mut self, name.clone());
            if let Some((start, end)) = span(&r.started, &r.ended) {
                self.event(&Complete {
                    name: &name,
                    cat: "train_run",
                    ph: "X",
                    ts: micros(start),
                    dur: micros(end) - micros(start),
                    pid: SESSION_PID,
                    tid: t,
                    args: json!({"run_id": r.run_id, "status": r.status, "job_id": r.job_id}),
                });
            }
            for a in &r.attempts {
                if let Some((start, end)) = span(&a.started, &a.ended) {
                    self.event(&Complete {
                        name: &format!("attempt {}", a.attempt_id),
                        cat: "train_attempt",
                        ph: "X",
                        ts: micros(start),
                        dur: micros(end) - micros(start),
                        pid: SESSION_PID,
                        tid: t,
                        args: json!({"attempt_id": a.attempt_id, "status": a.status,
                                     "workers": a.workers.len()}),
                    });
                }
            }
        }
        for a in &report.actors {
            let Some(start) = a.alive_ns else {
                continue;
            };
            let end = a.dead_ns.unwrap_or(start).max(start);
            let name = format!(
                "actor {}",
                a.class_name.as_deref().unwrap_or(a.actor_id.as_str())
            );
            let t = track(&mut self, format!("{name} {}", a.actor_id));
            self.event(&Complete {
                name: &name,
                cat: "actor",
                ph: "X",
                ts: micros(start),
                dur: micros(end) - micros(start),
                pid: SESSION_PID,
                tid: t,
                args: json!({"actor_id": a.actor_id, "state": a.state, "pid": a.pid,
                             "death_reason": a.death_reason}),
            });
        }
        self.event(
            &json!({"name": "process_name", "ph": "M", "pid": SESSION_PID,
                           "args": {"name": format!("Session {}", report.session)}}),
        );
        self.event(
            &json!({"name": "process_sort_index", "ph": "M", "pid": SESSION_PID,
                           "args": {"sort_index": 0}}),
        );
        let ips: HashMap<&str, &str> = report
            .nodes
            .iter()
            .filter_map(|n| Some((n.node_id.as_str(), n.ip.as_deref()?)))
            .collect();
        let mut nodes: Vec<(String, u32)> =
            self.nodes.iter().map(|(k, v)| (k.clone(), *v)).collect();
        nodes.sort_by_key(|(_, pid)| *pid);
        for (node, pid) in nodes {
            let name = match (node.as_str(), ips.get(node.as_str())) {
                ("", _) => "Node (unknown)".to_string(),
                (id, Some(ip)) => format!("Node {ip} {id}"),
                (id, None) => format!("Node {id}"),
            };
            self.event(&json!({"name": "process_name", "ph": "M", "pid": pid,
                               "args": {"name": name}}));
        }
        let mut workers: Vec<((u32, String), u32)> =
            self.workers.iter().map(|(k, v)| (k.clone(), *v)).collect();
        workers.sort_by_key(|(_, tid)| *tid);
        for ((pid, worker), tid) in workers {
            let name = if worker.is_empty() {
                "worker (unknown)".to_string()
            } else if worker == DRIVER {
                DRIVER.to_string()
            } else {
                format!("worker:{worker}")
            };
            self.event(
                &json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                               "args": {"name": name}}),
            );
        }
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.out.write_all(b"\n]}\n")?;
        self.out.flush()?;
        Ok(self.slices)
    }
}
