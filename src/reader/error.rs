//! What the reader reports as failed: a bucket, a session, a log or a filter it cannot read.
//! The faces print it escaped; `serve` answers some of it with a status of its own.

/// Why the reader could not read what was asked for: a bucket, a session, a log, a filter.
/// Its messages may quote names from the bucket: each face escapes them where it shows them.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A local bucket directory that does not exist (it is not created by a read).
    #[error("{0} does not exist or is not a directory")]
    NoSuchDirectory(String),
    /// Nothing that marks a session was found.
    #[error(
        "no session markers under {prefix}/ in {storage}: nothing was uploaded here, or the \
         root prefix is wrong (see --storage-root-dir)"
    )]
    NoMarkers {
        /// The bucket.
        storage: String,
        /// The metadata prefix that was listed.
        prefix: String,
    },
    /// The filters matched no session.
    #[error("no session matches {wanted}; sessions found: {known}")]
    NoSuchSession {
        /// What was asked for.
        wanted: String,
        /// What exists (shortened).
        known: String,
    },
    /// The same session name under several clusters.
    #[error("session {session} exists in several clusters ({clusters}); choose one with --cluster and --namespace")]
    AmbiguousSession {
        /// The session name.
        session: String,
        /// The clusters that have it.
        clusters: String,
    },
    /// `--logs` names nothing the session knows.
    #[error("no task, actor, worker or node {id} in session {session}")]
    NoSuchLogTarget {
        /// The id asked for (hex).
        id: String,
        /// The session.
        session: String,
    },
    /// The log was found in the events but not in the bucket.
    #[error("the log of {what} is not in the bucket ({key}): logs are uploaded only by a collector with the log collector on (--enable-log-collector)")]
    LogNotUploaded {
        /// What it is the log of.
        what: String,
        /// The key looked for.
        key: String,
    },
    /// No worker is known for the task or actor.
    #[error("no worker is known for {what} (it may never have run), so it has no log")]
    NoLogFor {
        /// What it is.
        what: String,
    },
    /// Several log objects match.
    #[error("several logs match {id}: {matches}")]
    SeveralLogs {
        /// The id.
        id: String,
        /// The objects that match.
        matches: String,
    },
    /// A flag value that cannot be used.
    #[error("{flag} {value:?}: {reason}")]
    BadArgument {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}
