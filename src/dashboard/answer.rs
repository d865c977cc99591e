//! What a dashboard answer must look like to be stored, read without building it in memory.
//!
//! The history server replays a stored snapshot as if the dashboard had just sent it, so a
//! snapshot is only as good as the answer it was taken from. A dashboard that is shutting down
//! (the last poll runs at SIGTERM) still answers 200 with an HTML error page, a truncated body,
//! `{"result": false, "msg": "GCS unavailable"}` or an empty list. So an answer is stored only
//! if it is JSON of its endpoint's shape ([`Expect`]) with a top-level `result` that is not
//! `false`; the poller also compares its list length ([`Checked::list_len`]) with the last one
//! stored, so the final poll never replaces a snapshot with a smaller list (nor, therefore,
//! with the honest shorter list of a cluster that removed something since the last live
//! poll: the two answers look alike, and the last good snapshot is the safer one to replay).
//!
//! Memory: bodies reach 64 MiB, and a `serde_json::Value` of `[0,0,…]` costs 32 bytes per two
//! bytes of body. Everything here walks the borrowed body with serde visitors that count and
//! skip (`IgnoredAny`) instead of building values: a check costs no memory beyond the body,
//! and the job list keeps only the ids it returns (at most [`MAX_JOBS_PER_POLL`]).

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{JOBS_ENDPOINT, MAX_JOBS_PER_POLL, TERMINAL_JOB_STATES};
use crate::contract::ids::is_hex_id;

/// Longest piece of a refused answer or a rejected id quoted in logs.
const QUOTE_CHARS: usize = 80;

/// The shape an endpoint's answer must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expect {
    /// A JSON object (`/timezone`, `/api/v0/cluster_metadata`, Serve's applications).
    Object,
    /// The state API's envelope: `{"result": true, "data": {"result": {"result": [...]}}}`;
    /// the list is `data.result.result` (placement groups).
    StateList,
    /// An object whose list is the member `field` (Ray Data's `datasets`, Serve's
    /// `applications`); a missing or null member is an empty list.
    ObjectList(&'static str),
    /// Any JSON object or array (the extra endpoints); its list is the array, or the state
    /// API's `data.result.result` when it has one.
    Any,
}

/// Why an answer is not stored: the `reason` label of `rhc_dashboard_answers_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Not JSON (an HTML page, a truncated body, nothing at all).
    NotJson,
    /// JSON, but not of the endpoint's shape.
    WrongShape,
    /// A top-level `"result": false`: the dashboard reports its own failure.
    ResultFalse,
    /// On the final poll: a shorter list than the snapshot already stored.
    SmallerList,
    /// On the final poll: what is stored could not be read back (not a 403 or 404: a 5xx, a
    /// timeout), so nothing says the answer is not shorter.
    StoredUnknown,
}

impl Refusal {
    /// The metric label.
    pub(super) fn code(self) -> &'static str {
        match self {
            Refusal::NotJson => "not_json",
            Refusal::WrongShape => "wrong_shape",
            Refusal::ResultFalse => "result_false",
            Refusal::SmallerList => "smaller_list",
            Refusal::StoredUnknown => "stored_unknown",
        }
    }
}

/// An answer fit to store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Checked {
    /// Length of the endpoint's list, when it has one.
    pub(super) list_len: Option<usize>,
}

/// Checks `body` against `expect`; see [`Expect`] for each shape.
pub(super) fn check(body: &[u8], expect: Expect) -> Result<Checked, Refusal> {
    let top = probe(body, &[])?;
    let is_object = matches!(top, Some(Lite::Map(_)));
    if is_object && probe(body, &["result"])? == Some(Lite::Bool(false)) {
        return Err(Refusal::ResultFalse);
    }
    let list = |path: &[&str]| -> Result<Option<usize>, Refusal> {
        Ok(match probe(body, path)? {
            Some(Lite::Seq(n)) | Some(Lite::Map(n)) => Some(n),
            _ => None,
        })
    };
    match expect {
        Expect::Object if is_object => Ok(Checked { list_len: None }),
        Expect::StateList if is_object => match probe(body, &["data", "result", "result"])? {
            Some(Lite::Seq(n)) => Ok(Checked { list_len: Some(n) }),
            _ => Err(Refusal::WrongShape),
        },
        Expect::ObjectList(field) if is_object => match probe(body, &[field])? {
            Some(Lite::Seq(n)) | Some(Lite::Map(n)) => Ok(Checked { list_len: Some(n) }),
            None | Some(Lite::Null) => Ok(Checked { list_len: Some(0) }),
            Some(_) => Err(Refusal::WrongShape),
        },
        Expect::Any => match top {
            Some(Lite::Seq(n)) => Ok(Checked { list_len: Some(n) }),
            Some(Lite::Map(_)) => Ok(Checked {
                list_len: list(&["data", "result", "result"])?,
            }),
            _ => Err(Refusal::WrongShape),
        },
        _ => Err(Refusal::WrongShape),
    }
}

