//! `inspect … --html FILE`: one self-contained page (inline CSS and SVG, no script, nothing
//! fetched from the network) with the session summary, the failed tasks and their errors,
//! and the timeline drawn as a Gantt chart: the jobs and Ray Train runs (with their
//! attempts) on top, then a lane per worker grouped by node, a bar per task attempt coloured
//! by its final state, a red mark at each failure.
//!
//! Every bar carries `data-task-id`, `data-attempt` and `data-state`, every failure mark
//! `data-failure` and `data-task-id`, so the drawing can be checked from the DOM. At most
//! [`MAX_DRAWN_ATTEMPTS`] attempts are drawn (the page says how many were left out); every
//! value from the bucket is HTML-escaped.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::render::{error_summary, format_time_text, human_duration};
use super::timeline::Slice;
use crate::reader::filter::parse_time_ns;
use crate::reader::report::SessionReport;

/// Attempts drawn at most: a browser draws this many rectangles without trouble.
pub(super) const MAX_DRAWN_ATTEMPTS: usize = 20_000;
/// Width of the time axis and of the lane labels, in pixels.
const CHART_WIDTH: f64 = 1000.0;
const LABEL_WIDTH: f64 = 330.0;
const LANE_HEIGHT: f64 = 18.0;
const BAR_HEIGHT: f64 = 12.0;

/// The attempts to draw, collected while the session is folded: the
/// [`MAX_DRAWN_ATTEMPTS`] least by (start, task id, attempt), whatever order they come in.
#[derive(Debug, Default)]
pub(super) struct Gantt {
    /// A max-heap: its top is the attempt a lesser one replaces.
    slices: std::collections::BinaryHeap<Drawn>,
    /// Attempts that ran but were not drawn (past [`MAX_DRAWN_ATTEMPTS`]).
    pub(super) left_out: u64,
}

/// A slice ordered by (start, task id, attempt): a total order, as an attempt is drawn once.
#[derive(Debug)]
struct Drawn(Slice);

impl Drawn {
    fn rank(&self) -> (i64, &str, i32) {
        (self.0.start_ns, &self.0.task_id, self.0.attempt)
    }
}

impl PartialEq for Drawn {
    fn eq(&self, other: &Drawn) -> bool {
        self.rank() == other.rank()
    }
}

impl Eq for Drawn {}

impl PartialOrd for Drawn {
    fn partial_cmp(&self, other: &Drawn) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Drawn {
    fn cmp(&self, other: &Drawn) -> std::cmp::Ordering {
        self.rank().cmp(&other.rank())
    }
}

impl Gantt {
    pub(super) fn add(&mut self, s: Slice) {
        let s = Drawn(s);
        if self.slices.len() < MAX_DRAWN_ATTEMPTS {
            self.slices.push(s);
            return;
        }
        self.left_out += 1;
        if self.slices.peek().is_some_and(|top| s < *top) {
            self.slices.pop();
            self.slices.push(s);
        }
    }

    /// The attempts drawn, by (start, task id, attempt).
    fn sorted(&self) -> Vec<&Slice> {
        let mut v: Vec<&Drawn> = self.slices.iter().collect();
        v.sort();
        v.into_iter().map(|d| &d.0).collect()
    }
}

/// Escapes text for HTML content and attribute values.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => {}
            // The invisible characters that reorder or hide text (a right-to-left
            // override turns `txt.exe` into `exe.txt`), shown as the text report shows
            // them (review r56b: raw in the page).
            c if crate::util::escape::is_unsafe_char(c) && !c.is_control() => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

fn opt(s: &Option<String>) -> String {
    s.as_deref().map(esc).unwrap_or_else(|| "-".into())
}

fn time(s: &Option<String>) -> String {
    s.as_deref()
        .map(|t| esc(&format_time_text(t)))
        .unwrap_or_else(|| "-".into())
}

/// The CSS class of a final state.
fn state_class(state: &str) -> &'static str {
    match state {
        "FINISHED" => "finished",
        "FAILED" => "failed",
        "RUNNING" | "RUNNING_IN_RAY_GET" | "RUNNING_IN_RAY_WAIT" => "running",
        _ => "other",
    }
}

