//! Why `inspect` could not do what its flags asked, beyond what the reader could not read
//! ([`crate::reader::ReadError`]). Printed escaped, as every error of the command.

/// Why `inspect` could not do what its flags asked.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// `--train-run` or `--compare-runs` names no run of the session.
    #[error("no Ray Train run {wanted:?} in session {session} (by id or name); runs: {known}")]
    NoSuchTrainRun {
        /// What was asked for.
        wanted: String,
        /// The session.
        session: String,
        /// The runs there are (shortened).
        known: String,
    },
    /// Several runs of the session have that name.
    #[error(
        "several Ray Train runs are named {wanted:?} in session {session}: {ids}; give the run id"
    )]
    AmbiguousTrainRun {
        /// The name.
        wanted: String,
        /// The session.
        session: String,
        /// Their ids.
        ids: String,
    },
    /// A `--compare-runs` operand without a session, and no `--session`.
    #[error("--compare-runs {run:?}: which session? write SESSION:RUN (or latest:RUN), or give --session")]
    RunWithoutSession {
        /// The operand.
        run: String,
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
