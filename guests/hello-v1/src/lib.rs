//! A job as it was written for `baton:job@0.1.0` (`wit/v0.1.0/baton-job.wit`), before the SDK
//! moved to 0.2.0: one log line with its run info, and success. The host must keep running it.

wit_bindgen::generate!({ path: "../../wit/v0.1.0", world: "job" });

use baton::job::host::{info, log, Level};

struct HelloV1;

impl Guest for HelloV1 {
    fn run() -> Result<(), String> {
        let info = info();
        log(
            Level::Info,
            &format!(
                "hello from a 0.1.0 job: {} slot {} attempt {} ({:?})",
                info.job, info.slot, info.attempt, info.reason
            ),
        );
        Ok(())
    }
}

export!(HelloV1);