const STYLE: &str = "
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#1d1d1f;background:#fff}
h1{font-size:18px;margin:0 0 4px}h2{font-size:15px;margin:20px 0 6px}
table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #e3e3e3;text-align:left;vertical-align:top}
th{background:#f4f4f6}td.n{text-align:right}
.meta{color:#555}.legend span{display:inline-block;margin-right:14px}
.sw{display:inline-block;width:12px;height:10px;margin-right:4px;vertical-align:middle}
pre{white-space:pre-wrap;background:#f7f7f9;padding:6px;margin:4px 0;max-width:1300px;font-size:12px}
svg{background:#fcfcfd;border:1px solid #ddd}
.finished{fill:#3a9a5b}.failed{fill:#d43f3a}.running{fill:#3b7dd8}.other{fill:#9a9aa3}
.job{fill:#7b61c4}.train_run{fill:#e0a21b}.train_attempt{fill:#f4c860}
.failure{fill:#b00000;stroke:#fff;stroke-width:.5}
.lane{fill:#f1f1f4}.node{font-weight:600}
text{font:11px system-ui,sans-serif;fill:#333}.axis{stroke:#ccc}
";

/// Writes the page.
pub(super) fn render_html(report: &SessionReport, gantt: &Gantt) -> String {
    let mut h = String::new();
    let title = format!("Ray session {}", report.session);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n",
        esc(&title)
    );
    let c = &report.cluster;
    let _ = writeln!(h, "<h1>{}</h1>", esc(&title));
    let _ = writeln!(
        h,
        "<div class=\"meta\">cluster {} {}/{}{} · {} · started {} (head's clock) · times are UTC</div>",
        esc(&c.kind),
        esc(&c.namespace),
        c.owner.as_deref().map(|o| format!("{}/", esc(o))).unwrap_or_default(),
        esc(&c.cluster),
        esc(&report.storage),
        opt(&report.started),
    );
    summary(&mut h, report);
    causes(&mut h, report);
    failed(&mut h, report);
    worker_deaths(&mut h, report);
    session_end(&mut h, report);
    hangs(&mut h, report);
    let _ = writeln!(h, "<h2>Timeline</h2>");
    let _ = writeln!(
        h,
        "<div class=\"legend\"><span><i class=\"sw\" style=\"background:#3a9a5b\"></i>FINISHED</span>\
         <span><i class=\"sw\" style=\"background:#d43f3a\"></i>FAILED</span>\
         <span><i class=\"sw\" style=\"background:#3b7dd8\"></i>still running</span>\
         <span><i class=\"sw\" style=\"background:#9a9aa3\"></i>other</span>\
         <span><i class=\"sw\" style=\"background:#7b61c4\"></i>job</span>\
         <span><i class=\"sw\" style=\"background:#e0a21b\"></i>Train run / attempt</span>\
         <span>▼ failure</span></div>"
    );
    chart(&mut h, report, gantt);
    h.push_str("</body></html>\n");
    h
}

fn summary(h: &mut String, r: &SessionReport) {
    let _ = writeln!(
        h,
        "<h2>Summary</h2><p>{} node(s), {} job(s), {} task attempt(s), {} failed, {} actor(s), \
         {} Ray Train run(s); {} events read from {} objects.</p>",
        r.nodes.len(),
        r.jobs.len(),
        r.tasks.total,
        r.failed_tasks_total,
        r.actors.len(),
        r.train_runs.len(),
        r.events.total,
        r.objects.read
    );
    h.push_str(
        "<p>States other than FINISHED and FAILED are the last ones recorded before the \
         session's events stop: nothing is running now (see What ended the session).</p>",
    );
    h.push_str("<table id=\"states\"><tr><th>final state</th><th>attempts</th></tr>");
    for (state, n) in &r.tasks.by_state {
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=\"n\">{n}</td></tr>",
            esc(state)
        );
    }
    h.push_str(
        "</table>\n<h2>Jobs</h2><table id=\"jobs\"><tr><th>job</th><th>status</th>\
                <th>started</th><th>ended</th><th>duration</th><th>tasks</th><th>failed</th>\
                <th>entrypoint</th></tr>",
    );
    for j in &r.jobs {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            esc(&j.job_id),
            esc(&j.status),
            time(&j.started),
            time(&j.ended),
            j.duration_ns
                .map(human_duration)
                .unwrap_or_else(|| "-".into()),
            j.tasks.total,
            j.failed,
            opt(&j.entrypoint)
        );
    }
    h.push_str("</table>\n");
    if !r.train_runs.is_empty() {
        h.push_str(
            "<h2>Ray Train runs</h2><table id=\"train\"><tr><th>run</th><th>name</th>\
                    <th>status</th><th>started</th><th>ended</th><th>duration</th>\
                    <th>attempts</th><th>workers</th><th>framework</th><th>in full</th></tr>",
        );
        for run in &r.train_runs {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td><code>{}</code></td></tr>",
                esc(&run.run_id),
                opt(&run.name),
                opt(&run.status),
                time(&run.started),
                time(&run.ended),
                run.duration_ns
                    .map(human_duration)
                    .unwrap_or_else(|| "-".into()),
                run.attempts.len(),
                run.workers
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "-".into()),
                opt(&run.framework),
                esc(&run.train_run_command)
            );
        }
        h.push_str("</table>\n");
    }
}

fn failed(h: &mut String, r: &SessionReport) {
    let _ = writeln!(
        h,
        "<h2>Failed tasks ({} of {})</h2>",
        r.failed_tasks.len(),
        r.failed_tasks_total
    );
    if r.failed_tasks.is_empty() {
        h.push_str("<p>none</p>\n");
        return;
    }
    h.push_str(
        "<table id=\"failed\"><tr><th>failed at</th><th>task</th><th>attempt</th>\
                <th>name</th><th>job</th><th>cause</th><th>worker</th><th>node</th><th>error</th></tr>",
    );
    for t in &r.failed_tasks {
        let worker = t
            .worker
            .as_ref()
            .map(|w| {
                format!(
                    "{} pid {} {}<br>{}",
                    esc(&short(&w.worker_id)),
                    w.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                    opt(&w.exit_type),
                    w.exit_detail
                        .as_deref()
                        .map(|d| esc(&super::render::clean(&crate::reader::causes::first_line(d))))
                        .unwrap_or_default()
                )
            })
            .unwrap_or_else(|| "-".into());
        let node = t
            .node
            .as_ref()
            .map(|n| {
                format!(
                    "{} {}{}",
                    esc(&short(&n.node_id)),
                    opt(&n.state),
                    n.death_reason
                        .as_deref()
                        .map(|r| format!(
                            " {} at {}: {}",
                            esc(r),
                            time(&n.died_at),
                            opt(&n.death_message)
                        ))
                        .unwrap_or_default()
                )
            })
            .unwrap_or_else(|| "-".into());
        let _ = write!(
            h,
            "<tr class=\"failed-task\" data-task-id=\"{}\" data-attempt=\"{}\"><td>{}</td><td>{}</td>\
             <td class=\"n\">{}</td><td>{}</td><td>{}</td><td class=\"cause\">{}</td><td>{}</td><td>{}</td>\
             <td><b>{}</b> {}<details><summary>\
             message and log command</summary><pre>{}</pre><pre>{}</pre></details></td></tr>",
            esc(&t.task_id),
            t.attempt,
            time(&t.failed_at),
            esc(&t.task_id),
            t.attempt,
            opt(&t.name),
            opt(&t.job_id),
            esc(&t.cause),
            worker,
            node,
            opt(&t.error_type),
            t.error_message
                .as_deref()
                .map(|m| esc(&error_summary(m)))
                .unwrap_or_default(),
            t.error_message
                .as_deref()
                .map(|m| esc(&super::render::clean_multiline(m)))
                .unwrap_or_default(),
            t.log_command.as_deref().map(esc).unwrap_or_default()
        );
    }
    h.push_str("</table>\n");
}

/// Why it failed: one row per distinct cause.
fn causes(h: &mut String, r: &SessionReport) {
    let _ = writeln!(
        h,
        "<h2>Why it failed ({} distinct causes)</h2>",
        r.failure_causes.len()
    );
    if r.failure_causes.is_empty() {
        h.push_str("<p>nothing failed</p>\n");
        return;
    }
    h.push_str(
        "<table id=\"causes\"><tr><th>attempts</th><th>actors</th><th>cause</th><th>node</th>\
         <th>first</th><th>what</th><th>detail</th></tr>",
    );
    for g in &r.failure_causes {
        let names: Vec<String> = g
            .examples
            .iter()
            .map(|e| e.name.clone().unwrap_or_else(|| e.id.clone()))
            .fold(Vec::new(), |mut v, n| {
                if !v.contains(&n) {
                    v.push(n);
                }
                v
            });
        let _ = write!(
            h,
            "<tr class=\"cause-row\" data-cause=\"{}\"><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td><b>{}</b></td><td>{}</td><td>{}</td><td>{}</td><td>{}<details><summary>log command\
             </summary><pre>{}</pre></details></td></tr>",
            esc(&g.cause),
            g.attempts,
            g.actors,
            esc(&g.cause),
            g.node_id.as_deref().map(|n| esc(&short(n))).unwrap_or_else(|| "-".into()),
            time(&g.first_at),
            esc(&names.join(", ")),
            opt(&g.detail),
            g.log_command.as_deref().map(esc).unwrap_or_default()
        );
    }
    let other = &r.failure_causes_other;
    if other.attempts + other.actors > 0 {
        let _ = write!(
            h,
            "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td colspan=\"5\">other causes \
             (only the first {} causes by cause, exit type and node are grouped)</td></tr>",
            other.attempts,
            other.actors,
            r.failure_causes.len()
        );
    }
    h.push_str("</table>\n");
}

fn worker_deaths(h: &mut String, r: &SessionReport) {
    let _ = writeln!(
        h,
        "<h2>Worker deaths ({} of {})</h2>",
        r.worker_deaths.len(),
        r.worker_deaths_total
    );
    if r.worker_deaths.is_empty() {
        h.push_str("<p>none (intended exits are not counted)</p>\n");
        return;
    }
    h.push_str(
        "<table id=\"worker-deaths\"><tr><th>died at</th><th>worker</th><th>pid</th><th>node</th>\
         <th>job</th><th>exit type</th><th>detail</th></tr>",
    );
    for d in &r.worker_deaths {
        let _ = write!(
            h,
            "<tr data-worker-id=\"{}\"><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}<details><summary>log command</summary><pre>{}</pre></details></td></tr>",
            esc(&d.worker_id),
            time(&d.died_at),
            esc(&short(&d.worker_id)),
            d.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            d.node_id.as_deref().map(|n| esc(&short(n))).unwrap_or_else(|| "-".into()),
            opt(&d.job_id),
            opt(&d.exit_type),
            opt(&d.exit_detail),
            esc(&d.log_command)
        );
    }
    h.push_str("</table>\n");
}

fn session_end(h: &mut String, r: &SessionReport) {
    let e = &r.session_end;
    let _ = writeln!(
        h,
        "<h2>What ended the session</h2><p>Its events stop at {}.</p><ul id=\"session-end\">",
        time(&e.last_event)
    );
    for n in &e.nodes_died {
        let _ = write!(
            h,
            "<li class=\"node-died\">node {} died at {}: <b>{}</b> {}</li>",
            esc(&short(&n.node_id)),
            time(&n.died_at),
            opt(&n.death_reason),
            opt(&n.death_message)
        );
    }
    for n in &r.nodes {
        let _ = write!(
            h,
            "<li>node {}{}: {}, last heard of at {}</li>",
            esc(&short(&n.node_id)),
            if n.is_head == Some(true) {
                " (head)"
            } else {
                ""
            },
            opt(&n.state),
            time(&n.last_heard)
        );
    }
    for j in &e.jobs_unfinished {
        let _ = write!(h, "<li>job {} {}</li>", esc(&j.job_id), esc(&j.reason));
    }
    for u in &e.tasks_unfinished {
        let _ = write!(
            h,
            "<li class=\"unfinished\">{} task attempt(s) left {} (job {}, node {}): unfinished, {}</li>",
            u.count,
            esc(&u.state),
            opt(&u.job_id),
            u.node_id.as_deref().map(|n| esc(&short(n))).unwrap_or_else(|| "-".into()),
            esc(&u.reason)
        );
    }
    h.push_str("</ul>\n");
}

fn hangs(h: &mut String, r: &SessionReport) {
    let g = &r.hangs;
    h.push_str("<h2>What hung</h2><ul id=\"hangs\">");
    if g.placement_groups_source.is_none() {
        h.push_str("<li>placement groups: no dashboard snapshot in the bucket</li>");
    }
    for pg in &g.placement_groups {
        let bundles = super::render::bundles_text(&pg.bundles);
        let _ = write!(
            h,
            "<li class=\"pg\">placement group {} ({}) <b>{}</b>{} since {}, strategy {}, bundles {}{}</li>",
            esc(&pg.placement_group_id),
            opt(&pg.name),
            opt(&pg.state),
            pg.scheduling_state.as_deref().map(|s| format!("/{}", esc(s))).unwrap_or_default(),
            time(&pg.requested_at),
            opt(&pg.strategy),
            esc(&bundles),
            pg.unsatisfiable.as_deref().map(|u| format!(": never fits, {}", esc(u))).unwrap_or_default()
        );
    }
    for t in &g.pending_tasks {
        let _ = write!(
            h,
            "<li class=\"pending\">task {} ({}) <b>{}</b> for {} asking {{{}}}{}</li>",
            esc(&t.task_id),
            opt(&t.name),
            esc(&t.state),
            t.pending_seconds
                .map(|s| human_duration((s * 1e9) as i64))
                .unwrap_or_else(|| "-".into()),
            opt(&t.resources),
            t.unsatisfiable
                .as_deref()
                .map(|u| format!(": never fits, {}", esc(u)))
                .unwrap_or_default()
        );
    }
    if g.placement_groups.is_empty() && g.pending_tasks.is_empty() {
        h.push_str("<li>nothing hung</li>");
    }
    h.push_str("</ul>\n");
}

/// A bar of the top tracks (jobs, runs, attempts).
struct Bar {
    class: &'static str,
    label: String,
    start: i64,
    end: i64,
}

fn chart(h: &mut String, r: &SessionReport, g: &Gantt) {
    let span = |from: &Option<String>, to: &Option<String>| -> Option<(i64, i64)> {
        let start = parse_time_ns(from.as_deref()?)?;
        let end = to.as_deref().and_then(parse_time_ns).unwrap_or(start);
        Some((start, end.max(start)))
    };
    // Top tracks: one lane per job, one per Train run (its attempts below it).
    let mut top: Vec<(String, Vec<Bar>)> = Vec::new();
    for j in &r.jobs {
        if let Some((start, end)) = span(&j.started, &j.ended) {
            top.push((
                format!("job {}", j.job_id),
                vec![Bar {
                    class: "job",
                    label: format!("job {} {}", j.job_id, j.status),
                    start,
                    end,
                }],
            ));
        }
    }
    for run in &r.train_runs {
        let name = run.name.clone().unwrap_or_else(|| run.run_id.clone());
        if let Some((start, end)) = span(&run.started, &run.ended) {
            top.push((
                format!("Train run {name}"),
                vec![Bar {
                    class: "train_run",
                    label: format!("Train run {name} {}", run.status.as_deref().unwrap_or("")),
                    start,
                    end,
                }],
            ));
        }
        for a in &run.attempts {
            if let Some((start, end)) = span(&a.started, &a.ended) {
                top.push((
                    format!(
                        "  attempt {}",
                        a.attempt_id.chars().take(12).collect::<String>()
                    ),
                    vec![Bar {
                        class: "train_attempt",
                        label: format!(
                            "attempt {} {}",
                            a.attempt_id,
                            a.status.as_deref().unwrap_or("")
                        ),
                        start,
                        end,
                    }],
                ));
            }
        }
    }
    // Lanes: node → worker → attempts.
    let slices = g.sorted();
    let mut lanes: BTreeMap<String, BTreeMap<String, Vec<&Slice>>> = BTreeMap::new();
    for s in slices.iter().copied() {
        lanes
            .entry(s.node.clone().unwrap_or_else(|| "(unknown node)".into()))
            .or_default()
            .entry(
                s.worker
                    .clone()
                    .unwrap_or_else(|| "(unknown worker)".into()),
            )
            .or_default()
            .push(s);
    }
    let times = slices.iter().flat_map(|s| [s.start_ns, s.end_ns]).chain(
        top.iter()
            .flat_map(|(_, bars)| bars.iter().flat_map(|b| [b.start, b.end])),
    );
    let (t0, t1) = times.fold((i64::MAX, i64::MIN), |(a, b), t| (a.min(t), b.max(t)));
    if t0 > t1 {
        h.push_str("<p>No task ran and no job or Train run has a start time.</p>\n");
        return;
    }
    let range = (t1 - t0).max(1) as f64;
    let x = |t: i64| LABEL_WIDTH + (t - t0) as f64 / range * CHART_WIDTH;
    let ips: BTreeMap<&str, &str> = r
        .nodes
        .iter()
        .filter_map(|n| Some((n.node_id.as_str(), n.ip.as_deref()?)))
        .collect();
    let rows = top.len() + lanes.values().map(|w| w.len() + 1).sum::<usize>();
    let height = 30.0 + rows as f64 * LANE_HEIGHT;
    let _ = writeln!(
        h,
        "<svg id=\"gantt\" width=\"{}\" height=\"{height}\" \
         data-attempts=\"{}\" data-left-out=\"{}\">",
        LABEL_WIDTH + CHART_WIDTH + 20.0,
        slices.len(),
        g.left_out
    );
    // Axis: five ticks, in seconds from the first event.
    for i in 0..=5 {
        let t = t0 + ((t1 - t0) as f64 * i as f64 / 5.0) as i64;
        let _ = write!(
            h,
            "<line class=\"axis\" x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"14\" y2=\"{height}\"/>\
             <text x=\"{0:.1}\" y=\"11\" text-anchor=\"middle\">+{1}</text>",
            x(t),
            human_duration(t - t0)
        );
    }
    h.push('\n');
    let mut y = 20.0;
    for (label, bars) in &top {
        let _ = write!(
            h,
            "<text x=\"4\" y=\"{:.1}\">{}</text>",
            y + 11.0,
            esc(label)
        );
        for b in bars {
            let _ = write!(
                h,
                "<rect class=\"{}\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{BAR_HEIGHT}\">\
                 <title>{} ({})</title></rect>",
                b.class,
                x(b.start),
                y + 2.0,
                (x(b.end) - x(b.start)).max(1.0),
                esc(&b.label),
                human_duration(b.end - b.start)
            );
        }
        h.push('\n');
        y += LANE_HEIGHT;
    }
    for (node, workers) in &lanes {
        let node_label = match ips.get(node.as_str()) {
            Some(ip) => format!("node {ip} {}", short(node)),
            None => format!("node {}", short(node)),
        };
        let _ = writeln!(
            h,
            "<text class=\"node\" x=\"4\" y=\"{:.1}\" data-node=\"{}\">{}</text>",
            y + 12.0,
            esc(node),
            esc(&node_label)
        );
        y += LANE_HEIGHT;
        for (worker, slices) in workers {
            let _ = write!(
                h,
                "<rect class=\"lane\" x=\"{LABEL_WIDTH}\" y=\"{y:.1}\" width=\"{CHART_WIDTH}\" \
                 height=\"{LANE_HEIGHT}\"/><text x=\"14\" y=\"{:.1}\" data-worker=\"{}\">{}</text>",
                y + 12.0,
                esc(worker),
                if worker == super::timeline::DRIVER {
                    "driver".to_string()
                } else {
                    format!("worker {}", esc(&short(worker)))
                }
            );
            for s in slices {
                let _ = write!(
                    h,
                    "<rect class=\"attempt {}\" data-task-id=\"{}\" data-attempt=\"{}\" \
                     data-state=\"{}\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{BAR_HEIGHT}\">\
                     <title>{} · task {} attempt {} · {} · {}{}</title></rect>",
                    state_class(&s.state),
                    esc(&s.task_id),
                    s.attempt,
                    esc(&s.state),
                    x(s.start_ns),
                    y + 3.0,
                    (x(s.end_ns) - x(s.start_ns)).max(1.0),
                    esc(&s.name),
                    esc(&s.task_id),
                    s.attempt,
                    esc(&s.state),
                    human_duration(s.end_ns - s.start_ns),
                    s.error
                        .as_deref()
                        .map(|e| format!(" · {}", esc(e)))
                        .unwrap_or_default()
                );
                if let Some(at) = s.failed_ns {
                    let fx = x(at.clamp(t0, t1));
                    let _ = write!(
                        h,
                        "<path class=\"failure\" data-failure=\"1\" data-task-id=\"{}\" \
                         data-attempt=\"{}\" d=\"M{:.1} {:.1}l-5 -7h10z\"><title>FAILED {} · {}</title></path>",
                        esc(&s.task_id),
                        s.attempt,
                        fx,
                        y + 9.0,
                        esc(&s.name),
                        s.error.as_deref().map(esc).unwrap_or_default()
                    );
                }
            }
            h.push('\n');
            y += LANE_HEIGHT;
        }
    }
    h.push_str("</svg>\n");
    if g.left_out > 0 {
        let _ = writeln!(
            h,
            "<p>{} more attempt(s) ran but are not drawn (at most {MAX_DRAWN_ATTEMPTS}); \
             use --timeline for all of them.</p>",
            g.left_out
        );
    }
}

/// The first and last 8 characters of a long id.
fn short(id: &str) -> String {
    if id.len() <= 20 || !id.is_ascii() {
        return id.to_string();
    }
    format!("{}…{}", &id[..8], &id[id.len() - 8..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            esc("<script>\"a\" & 'b'</script>\u{1b}[31m"),
            "&lt;script&gt;&quot;a&quot; &amp; &#39;b&#39;&lt;/script&gt;[31m"
        );
        assert_eq!(short("0123456789abcdef0123456789"), "01234567…23456789");
        assert_eq!(
            esc("a\u{202e}txt.exe\u{2066}"),
            "a\\u{202e}txt.exe\\u{2066}"
        );
    }

    /// The attempts drawn past [`MAX_DRAWN_ATTEMPTS`] are the same whatever order they come
    /// in: the least by (start, task id, attempt).
    #[test]
    fn attempts_drawn_are_the_same_in_any_order() {
        let slice = |i: usize| Slice {
            task_id: format!("{:06}", (i * 7919) % 30_000),
            attempt: (i % 2) as i32,
            name: "f".into(),
            state: "FINISHED".into(),
            job: None,
            node: None,
            worker: None,
            start_ns: (i % 3) as i64,
            end_ns: 10,
            failed_ns: None,
            error_type: None,
            error: None,
            profiled: false,
        };
        let drawn = |order: &mut dyn Iterator<Item = usize>| {
            let mut g = Gantt::default();
            for i in order {
                g.add(slice(i));
            }
            let ids: Vec<(i64, String, i32)> = g
                .sorted()
                .iter()
                .map(|s| (s.start_ns, s.task_id.clone(), s.attempt))
                .collect();
            (ids, g.left_out)
        };
        let n = MAX_DRAWN_ATTEMPTS + 500;
        let forward = drawn(&mut (0..n));
        assert_eq!(forward, drawn(&mut (0..n).rev()));
        assert_eq!(forward.0.len(), MAX_DRAWN_ATTEMPTS);
        assert_eq!(forward.1, 500);
        let early = forward.0.iter().filter(|(start, ..)| *start < 2).count();
        assert_eq!(
            early,
            (0..n).filter(|i| i % 3 < 2).count(),
            "the earliest drawn"
        );
    }
}
