//! The text report: tables for people, every value from the bucket cleaned of control
//! characters (terminal escapes included) and bounded in width.

use std::fmt::Write as _;

use crate::reader::filter::{parse_time_ns, NANOS_PER_SECOND};
use crate::reader::report::{ListReport, Problems, SessionReport, StatusEntry};
use crate::reader::values::human_bytes;
use crate::util::escape::{escape_text, is_unsafe_char};

/// Widest text-table cell.
pub(super) const MAX_CELL_CHARS: usize = 100;

/// Longest key or error shown in the problems section: the layout's keys are under 300
/// characters and an OS error under 100, so a whole one always fits; a longer one is the
/// bucket's doing.
const MAX_PROBLEM_TEXT_CHARS: usize = 1000;

/// `YYYY-MM-DD HH:MM:SS.mmm` (UTC), for tables.
pub(super) fn format_time_text(rfc3339: &str) -> String {
    let Some(ns) = parse_time_ns(rfc3339) else {
        return clean(rfc3339);
    };
    let seconds = ns.div_euclid(NANOS_PER_SECOND);
    let millis = ns.rem_euclid(NANOS_PER_SECOND) / 1_000_000;
    let base = crate::util::time::format_rfc3339(seconds).replace('T', " ");
    format!("{}.{millis:03}", base.trim_end_matches('Z'))
}

pub(super) fn human_duration(ns: i64) -> String {
    if ns < 0 {
        return "-".into();
    }
    let ms = ns / 1_000_000;
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let s = ms as f64 / 1000.0;
    if s < 60.0 {
        return format!("{s:.1}s");
    }
    let total = ms / 1000;
    let (h, m, sec) = (total / 3600, total % 3600 / 60, total % 60);
    if h > 0 {
        format!("{h}h{m:02}m")
    } else {
        format!("{m}m{sec:02}s")
    }
}

