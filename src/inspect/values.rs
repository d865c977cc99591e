//! The small values every stage of the read side shares: a state transition, the rank that
//! orders states of equal time, and a string cut to a bound. A leaf: it imports no stage, so
//! the stages that fold (task), merge (model) and read (extract, scan) can all use it without
//! importing each other back.

/// A state transition: state name and time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Transition {
    /// Ray's state names are static strings (no allocation per transition).
    pub(super) state: std::borrow::Cow<'static, str>,
    pub(super) time_ns: Option<i64>,
}

/// `s`, cut at a character boundary to at most `max` bytes.
pub(super) fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s[..cut].to_string()
}

/// Rank of a state within its entity's enum, to break timestamp ties toward the later state.
pub(super) fn state_rank(state: &str) -> u8 {
    match state {
        // TaskStatus
        "NIL" => 0,
        "PENDING_ARGS_AVAIL" => 1,
        "PENDING_NODE_ASSIGNMENT" => 2,
        "PENDING_OBJ_STORE_MEM_AVAIL" => 3,
        "PENDING_ARGS_FETCH" => 4,
        "SUBMITTED_TO_WORKER" => 5,
        "PENDING_ACTOR_TASK_ARGS_FETCH" => 6,
        "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY" => 7,
        "RUNNING" => 8,
        "RUNNING_IN_RAY_GET" => 9,
        "RUNNING_IN_RAY_WAIT" => 10,
        "FINISHED" => 11,
        "FAILED" => 12,
        // Actor, node and driver-job states
        "DEPENDENCIES_UNREADY" | "CREATED" => 1,
        "PENDING_CREATION" => 2,
        "ALIVE" => 3,
        "RESTARTING" => 4,
        "DEAD" => 5,
        _ => 0,
    }
}
