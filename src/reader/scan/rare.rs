//! The bodies of the commonest rare events (worker, node and actor definitions and lifecycles) read
//! with typed, borrowing serde structs instead of a `serde_json::Value` tree: the [`Body`] made
//! is the one [`super::super::extract::extract_ray_event`] makes of the same body's `Value`.
//!
//! Each member the extraction reads is kept under each of its two names apart, as what it
//! was (a string, a number, an object, an array, anything else), so that the camelCase name
//! wins even when its value is of the wrong type, as it does in a `Value`. A body serde
//! refuses here (a member given twice, a lone surrogate escape, a number out of range) gives
//! `None`, and the caller reads it as a `Value`, as before.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::contract;

use super::super::extract::{
    bounded, ActorTransition, Body, NodeTransition, Transition, WorkerTransition,
    MAX_EXIT_DETAIL_BYTES,
};
use super::super::filter::parse_time_ns;
use super::super::limits::{MAX_ERROR_MESSAGE_BYTES, MAX_FIELD_BYTES};

/// One member's value, as far as the extraction tells values apart.
#[derive(Debug, Default)]
enum Scalar<'a> {
    #[default]
    Missing,
    Str(Cow<'a, str>),
    /// A non-negative integer (serde_json's `PosInt`).
    U(u64),
    /// A negative integer.
    I(i64),
    F(f64),
    /// `null`, a boolean, an array or an object.
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Scalar<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Scalar<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Scalar::Str(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Scalar::Str(Cow::Owned(s.to_string())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(Scalar::Str(Cow::Owned(s)))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
                Ok(Scalar::U(n))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
                Ok(if n >= 0 {
                    Scalar::U(n as u64)
                } else {
                    Scalar::I(n)
                })
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Self::Value, E> {
                Ok(Scalar::F(n))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Scalar::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Scalar::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
                while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

impl Scalar<'_> {
    fn present(&self) -> bool {
        !matches!(self, Scalar::Missing)
    }

    /// `extract::get_str`: a non-empty string, bounded.
    fn text(&self, max: usize) -> Option<String> {
        match self {
            Scalar::Str(s) if !s.is_empty() => Some(bounded(s, max)),
            _ => None,
        }
    }

    /// `extract::get_id`: lower-case hex, or the text as sent.
    fn id(&self) -> Option<String> {
        let Scalar::Str(raw) = self else { return None };
        if raw.is_empty() {
            return None;
        }
        Some(match contract::id_to_hex(raw) {
            Ok(hex) => hex.as_str().to_string(),
            Err(_) => bounded(raw, MAX_FIELD_BYTES),
        })
    }

    /// `extract::get_i64`.
    fn int(&self) -> Option<i64> {
        match self {
            Scalar::U(n) => Some(i64::try_from(*n).unwrap_or(*n as f64 as i64)),
            Scalar::I(n) => Some(*n),
            Scalar::F(f) => Some(*f as i64),
            Scalar::Str(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    /// `Value::as_f64`.
    fn float(&self) -> Option<f64> {
        match self {
            Scalar::U(n) => Some(*n as f64),
            Scalar::I(n) => Some(*n as f64),
            Scalar::F(f) => Some(*f),
            _ => None,
        }
    }

    /// `extract::get_time`.
    fn time(&self) -> Option<i64> {
        match self {
            Scalar::Str(s) => parse_time_ns(s),
            _ => None,
        }
    }
}

/// The member under its camelCase name if it is there, whatever its value, else under its
/// snake_case one (`extract::get`).
fn pick<'s, T: Present>(camel: &'s T, snake: &'s T) -> &'s T {
    if camel.present() {
        camel
    } else {
        snake
    }
}

trait Present {
    fn present(&self) -> bool;
}

impl Present for Scalar<'_> {
    fn present(&self) -> bool {
        Scalar::present(self)
    }
}

/// A member that the extraction reads as an object of `T`: missing, such an object, or a
/// value of another type.
#[derive(Debug, Default)]
enum Obj<T> {
    #[default]
    Missing,
    Is(T),
    Other,
}

impl<T> Present for Obj<T> {
    fn present(&self) -> bool {
        !matches!(self, Obj::Missing)
    }
}

impl<T> Obj<T> {
    fn get(&self) -> Option<&T> {
        match self {
            Obj::Is(t) => Some(t),
            _ => None,
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Obj<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, a: A) -> Result<Self::Value, A::Error> {
                T::deserialize(MapAccessDeserializer::new(a)).map(Obj::Is)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Obj::Other)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Obj::Other)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Obj::Other)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Obj::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Obj::Other)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Obj::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Obj::Other)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A member that the extraction reads as an array (`stateTransitions`): missing, an array of
/// elements each any value, or a value of another type.
#[derive(Debug, Default)]
enum Arr<T> {
    #[default]
    Missing,
    Is(Vec<Obj<T>>),
    Other,
}

impl<T> Present for Arr<T> {
    fn present(&self) -> bool {
        !matches!(self, Arr::Missing)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Arr<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Arr<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = a.next_element::<Obj<T>>()? {
                    items.push(item);
                }
                Ok(Arr::Is(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
                while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Arr::Other)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Arr::Other)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Arr::Other)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Arr::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Arr::Other)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Arr::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Arr::Other)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

impl<T> Arr<T> {
    /// The elements that are objects (`extract::transitions` skips the others: they have
    /// no `state`).
    fn objects(&self) -> impl Iterator<Item = &T> {
        let items: &[Obj<T>] = match self {
            Arr::Is(items) => items,
            _ => &[],
        };
        items.iter().filter_map(Obj::get)
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WorkerDefinition<'a> {
    #[serde(borrow, rename = "workerId")]
    worker_id_c: Scalar<'a>,
    #[serde(borrow, rename = "worker_id")]
    worker_id_s: Scalar<'a>,
    #[serde(borrow, rename = "nodeId")]
    node_id_c: Scalar<'a>,
    #[serde(borrow, rename = "node_id")]
    node_id_s: Scalar<'a>,
    #[serde(borrow)]
    pid: Scalar<'a>,
    #[serde(borrow, rename = "workerType")]
    worker_type_c: Scalar<'a>,
    #[serde(borrow, rename = "worker_type")]
    worker_type_s: Scalar<'a>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WorkerLifecycle<'a> {
    #[serde(borrow, rename = "workerId")]
    worker_id_c: Scalar<'a>,
    #[serde(borrow, rename = "worker_id")]
    worker_id_s: Scalar<'a>,
    #[serde(borrow, rename = "jobId")]
    job_id_c: Scalar<'a>,
    #[serde(borrow, rename = "job_id")]
    job_id_s: Scalar<'a>,
    #[serde(borrow, rename = "stateTransitions")]
    transitions_c: Arr<WorkerState<'a>>,
    #[serde(borrow, rename = "state_transitions")]
    transitions_s: Arr<WorkerState<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WorkerState<'a> {
    #[serde(borrow)]
    state: Scalar<'a>,
    #[serde(borrow)]
    timestamp: Scalar<'a>,
    #[serde(borrow, rename = "deathInfo")]
    death_c: Obj<WorkerDeath<'a>>,
    #[serde(borrow, rename = "death_info")]
    death_s: Obj<WorkerDeath<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WorkerDeath<'a> {
    #[serde(borrow, rename = "exitType")]
    exit_type_c: Scalar<'a>,
    #[serde(borrow, rename = "exit_type")]
    exit_type_s: Scalar<'a>,
    #[serde(borrow, rename = "exitDetail")]
    exit_detail_c: Scalar<'a>,
    #[serde(borrow, rename = "exit_detail")]
    exit_detail_s: Scalar<'a>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct NodeDefinition<'a> {
    #[serde(borrow, rename = "nodeId")]
    node_id_c: Scalar<'a>,
    #[serde(borrow, rename = "node_id")]
    node_id_s: Scalar<'a>,
    #[serde(borrow, rename = "nodeIpAddress")]
    ip_c: Scalar<'a>,
    #[serde(borrow, rename = "node_ip_address")]
    ip_s: Scalar<'a>,
    #[serde(borrow)]
    hostname: Scalar<'a>,
    #[serde(borrow, rename = "startTimestamp")]
    started_c: Scalar<'a>,
    #[serde(borrow, rename = "start_timestamp")]
    started_s: Scalar<'a>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct NodeLifecycle<'a> {
    #[serde(borrow, rename = "nodeId")]
    node_id_c: Scalar<'a>,
    #[serde(borrow, rename = "node_id")]
    node_id_s: Scalar<'a>,
    #[serde(borrow, rename = "stateTransitions")]
    transitions_c: Arr<NodeState<'a>>,
    #[serde(borrow, rename = "state_transitions")]
    transitions_s: Arr<NodeState<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct NodeState<'a> {
    #[serde(borrow)]
    state: Scalar<'a>,
    #[serde(borrow)]
    timestamp: Scalar<'a>,
    /// Keys as serde_json's map keeps them: sorted, the last of a key given twice.
    #[serde(borrow)]
    resources: Obj<BTreeMap<String, Scalar<'a>>>,
    #[serde(borrow, rename = "deathInfo")]
    death_c: Obj<NodeDeath<'a>>,
    #[serde(borrow, rename = "death_info")]
    death_s: Obj<NodeDeath<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct NodeDeath<'a> {
    #[serde(borrow)]
    reason: Scalar<'a>,
    #[serde(borrow, rename = "reasonMessage")]
    message_c: Scalar<'a>,
    #[serde(borrow, rename = "reason_message")]
    message_s: Scalar<'a>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ActorDefinition<'a> {
    #[serde(borrow, rename = "actorId")]
    actor_id_c: Scalar<'a>,
    #[serde(borrow, rename = "actor_id")]
    actor_id_s: Scalar<'a>,
    #[serde(borrow, rename = "jobId")]
    job_id_c: Scalar<'a>,
    #[serde(borrow, rename = "job_id")]
    job_id_s: Scalar<'a>,
    #[serde(borrow, rename = "className")]
    class_name_c: Scalar<'a>,
    #[serde(borrow, rename = "class_name")]
    class_name_s: Scalar<'a>,
    #[serde(borrow)]
    name: Scalar<'a>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ActorLifecycle<'a> {
    #[serde(borrow, rename = "actorId")]
    actor_id_c: Scalar<'a>,
    #[serde(borrow, rename = "actor_id")]
    actor_id_s: Scalar<'a>,
    #[serde(borrow, rename = "stateTransitions")]
    transitions_c: Arr<ActorState<'a>>,
    #[serde(borrow, rename = "state_transitions")]
    transitions_s: Arr<ActorState<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ActorState<'a> {
    #[serde(borrow)]
    state: Scalar<'a>,
    #[serde(borrow)]
    timestamp: Scalar<'a>,
    #[serde(borrow, rename = "nodeId")]
    node_id_c: Scalar<'a>,
    #[serde(borrow, rename = "node_id")]
    node_id_s: Scalar<'a>,
    #[serde(borrow)]
    pid: Scalar<'a>,
    /// Contexts by name as serde_json's map keeps them (sorted, the last of a name given
    /// twice): `extract::death_cause` reads the first that is an object.
    #[serde(borrow, rename = "deathCause")]
    cause_c: Obj<BTreeMap<String, Obj<ActorDeath<'a>>>>,
    #[serde(borrow, rename = "death_cause")]
    cause_s: Obj<BTreeMap<String, Obj<ActorDeath<'a>>>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ActorDeath<'a> {
    #[serde(borrow)]
    reason: Scalar<'a>,
    #[serde(borrow, rename = "errorMessage")]
    message_c: Scalar<'a>,
    #[serde(borrow, rename = "error_message")]
    message_s: Scalar<'a>,
}

/// `extract::transitions`' `Transition` of a state, `None` when it has no state string.
fn transition(state: &Scalar<'_>, timestamp: &Scalar<'_>) -> Option<Transition> {
    Some(Transition {
        state: state.text(MAX_FIELD_BYTES)?.into(),
        time_ns: timestamp.time(),
    })
}

/// The body of a worker, node or actor event of type `event_type` from its text, as
/// `extract_ray_event` makes it from its `Value`: `Some(Body::Other)` for a body it makes
/// none of (no id); `None` for another type or a body serde refuses here.
pub(super) fn body(event_type: &str, text: &str) -> Option<Body> {
    Some(match event_type {
        "WORKER_DEFINITION_EVENT" => {
            let p: WorkerDefinition = serde_json::from_str(text).ok()?;
            let Some(worker_id) = pick(&p.worker_id_c, &p.worker_id_s).id() else {
                return Some(Body::Other);
            };
            Body::WorkerDefinition {
                worker_id,
                node_id: pick(&p.node_id_c, &p.node_id_s).id(),
                pid: p.pid.int().filter(|p| *p > 0),
                worker_type: pick(&p.worker_type_c, &p.worker_type_s).text(MAX_FIELD_BYTES),
            }
        }
        "WORKER_LIFECYCLE_EVENT" => {
            let p: WorkerLifecycle = serde_json::from_str(text).ok()?;
            let Some(worker_id) = pick(&p.worker_id_c, &p.worker_id_s).id() else {
                return Some(Body::Other);
            };
            Body::WorkerLifecycle {
                worker_id,
                job_id: pick(&p.job_id_c, &p.job_id_s).id(),
                transitions: pick(&p.transitions_c, &p.transitions_s)
                    .objects()
                    .filter_map(|t| {
                        let death = pick(&t.death_c, &t.death_s).get();
                        Some(WorkerTransition {
                            state: transition(&t.state, &t.timestamp)?,
                            exit_type: death.and_then(|d| {
                                pick(&d.exit_type_c, &d.exit_type_s).text(MAX_FIELD_BYTES)
                            }),
                            exit_detail: death.and_then(|d| {
                                pick(&d.exit_detail_c, &d.exit_detail_s).text(MAX_EXIT_DETAIL_BYTES)
                            }),
                        })
                    })
                    .collect(),
            }
        }
        "NODE_DEFINITION_EVENT" => {
            let p: NodeDefinition = serde_json::from_str(text).ok()?;
            let Some(node_id) = pick(&p.node_id_c, &p.node_id_s).id() else {
                return Some(Body::Other);
            };
            Body::NodeDefinition {
                node_id,
                ip: pick(&p.ip_c, &p.ip_s).text(MAX_FIELD_BYTES),
                hostname: p.hostname.text(MAX_FIELD_BYTES),
                started_ns: pick(&p.started_c, &p.started_s).time(),
            }
        }
        "NODE_LIFECYCLE_EVENT" => {
            let p: NodeLifecycle = serde_json::from_str(text).ok()?;
            let Some(node_id) = pick(&p.node_id_c, &p.node_id_s).id() else {
                return Some(Body::Other);
            };
            Body::NodeLifecycle {
                node_id,
                transitions: pick(&p.transitions_c, &p.transitions_s)
                    .objects()
                    .filter_map(|t| {
                        let death = pick(&t.death_c, &t.death_s).get();
                        Some(NodeTransition {
                            state: transition(&t.state, &t.timestamp)?,
                            resources: t.resources.get().map(|r| {
                                r.iter()
                                    .filter_map(|(k, v)| {
                                        Some((bounded(k, MAX_FIELD_BYTES), v.float()?))
                                    })
                                    .collect()
                            }),
                            death_reason: death.and_then(|d| d.reason.text(MAX_FIELD_BYTES)),
                            death_message: death.and_then(|d| {
                                pick(&d.message_c, &d.message_s).text(MAX_FIELD_BYTES)
                            }),
                        })
                    })
                    .collect(),
            }
        }
        "ACTOR_DEFINITION_EVENT" => {
            let p: ActorDefinition = serde_json::from_str(text).ok()?;
            let Some(actor_id) = pick(&p.actor_id_c, &p.actor_id_s).id() else {
                return Some(Body::Other);
            };
            Body::ActorDefinition {
                actor_id,
                job_id: pick(&p.job_id_c, &p.job_id_s).id(),
                class_name: pick(&p.class_name_c, &p.class_name_s).text(MAX_FIELD_BYTES),
                name: p.name.text(MAX_FIELD_BYTES),
            }
        }
        "ACTOR_LIFECYCLE_EVENT" => {
            let p: ActorLifecycle = serde_json::from_str(text).ok()?;
            let Some(actor_id) = pick(&p.actor_id_c, &p.actor_id_s).id() else {
                return Some(Body::Other);
            };
            Body::ActorLifecycle {
                actor_id,
                transitions: pick(&p.transitions_c, &p.transitions_s)
                    .objects()
                    .filter_map(|t| {
                        let context = pick(&t.cause_c, &t.cause_s)
                            .get()
                            .and_then(|c| c.values().find_map(Obj::get));
                        Some(ActorTransition {
                            state: transition(&t.state, &t.timestamp)?,
                            node_id: pick(&t.node_id_c, &t.node_id_s).id(),
                            pid: t.pid.int().filter(|p| *p > 0),
                            death_reason: context.and_then(|d| d.reason.text(MAX_FIELD_BYTES)),
                            death_message: context.and_then(|d| {
                                let m = pick(&d.message_c, &d.message_s).text(MAX_FIELD_BYTES)?;
                                Some(bounded(&m, MAX_ERROR_MESSAGE_BYTES))
                            }),
                        })
                    })
                    .collect(),
            }
        }
        _ => return None,
    })
}
