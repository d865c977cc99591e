//! The check every scenario ends with: every acknowledged event in the bucket exactly once, in
//! a valid JSON line of an object the history server reads.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::load::{Ledger, ACKED, NONE, PENDING};
use crate::storage::{for_each_object, gunzip_if};
use object_store::ObjectStore;
use serde_json::json;

#[derive(serde::Deserialize)]
pub(crate) struct IdOnly<'a> {
    #[serde(rename = "eventId", borrow)]
    pub(crate) event_id: Option<Cow<'a, str>>,
}

/// The bucket checked against the ledger.
#[derive(Default, Debug)]
pub(crate) struct Check {
    pub(crate) objects: usize,
    pub(crate) event_objects: usize,
    pub(crate) lines: u64,
    pub(crate) broken_lines: u64,
    pub(crate) unknown: u64,
    pub(crate) lost: u64,
    pub(crate) duplicated: u64,
    pub(crate) pending_stored: u64,
    pub(crate) compressed_bytes: u64,
    pub(crate) quarantine_lines: Vec<String>,
    pub(crate) problems: Vec<String>,
    /// How long reading the bucket back took.
    pub(crate) seconds: f64,
}

impl Check {
    pub(crate) fn ok(&self) -> bool {
        self.broken_lines == 0
            && self.unknown == 0
            && self.lost == 0
            && self.duplicated == 0
            && self.problems.is_empty()
    }

    pub(crate) fn summary(&self) -> String {
        let mut s = format!(
            "{} lost, {} duplicated, {} broken lines, {} unknown",
            self.lost, self.duplicated, self.broken_lines, self.unknown
        );
        if !self.problems.is_empty() {
            s.push_str(&format!(" ({})", self.problems.join("; ")));
        }
        s
    }

    pub(crate) fn figures(&self) -> serde_json::Value {
        json!({"objects": self.objects, "event_lines": self.lines, "lost": self.lost,
               "duplicated": self.duplicated, "broken_lines": self.broken_lines,
               "unknown": self.unknown, "pending_stored": self.pending_stored,
               "verify_s": (self.seconds * 100.0).round() / 100.0})
    }
}

pub(crate) fn verify(store: &Arc<dyn ObjectStore>, ledger: &Ledger) -> Check {
    let started = Instant::now();
    let mut check = Check::default();
    let mut counts: HashMap<(String, usize), Vec<u8>> = ledger
        .states
        .iter()
        .map(|(k, v)| (k.clone(), vec![0u8; v.len()]))
        .collect();
    let listed = for_each_object(store, |key, bytes| {
        let is_events = key.contains("/node_events/") || key.contains("/job_events/");
        let is_quarantine = key.contains("collector-quarantine/") && !key.contains("/bodies/");
        if !is_events && !is_quarantine {
            return;
        }
        let text = match gunzip_if(key, bytes) {
            Ok(t) => t,
            Err(e) => {
                check.problems.push(e);
                return;
            }
        };
        if is_quarantine {
            for l in text.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
                check
                    .quarantine_lines
                    .push(String::from_utf8_lossy(l).into_owned());
            }
            return;
        }
        check.event_objects += 1;
        check.compressed_bytes += bytes.len() as u64;
        if !text.is_empty() && !text.ends_with(b"\n") {
            check
                .problems
                .push(format!("{key} does not end with a newline"));
        }
        for line in text.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
            check.lines += 1;
            let Ok(parsed) = serde_json::from_slice::<IdOnly>(line) else {
                check.broken_lines += 1;
                continue;
            };
            let Some(id) = parsed.event_id else {
                check.unknown += 1;
                continue;
            };
            let mut parts = id.rsplitn(3, '-');
            let (Some(seq), Some(client), Some(tag)) = (parts.next(), parts.next(), parts.next())
            else {
                check.unknown += 1;
                continue;
            };
            let (Ok(seq), Ok(client)) = (seq.parse::<usize>(), client.parse::<usize>()) else {
                check.unknown += 1;
                continue;
            };
            match counts.get_mut(&(tag.to_string(), client)) {
                Some(c) if seq < c.len() => c[seq] = c[seq].saturating_add(1),
                _ => check.unknown += 1,
            }
        }
    });
    match listed {
        Ok(n) => check.objects = n,
        Err(e) => check.problems.push(e),
    }
    check.seconds = started.elapsed().as_secs_f64();
    for (k, states) in &ledger.states {
        let Some(c) = counts.get(k) else { continue };
        for (s, n) in states.iter().zip(c) {
            match (*s, *n) {
                (ACKED, 0) => check.lost += 1,
                (PENDING, 1) => check.pending_stored += 1,
                (_, n) if n > 1 => check.duplicated += 1,
                (NONE, n) if n > 0 => check.unknown += 1,
                _ => {}
            }
        }
    }
    check
}
