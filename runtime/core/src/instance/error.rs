//! Why an instance could not start, or take a job.

use crate::lease::OptionsError;
use crate::store::StoreError;

/// Why an instance could not start.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A job's lease options are out of range.
    #[error("job {job:?}: {source}")]
    Options {
        /// The job.
        job: String,
        /// What is wrong.
        #[source]
        source: OptionsError,
    },
    /// Two jobs have the same name.
    #[error("job {0:?} is defined twice")]
    DuplicateJob(String),
    /// The instance was stopped; it takes no more jobs.
    #[error("the instance is stopped")]
    Stopped,
    /// The lease engine's runtime could not be built.
    #[error("cannot start the lease engine: {0}")]
    Runtime(#[source] std::io::Error),
}