/// A placement group's bundles as `{CPU: 1, GPU: 1} {CPU: 2}` (not escaped: the caller does).
pub(super) fn bundles_text(bundles: &[std::collections::BTreeMap<String, f64>]) -> String {
    bundles
        .iter()
        .map(|b| {
            let parts: Vec<String> = b
                .iter()
                .map(|(k, v)| format!("{k}: {}", crate::reader::scan::format_amount(*v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Makes untrusted text safe for a terminal: drops ANSI escape sequences, turns other
/// control characters (line breaks and C1 included) and the invisible characters that
/// reorder text (`U+202E`, [`is_unsafe_char`]) into spaces, bounds the length.
pub(super) fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_CELL_CHARS * 4));
    let mut chars = s.chars().peekable();
    let mut count = 0;
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte; other escapes: ESC + one char.
            if chars.peek() == Some(&'[') {
                chars.next();
                for n in chars.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&n) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
            continue;
        }
        let c = if is_unsafe_char(c) { ' ' } else { c };
        if count == MAX_CELL_CHARS {
            out.push('…');
            break;
        }
        out.push(c);
        count += 1;
    }
    out
}

/// The line of an error message that says what happened: its last non-empty line
/// (`RuntimeError: boom` at the end of a Python traceback).
pub(super) fn error_summary(message: &str) -> String {
    let stripped = clean_multiline(message);
    stripped
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .map(clean)
        .unwrap_or_default()
}

/// Like [`clean`] but keeps line breaks and the whole length.
pub(super) fn clean_multiline(s: &str) -> String {
    s.split('\n')
        .map(|line| {
            let mut out = String::new();
            let mut chars = line.chars().peekable();
            while let Some(c) = chars.next() {
                if c == '\u{1b}' {
                    if chars.peek() == Some(&'[') {
                        chars.next();
                        for n in chars.by_ref() {
                            if ('\u{40}'..='\u{7e}').contains(&n) {
                                break;
                            }
                        }
                    } else {
                        chars.next();
                    }
                    continue;
                }
                out.push(if is_unsafe_char(c) { ' ' } else { c });
            }
            out
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Like [`clean`] without the length bound (a command to copy must be whole).
pub(super) fn clean_long(s: &str) -> String {
    clean_multiline(s).replace('\n', " ")
}

pub(super) fn opt(s: &Option<String>) -> String {
    s.as_deref().map(clean).unwrap_or_else(|| "-".into())
}

pub(super) fn opt_time(s: &Option<String>) -> String {
    s.as_deref()
        .map(format_time_text)
        .unwrap_or_else(|| "-".into())
}

/// A text table: columns as wide as their widest cell, two spaces apart; numbers right-aligned.
pub(super) struct Table {
    pub(super) headers: Vec<&'static str>,
    pub(super) right_aligned: Vec<bool>,
    pub(super) rows: Vec<Vec<String>>,
}

impl Table {
    /// Columns named `headers`; a header starting with '>' is right-aligned (the '>' is not
    /// printed).
    pub(super) fn new(headers: &[&'static str]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.trim_start_matches('>')).collect(),
            right_aligned: headers.iter().map(|h| h.starts_with('>')).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; cells are cleaned of control characters here.
    pub(super) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells.iter().map(|c| clean(c)).collect());
    }

    pub(super) fn render(&self, indent: &str, out: &mut String) {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let headers: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        for row in std::iter::once(&headers).chain(&self.rows) {
            let mut line = String::from(indent);
            for (i, width) in widths.iter().enumerate() {
                let cell = row.get(i).map(String::as_str).unwrap_or("");
                let pad = width.saturating_sub(cell.chars().count());
                if i > 0 {
                    line.push_str("  ");
                }
                if self.right_aligned[i] {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    if i + 1 < columns {
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
}

pub(super) fn render_list(report: &ListReport, out: &mut String) {
    let _ = writeln!(out, "storage: {}", clean(&report.storage));
    let mut table = Table::new(&[
        "KIND",
        "NAMESPACE",
        "OWNER",
        "CLUSTER",
        "SESSION",
        "STARTED (HEAD CLOCK)",
        "EVENTS FROM (UTC)",
        "EVENTS UNTIL (UTC)",
        ">NODES",
        ">OBJECTS",
        ">SIZE",
    ]);
    for c in &report.clusters {
        for s in &c.sessions {
            table.row(vec![
                c.kind.clone(),
                c.namespace.clone(),
                opt(&c.owner),
                c.cluster.clone(),
                s.session.clone(),
                s.started
                    .as_deref()
                    .map(|t| t.replace('T', " ").chars().take(19).collect())
                    .unwrap_or_else(|| "-".into()),
                opt_hour(&s.events_from),
                opt_hour(&s.events_until),
                s.nodes.to_string(),
                s.objects.to_string(),
                human_bytes(s.bytes),
            ]);
        }
    }
    let sessions: usize = report.clusters.iter().map(|c| c.sessions.len()).sum();
    let _ = writeln!(
        out,
        "{} cluster(s), {sessions} session(s)\n",
        report.clusters.len()
    );
    table.render("", out);
    render_problems(&report.problems, out);
}

pub(super) fn opt_hour(s: &Option<String>) -> String {
    s.as_deref()
        .map(|t| format_time_text(t).chars().take(16).collect())
        .unwrap_or_else(|| "-".into())
}

pub(super) fn render_session(r: &SessionReport, out: &mut String) {
    let c = &r.cluster;
    let _ = writeln!(out, "session   {}", clean(&r.session));
    let _ = writeln!(
        out,
        "cluster   {} {}/{}{} ({})",
        clean(&c.kind),
        clean(&c.namespace),
        c.owner
            .as_deref()
            .map(|o| format!("{}/", clean(o)))
            .unwrap_or_default(),
        clean(&c.cluster),
        clean(&r.storage)
    );
    if let Some(started) = &r.started {
        let _ = writeln!(
            out,
            "started   {} (head's clock)",
            clean(&started.replace('T', " "))
        );
    }
    let mut filters = Vec::new();
    if let Some(j) = &r.filter.job {
        filters.push(format!("job {}", clean(j)));
    }
    if let Some(s) = &r.filter.since {
        filters.push(format!("since {}", format_time_text(s)));
    }
    if let Some(u) = &r.filter.until {
        filters.push(format!("until {}", format_time_text(u)));
    }
    if !filters.is_empty() {
        let _ = writeln!(out, "filter    {}", filters.join(", "));
    }
    let o = &r.objects;
    let _ = writeln!(
        out,
        "read      {} of {} event objects{} ({}), {} skipped by time; {} events, {} duplicates{}",
        o.read,
        o.event_objects_listed,
        if o.unreadable > 0 {
            format!(", {} unreadable", o.unreadable)
        } else {
            String::new()
        },
        human_bytes(o.bytes_read),
        o.skipped_by_time,
        r.events.total,
        r.events.duplicates,
        if r.events.outside_time_window > 0 {
            format!(", {} outside the time window", r.events.outside_time_window)
        } else {
            String::new()
        }
    );
    let _ = writeln!(out, "times are UTC");

    let _ = writeln!(out, "\nNODES");
    let mut nodes = Table::new(&[
        "NODE ID", "IP", "HOSTNAME", "HEAD", "STATE", "STARTED", "ENDED", ">CPU", ">OBJECTS",
        ">SIZE", ">LOGS",
    ]);
    for n in &r.nodes {
        nodes.row(vec![
            n.node_id.clone(),
            opt(&n.ip),
            opt(&n.hostname),
            match n.is_head {
                Some(true) => "yes".into(),
                Some(false) => "no".into(),
                None => "-".into(),
            },
            opt(&n.state),
            opt_time(&n.started),
            opt_time(&n.ended),
            n.resources
                .get("CPU")
                .map(|c| format!("{c}"))
                .unwrap_or_else(|| "-".into()),
            n.objects.to_string(),
            human_bytes(n.bytes),
            if n.log_objects > 0 {
                format!("{} ({})", n.log_objects, human_bytes(n.log_bytes))
            } else {
                "-".into()
            },
        ]);
    }
    render_or_none(&nodes, out);

    let _ = writeln!(out, "\nJOBS");
    let mut jobs = Table::new(&[
        "JOB ID",
        "STATUS",
        "STARTED",
        "ENDED",
        ">DURATION",
        ">TASKS",
        ">FAILED",
        "ENTRYPOINT",
    ]);
    for j in &r.jobs {
        jobs.row(vec![
            j.job_id.clone(),
            j.status.clone(),
            opt_time(&j.started),
            opt_time(&j.ended),
            j.duration_ns
                .map(human_duration)
                .unwrap_or_else(|| "-".into()),
            j.tasks.total.to_string(),
            j.failed.to_string(),
            opt(&j.entrypoint),
        ]);
    }
    render_or_none(&jobs, out);

    let _ = writeln!(
        out,
        "\nTASKS BY FINAL STATE ({} task attempts)",
        r.tasks.total
    );
    let mut states = Table::new(&["STATE", ">COUNT"]);
    for (state, n) in &r.tasks.by_state {
        states.row(vec![state.clone(), n.to_string()]);
    }
    render_or_none(&states, out);
    if r.tasks
        .by_state
        .keys()
        .any(|s| s != "FINISHED" && s != "FAILED" && s != "UNKNOWN")
    {
        let _ = writeln!(
            out,
            "  (states other than FINISHED and FAILED are the last ones recorded before the \
             session's events stop: nothing here is running now; see WHAT ENDED THE SESSION)"
        );
    }

    render_causes(r, out);
    let _ = writeln!(
        out,
        "\nFAILED TASKS ({} of {})",
        r.failed_tasks.len(),
        r.failed_tasks_total
    );
    let mut failed = Table::new(&[
        "FAILED AT",
        "TASK ID",
        ">ATTEMPT",
        "NAME",
        "JOB ID",
        "ERROR TYPE",
        "ERROR",
    ]);
    for t in &r.failed_tasks {
        failed.row(vec![
            opt_time(&t.failed_at),
            t.task_id.clone(),
            t.attempt.to_string(),
            opt(&t.name),
            opt(&t.job_id),
            opt(&t.error_type),
            t.error_message
                .as_deref()
                .map(error_summary)
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    render_or_none(&failed, out);
    if !r.failed_tasks.is_empty() {
        let _ = writeln!(out, "  their logs (stderr; drop --err for stdout):");
        for t in &r.failed_tasks {
            match &t.log_command {
                Some(command) => {
                    let _ = writeln!(out, "    {}", clean_long(command));
                }
                None => {
                    let _ = writeln!(
                        out,
                        "    (task {}: its id in the events is not an id, no log to look up)",
                        clean(&t.task_id)
                    );
                }
            }
        }
    }
    if r.failed_tasks_total > r.failed_tasks.len() as u64 {
        let _ = writeln!(
            out,
            "  ({} more; raise --failed-limit to list them)",
            r.failed_tasks_total - r.failed_tasks.len() as u64
        );
    }

    render_worker_deaths(r, out);
    render_session_end(r, out);
    render_hangs(r, out);

    let _ = writeln!(out, "\nACTORS");
    let mut actors = Table::new(&[
        "ACTOR ID", "CLASS", "NAME", "JOB ID", "STATE", ">PID", "DEATH",
    ]);
    for a in &r.actors {
        let death = match (&a.death_reason, &a.death_message) {
            (None, None) => "-".to_string(),
            (reason, message) => {
                let mut s = reason.clone().unwrap_or_default();
                if let Some(m) = message {
                    if !s.is_empty() {
                        s.push_str(": ");
                    }
                    s.push_str(&error_summary(m));
                }
                s
            }
        };
        actors.row(vec![
            a.actor_id.clone(),
            opt(&a.class_name),
            opt(&a.name),
            opt(&a.job_id),
            opt(&a.state),
            a.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            death,
        ]);
    }
    render_or_none(&actors, out);

    let _ = writeln!(out, "\nRAY TRAIN RUNS");
    let mut runs = Table::new(&[
        "RUN ID",
        "NAME",
        "JOB ID",
        "STATUS",
        "STARTED",
        "ENDED",
        ">DURATION",
        ">ATTEMPTS",
        ">WORKERS",
        "FRAMEWORK",
    ]);
    for run in &r.train_runs {
        runs.row(vec![
            run.run_id.clone(),
            opt(&run.name),
            opt(&run.job_id),
            opt(&run.status),
            opt_time(&run.started),
            opt_time(&run.ended),
            run.duration_ns
                .map(human_duration)
                .unwrap_or_else(|| "-".into()),
            run.attempts.len().to_string(),
            run.workers
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into()),
            opt(&run.framework),
        ]);
    }
    render_or_none(&runs, out);
    for run in &r.train_runs {
        let _ = writeln!(out, "\n  run {} ({})", clean(&run.run_id), opt(&run.name));
        let _ = writeln!(
            out,
            "    in full:        {}",
            clean_long(&run.train_run_command)
        );
        let _ = writeln!(
            out,
            "    status history: {}",
            history_text(&run.status_history)
        );
        if let Some(detail) = &run.status_detail {
            let _ = writeln!(out, "    status detail:  {}", clean(detail));
        }
        for a in &run.attempts {
            let _ = writeln!(
                out,
                "    attempt {}: {}, {} worker(s); history: {}",
                clean(&a.attempt_id),
                opt(&a.status),
                a.workers.len(),
                history_text(&a.status_history)
            );
            if a.workers.is_empty() {
                continue;
            }
            let mut workers = Table::new(&[
                ">RANK",
                ">LOCAL RANK",
                ">NODE RANK",
                "NODE IP",
                ">PID",
                "STATUS",
                "ACTOR ID",
                "NODE ID",
            ]);
            let num = |n: Option<i64>| n.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
            for w in &a.workers {
                workers.row(vec![
                    num(w.world_rank),
                    num(w.local_rank),
                    num(w.node_rank),
                    opt(&w.node_ip),
                    num(w.pid),
                    opt(&w.status),
                    opt(&w.actor_id),
                    opt(&w.node_id),
                ]);
            }
            workers.render("      ", out);
        }
    }

    render_problems(&r.problems, out);
}

pub(super) fn history_text(history: &[StatusEntry]) -> String {
    if history.is_empty() {
        return "-".into();
    }
    history
        .iter()
        .map(|s| clean(&s.status))
        .collect::<Vec<_>>()
        .join(" → ")
}

pub(super) fn render_or_none(table: &Table, out: &mut String) {
    if table.rows.is_empty() {
        out.push_str("(none)\n");
    } else {
        table.render("", out);
    }
}

/// `s` escaped ([`escape_text`]) and cut at `max` characters.
fn bounded_text(s: &str, max: usize) -> String {
    let escaped = escape_text(s);
    match escaped.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &escaped[..at]),
        None => escaped,
    }
}

pub(super) fn render_problems(p: &Problems, out: &mut String) {
    if p.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nPROBLEMS: {} unreadable object(s), {} bad line(s), {} entr{} skipped",
        p.unreadable_objects,
        p.bad_lines,
        p.skipped_entries,
        if p.skipped_entries == 1 { "y" } else { "ies" }
    );
    // Keys and errors were escaped when noted; shown whole up to a bound, so that the
    // OS error at the end of a message is not cut off.
    for d in &p.details {
        let _ = writeln!(
            out,
            "  {}: {}",
            bounded_text(&d.key, MAX_PROBLEM_TEXT_CHARS),
            bounded_text(&d.error, MAX_PROBLEM_TEXT_CHARS)
        );
    }
}

/// A node id as the sentences show it: its first 8 hex digits (the tables have it whole).
fn short_id(id: &str) -> String {
    clean(&id.chars().take(8).collect::<String>())
}

/// `WHY IT FAILED`: one line per distinct cause, then how to read the first one's log.
fn render_causes(r: &SessionReport, out: &mut String) {
    let _ = writeln!(
        out,
        "\nWHY IT FAILED ({} distinct causes)",
        r.failure_causes.len()
    );
    if r.failure_causes.is_empty() {
        out.push_str("(nothing failed)\n");
        return;
    }
    for g in &r.failure_causes {
        let plural = |n: u64, one: &str| match n {
            0 => None,
            1 => Some(format!("1 {one}")),
            n => Some(format!("{n} {one}s")),
        };
        let what = [plural(g.attempts, "attempt"), plural(g.actors, "actor")]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" and ");
        let names: Vec<String> = {
            let mut seen: Vec<String> = Vec::new();
            for e in &g.examples {
                let n = e.name.clone().unwrap_or_else(|| "?".into());
                if !seen.contains(&n) {
                    seen.push(n);
                }
            }
            seen
        };
        let node = g
            .node_id
            .as_deref()
            .map(|n| format!(" on node {}", short_id(n)))
            .unwrap_or_default();
        let at = g
            .first_at
            .as_deref()
            .map(|t| format!(" at {}", format_time_text(t)))
            .unwrap_or_default();
        let detail = g
            .detail
            .as_deref()
            .map(|d| format!(": {}", clean(d)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {what} ({}): {}{node}{at}{detail}",
            clean(&names.join(", ")),
            clean(&g.cause)
        );
        if let Some(c) = &g.log_command {
            let _ = writeln!(out, "      log: {}", clean_long(c));
        }
    }
    let other = &r.failure_causes_other;
    if other.attempts + other.actors > 0 {
        let _ = writeln!(
            out,
            "  {} attempt(s) and {} actor(s) of other causes (only the first {} causes by \
             cause, exit type and node are grouped)",
            other.attempts,
            other.actors,
            r.failure_causes.len()
        );
    }
}

fn render_worker_deaths(r: &SessionReport, out: &mut String) {
    let _ = writeln!(
        out,
        "\nWORKER DEATHS ({} of {}, intended exits not counted)",
        r.worker_deaths.len(),
        r.worker_deaths_total
    );
    let mut t = Table::new(&[
        "DIED AT",
        "WORKER ID",
        ">PID",
        "NODE",
        "JOB ID",
        "EXIT TYPE",
        "DETAIL",
    ]);
    for d in &r.worker_deaths {
        t.row(vec![
            opt_time(&d.died_at),
            d.worker_id.clone(),
            d.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            d.node_id
                .as_deref()
                .map(short_id)
                .unwrap_or_else(|| "-".into()),
            opt(&d.job_id),
            opt(&d.exit_type),
            d.exit_detail
                .as_deref()
                .map(crate::reader::causes::first_line)
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    render_or_none(&t, out);
    if let Some(d) = r.worker_deaths.first() {
        let _ = writeln!(out, "  a worker's log: {}", clean_long(&d.log_command));
    }
}

fn render_session_end(r: &SessionReport, out: &mut String) {
    let e = &r.session_end;
    let _ = writeln!(
        out,
        "\nWHAT ENDED THE SESSION (its events stop at {})",
        opt_time(&e.last_event)
    );
    let mut any = false;
    for n in &e.nodes_died {
        any = true;
        let _ = writeln!(
            out,
            "  node {} died at {}: {}{}",
            short_id(&n.node_id),
            opt_time(&n.died_at),
            opt(&n.death_reason),
            n.death_message
                .as_deref()
                .map(|m| format!(" ({})", clean(m)))
                .unwrap_or_default()
        );
    }
    for n in &r.nodes {
        let head = if n.is_head == Some(true) {
            " (head)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  node {}{head}: {}, last heard of at {}",
            short_id(&n.node_id),
            opt(&n.state),
            opt_time(&n.last_heard)
        );
        any = true;
    }
    for j in &e.jobs_unfinished {
        any = true;
        let _ = writeln!(out, "  job {} {}", clean(&j.job_id), clean(&j.reason));
    }
    for u in &e.tasks_unfinished {
        any = true;
        let _ = writeln!(
            out,
            "  {} task attempt(s) left {} (job {}, node {}), unfinished: {}",
            u.count,
            clean(&u.state),
            opt(&u.job_id),
            u.node_id
                .as_deref()
                .map(short_id)
                .unwrap_or_else(|| "-".into()),
            clean(&u.reason)
        );
    }
    let grouped: u64 = e.tasks_unfinished.iter().map(|u| u.count).sum();
    if e.tasks_unfinished_total > grouped {
        let _ = writeln!(
            out,
            "  {} more task attempt(s) left unfinished in other groups (only the first {} \
             groups by state, job and node are kept)",
            e.tasks_unfinished_total - grouped,
            e.tasks_unfinished.len()
        );
    }
    if !any {
        out.push_str("(nothing unfinished)\n");
    }
}

fn render_hangs(r: &SessionReport, out: &mut String) {
    let h = &r.hangs;
    let _ = writeln!(out, "\nWHAT HUNG");
    if h.placement_groups_source.is_none() {
        out.push_str("  placement groups: no dashboard snapshot in the bucket\n");
    }
    for pg in &h.placement_groups {
        let bundles = bundles_text(&pg.bundles);
        let _ = writeln!(
            out,
            "  placement group {} ({}) {}{} since {}, strategy {}, bundles {}{}",
            clean(&pg.placement_group_id),
            opt(&pg.name),
            opt(&pg.state),
            pg.scheduling_state
                .as_deref()
                .map(|s| format!("/{}", clean(s)))
                .unwrap_or_default(),
            opt_time(&pg.requested_at),
            opt(&pg.strategy),
            clean(&bundles),
            pg.unsatisfiable
                .as_deref()
                .map(|u| format!(": never fits, {}", clean(u)))
                .unwrap_or_default()
        );
    }
    for t in &h.pending_tasks {
        let _ = writeln!(
            out,
            "  task {} ({}) {} for {} asking {{{}}}{}",
            clean(&t.task_id),
            opt(&t.name),
            clean(&t.state),
            t.pending_seconds
                .map(|s| human_duration((s * 1e9) as i64))
                .unwrap_or_else(|| "-".into()),
            opt(&t.resources),
            t.unsatisfiable
                .as_deref()
                .map(|u| format!(": never fits, {}", clean(u)))
                .unwrap_or_default()
        );
    }
    if h.pending_tasks_total > h.pending_tasks.len() as u64 {
        let _ = writeln!(
            out,
            "  ({} more pending tasks)",
            h.pending_tasks_total - h.pending_tasks.len() as u64
        );
    }
    if h.placement_groups.is_empty() && h.pending_tasks.is_empty() {
        let _ = writeln!(
            out,
            "  (no placement group unplaced, no task pending over {})",
            human_duration((h.pending_after_seconds * 1e9) as i64)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_times_keep_milliseconds() {
        assert_eq!(
            format_time_text("2026-11-22T02:06:40.942Z"),
            "2026-11-22 02:06:40.942"
        );
    }

    #[test]
    fn terminal_text_is_cleaned() {
        assert_eq!(clean("a\u{1b}[31mred\u{1b}[0m\nb\tc"), "ared b c");
        assert_eq!(
            error_summary(
                "User exception:\n\u{1b}[36mray::fails()\u{1b}[39m\n  File x\nRuntimeError: boom\n"
            ),
            "RuntimeError: boom"
        );
        assert_eq!(clean(&"x".repeat(500)).chars().count(), MAX_CELL_CHARS + 1);
    }

    #[test]
    fn tables_align() {
        let mut t = Table::new(&["A", ">N", "LAST"]);
        t.row(vec!["long value".into(), "7".into(), "x".into()]);
        t.row(vec!["b".into(), "1234".into(), "yy".into()]);
        let mut out = String::new();
        t.render("", &mut out);
        assert_eq!(
            out,
            "A              N  LAST\nlong value     7  x\nb           1234  yy\n"
        );
    }
}