/// What a JSON value is, with the length of a container; nothing of it is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lite {
    Null,
    Bool(bool),
    Scalar,
    Seq(usize),
    Map(usize),
}

/// The value at `path` (object members by name) in `body`: `Ok(None)` when the path does not
/// exist, `Err(NotJson)` when `body` is not one JSON value.
fn probe(body: &[u8], path: &[&str]) -> Result<Option<Lite>, Refusal> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let found = Probe { path }
        .deserialize(&mut de)
        .map_err(|_| Refusal::NotJson)?;
    de.end().map_err(|_| Refusal::NotJson)?;
    Ok(found)
}

/// True when `body` is a JSON object whose top-level `result` is `false` (the dashboard's way
/// of reporting its own failure in a 200); its `msg`, shortened, is returned with it.
pub(super) fn reported_failure(body: &[u8]) -> Option<String> {
    if probe(body, &["result"]).ok()? != Some(Lite::Bool(false)) {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Msg<'a> {
        #[serde(borrow, default)]
        msg: Option<std::borrow::Cow<'a, str>>,
    }
    let msg = serde_json::from_slice::<Msg>(body).ok().and_then(|m| m.msg);
    Some(
        msg.map(|m| m.chars().take(QUOTE_CHARS).collect())
            .unwrap_or_default(),
    )
}

/// Calls `each` with every element of the array at `path` in `body`, deserialized as `T` one
/// at a time (none is kept here). `Ok(false)` when there is no array at `path`.
pub(super) fn for_each_at<'de, T: de::Deserialize<'de>>(
    body: &'de [u8],
    path: &[&str],
    each: &mut dyn FnMut(T),
) -> Result<bool, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let found = Walk { path, each }.deserialize(&mut de)?;
    de.end()?;
    Ok(found)
}

/// Like [`Probe`], but hands each element of the array at the end of `path` to `each`.
struct Walk<'p, 'f, T> {
    path: &'p [&'p str],
    each: &'f mut dyn FnMut(T),
}

impl<'de, T: de::Deserialize<'de>> DeserializeSeed<'de> for Walk<'_, '_, T> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, T: de::Deserialize<'de>> Visitor<'de> for Walk<'_, '_, T> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_str<E>(self, _: &str) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        if !self.path.is_empty() {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(false);
        }
        while let Some(item) = seq.next_element::<T>()? {
            (self.each)(item);
        }
        Ok(true)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let Some(name) = self.path.first() else {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return Ok(false);
        };
        let mut found = false;
        let each = self.each;
        while let Some(hit) = map.next_key_seed(KeyIs(name))? {
            if hit && !found {
                found = map.next_value_seed(Walk {
                    path: &self.path[1..],
                    each: &mut *each,
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// Walks one value, descending into the member named `path[0]` of an object, skipping the rest.
struct Probe<'p> {
    path: &'p [&'p str],
}

impl<'de> DeserializeSeed<'de> for Probe<'_> {
    type Value = Option<Lite>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Probe<'_> {
    type Value = Option<Lite>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(self.path.is_empty().then_some(Lite::Bool(v)))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(self.path.is_empty().then_some(Lite::Scalar))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(self.path.is_empty().then_some(Lite::Scalar))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(self.path.is_empty().then_some(Lite::Scalar))
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(self.path.is_empty().then_some(Lite::Scalar))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(self.path.is_empty().then_some(Lite::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut n = 0usize;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            n += 1;
        }
        Ok(self.path.is_empty().then_some(Lite::Seq(n)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut n = 0usize;
        let mut found = None;
        while let Some(hit) = match self.path.first() {
            Some(name) => map.next_key_seed(KeyIs(name))?,
            None => map.next_key::<IgnoredAny>()?.map(|_| false),
        } {
            n += 1;
            if hit && found.is_none() {
                found = map.next_value_seed(Probe {
                    path: &self.path[1..],
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(if self.path.is_empty() {
            Some(Lite::Map(n))
        } else {
            found
        })
    }
}

/// An object key, compared with a name without being copied.
struct KeyIs<'n>(&'n str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
    }
}

/// One job of `/api/jobs/`, reduced to what decides its datasets snapshot.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ListedJob {
    pub(super) job_id: String,
    pub(super) terminal: bool,
}

/// The job list, as far as the datasets snapshots need it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct JobList {
    /// Jobs with a hex id, each once, in the order listed, at most [`MAX_JOBS_PER_POLL`].
    pub(super) jobs: Vec<ListedJob>,
    /// Ids that are not hex: how many, and the first (shortened).
    pub(super) rejected: usize,
    pub(super) first_rejected: Option<String>,
}

/// Reads the job list: a JSON array of job details. Jobs without a string `job_id` (a
/// submission whose driver has not started) and elements that are not objects are skipped.
pub(super) fn parse_jobs(body: &[u8]) -> Result<JobList, super::DashboardError> {
    let invalid = |why: String| super::DashboardError::Invalid {
        why: format!("{JOBS_ENDPOINT} {why}"),
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let list = de
        .deserialize_any(Jobs)
        .map_err(|e| invalid(format!("is not a JSON array of jobs: {e}")))?;
    de.end()
        .map_err(|e| invalid(format!("has trailing bytes: {e}")))?;
    Ok(list)
}

struct Jobs;

impl<'de> Visitor<'de> for Jobs {
    type Value = JobList;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JobList, A::Error> {
        let mut out = JobList::default();
        let mut seen = HashSet::new();
        while let Some(job) = seq.next_element::<Job>()? {
            let Job(Some((id, terminal))) = job else {
                continue;
            };
            if !is_hex_id(&id) {
                out.rejected += 1;
                if out.first_rejected.is_none() {
                    out.first_rejected = Some(id.chars().take(QUOTE_CHARS).collect());
                }
                continue;
            }
            if out.jobs.len() < MAX_JOBS_PER_POLL && seen.insert(id.clone()) {
                out.jobs.push(ListedJob {
                    job_id: id,
                    terminal,
                });
            }
        }
        Ok(out)
    }
}

/// One element of the job list: its `job_id` (only if a string) and whether its `status` is
/// terminal. A string id longer than a path segment is cut to what is quoted in logs.
struct Job(Option<(String, bool)>);

impl<'de> de::Deserialize<'de> for Job {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Job, D::Error> {
        d.deserialize_any(JobVisitor)
    }
}

struct JobVisitor;

impl<'de> Visitor<'de> for JobVisitor {
    type Value = Job;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a job")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Job, E> {
        Ok(Job(None))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Job, E> {
        Ok(Job(None))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Job, E> {
        Ok(Job(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Job, E> {
        Ok(Job(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<Job, E> {
        Ok(Job(None))
    }
    fn visit_unit<E>(self) -> Result<Job, E> {
        Ok(Job(None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Job, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Job(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Job, A::Error> {
        let mut id = None;
        let mut terminal = false;
        while let Some(key) = map.next_key::<JobKey>()? {
            match key {
                JobKey::Id => id = map.next_value::<ShortString>()?.0.or(id),
                JobKey::Status => {
                    terminal = map
                        .next_value::<ShortString>()?
                        .0
                        .is_some_and(|s| TERMINAL_JOB_STATES.contains(&s.as_str()))
                }
                JobKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Job(id.map(|id| (id, terminal))))
    }
}

/// The members of a job that matter.
enum JobKey {
    Id,
    Status,
    Other,
}

impl<'de> de::Deserialize<'de> for JobKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<JobKey, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = JobKey;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_str<E>(self, v: &str) -> Result<JobKey, E> {
                Ok(match v {
                    "job_id" => JobKey::Id,
                    "status" => JobKey::Status,
                    _ => JobKey::Other,
                })
            }
        }
        d.deserialize_str(V)
    }
}

/// A string value kept only up to a path segment's length plus one (enough to tell a valid id
/// or state from an invalid one, and to quote it); any other value is `None`.
struct ShortString(Option<String>);

impl<'de> de::Deserialize<'de> for ShortString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ShortString, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ShortString;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E>(self, v: &str) -> Result<ShortString, E> {
                let keep = crate::contract::names::MAX_SEGMENT_LEN + 1;
                Ok(ShortString(Some(v.chars().take(keep).collect())))
            }
            fn visit_bool<E>(self, _: bool) -> Result<ShortString, E> {
                Ok(ShortString(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<ShortString, E> {
                Ok(ShortString(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<ShortString, E> {
                Ok(ShortString(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<ShortString, E> {
                Ok(ShortString(None))
            }
            fn visit_unit<E>(self) -> Result<ShortString, E> {
                Ok(ShortString(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ShortString, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(ShortString(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ShortString, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(ShortString(None))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn len(body: &str, expect: Expect) -> Result<Option<usize>, Refusal> {
        check(body.as_bytes(), expect).map(|c| c.list_len)
    }

    #[test]
    fn shapes() {
        let pg = r#"{"result": true, "msg": "", "data": {"result": {"total": 2, "result": [{"a": 1}, {}]}}}"#;
        assert_eq!(len(pg, Expect::StateList), Ok(Some(2)));
        assert_eq!(len(pg, Expect::Any), Ok(Some(2)));
        assert_eq!(
            len(
                r#"{"result": false, "msg": "GCS unavailable"}"#,
                Expect::StateList
            ),
            Err(Refusal::ResultFalse)
        );
        assert_eq!(
            len(r#"{"result": false, "msg": "x"}"#, Expect::Object),
            Err(Refusal::ResultFalse)
        );
        assert_eq!(
            len("<html>502</html>", Expect::Object),
            Err(Refusal::NotJson)
        );
        assert_eq!(
            len(&pg[..pg.len() - 3], Expect::StateList),
            Err(Refusal::NotJson)
        );
        assert_eq!(len("", Expect::Any), Err(Refusal::NotJson));
        assert_eq!(len("{} {}", Expect::Any), Err(Refusal::NotJson));
        assert_eq!(
            len(r#"{"result": true}"#, Expect::StateList),
            Err(Refusal::WrongShape)
        );
        assert_eq!(len("[1,2]", Expect::Object), Err(Refusal::WrongShape));
        assert_eq!(len("7", Expect::Any), Err(Refusal::WrongShape));
        assert_eq!(len("[1,[2,3],{}]", Expect::Any), Ok(Some(3)));
        assert_eq!(len(r#"{"runs": []}"#, Expect::Any), Ok(None));
        assert_eq!(
            len(
                r#"{"applications": {"a": {}, "b": {}}}"#,
                Expect::ObjectList("applications")
            ),
            Ok(Some(2))
        );
        assert_eq!(
            len(r#"{"datasets": null}"#, Expect::ObjectList("datasets")),
            Ok(Some(0))
        );
        assert_eq!(len(r#"{}"#, Expect::ObjectList("datasets")), Ok(Some(0)));
        assert_eq!(
            len(r#"{"datasets": 3}"#, Expect::ObjectList("datasets")),
            Err(Refusal::WrongShape)
        );
        // `result` nested deeper is data, not the dashboard's verdict.
        assert_eq!(
            len(r#"{"data": {"result": false}}"#, Expect::Object),
            Ok(None)
        );
        // Escaped keys are compared by their value.
        assert_eq!(
            len(r#"{"res\u0075lt": false}"#, Expect::Object),
            Err(Refusal::ResultFalse)
        );
    }

    #[test]
    fn job_list() {
        let body = br#"[
            {"type":"SUBMISSION","job_id":null,"submission_id":"raysubmit_1","status":"PENDING"},
            {"type":"SUBMISSION","job_id":"02000000","submission_id":"raysubmit_2","status":"RUNNING"},
            {"type":"DRIVER","job_id":"01000000","submission_id":null,"status":"SUCCEEDED"},
            {"job_id":"../../x","status":"RUNNING"},
            {"job_id":"01000000","status":"SUCCEEDED"},
            {"submission_id":"raysubmit_3", "job_id": {"nested": [1]}},
            7, "s", [1, {"job_id": "03000000"}], null
        ]"#;
        let list = parse_jobs(body).unwrap();
        assert_eq!(
            list.jobs,
            [
                ListedJob {
                    job_id: "02000000".into(),
                    terminal: false
                },
                ListedJob {
                    job_id: "01000000".into(),
                    terminal: true
                },
            ]
        );
        assert_eq!(list.rejected, 1);
        assert_eq!(list.first_rejected.as_deref(), Some("../../x"));
        assert!(parse_jobs(b"{}").is_err());
        assert!(parse_jobs(b"nope").is_err());
        assert!(parse_jobs(b"[1,2").is_err());
        assert!(parse_jobs(b"[] x").is_err());
    }

    #[test]
    fn a_huge_job_list_keeps_at_most_the_bound() {
        let mut body = b"[".to_vec();
        for i in 0..MAX_JOBS_PER_POLL + 5 {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(format!(r#"{{"job_id":"{i:08x}"}}"#).as_bytes());
        }
        body.push(b']');
        assert_eq!(parse_jobs(&body).unwrap().jobs.len(), MAX_JOBS_PER_POLL);
    }
}
