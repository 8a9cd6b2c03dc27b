//! `baton state`: a job's state as the store holds it: its keys with the attempt that wrote
//! each, one value, and the operator's delete.

use std::io::Write;

use anyhow::Context;
use baton_core::report::{state_entry_json, state_key_json, state_table};
use baton_core::store;

use super::config::DEFAULT_STORE;

/// The options of `baton state`.
#[derive(clap::Args)]
pub struct StateArgs {
    /// The job's name (its file's stem).
    job: String,
    /// One key: print its value (as stored, bytes and all) instead of the list of keys.
    key: Option<String>,
    /// Delete this key of the job's state: an operator's action, not fenced by any attempt. An
    /// attempt running now may write the key again.
    #[arg(long, value_name = "KEY", conflicts_with = "key")]
    delete: Option<String>,
    /// The shared store. [default: sqlite://baton.db]
    #[arg(long, env = "BATON_STORE", default_value = DEFAULT_STORE, hide_default_value = true)]
    store: String,
    /// The namespace in the store.
    #[arg(long, env = "BATON_NAMESPACE", default_value = store::DEFAULT_NAMESPACE)]
    namespace: String,
    /// One JSON object per key and line (job, key, size, slot, attempt, fence, written_at; with
    /// KEY also value, or value_hex for a value that is not UTF-8) instead of a table.
    #[arg(long)]
    json: bool,
}

/// Lists a job's state keys, prints one value, or deletes one key.
pub async fn state(args: StateArgs) -> anyhow::Result<()> {
    let store = store::open(&args.store, &args.namespace)
        .await
        .with_context(|| format!("opening store {}", store::redact(&args.store)))?;
    let job = &args.job;
    let namespace = &args.namespace;
    if let Some(key) = &args.delete {
        let existed = store
            .state_remove(job, key)
            .await
            .with_context(|| format!("deleting state key {key:?} of job {job:?}"))?;
        if !existed {
            anyhow::bail!(
                "job {job:?} has no state key {key:?} in namespace {namespace:?}; `baton state \
                 {job}` lists its keys"
            );
        }
        println!("deleted state key {key:?} of job {job:?}");
        return Ok(());
    }
    if let Some(key) = &args.key {
        let entry = store
            .state_get(job, key)
            .await
            .with_context(|| format!("reading state key {key:?} of job {job:?}"))?;
        let Some(entry) = entry else {
            anyhow::bail!(
                "job {job:?} has no state key {key:?} in namespace {namespace:?}; `baton state \
                 {job}` lists its keys"
            );
        };
        if args.json {
            println!("{}", state_entry_json(job, &entry));
        } else {
            let mut out = std::io::stdout().lock();
            out.write_all(&entry.value)
                .and_then(|()| out.write_all(b"\n"))
                .context("writing the value to stdout")?;
        }
        return Ok(());
    }
    let keys = store
        .state_keys(job)
        .await
        .with_context(|| format!("listing the state of job {job:?}"))?;
    if args.json {
        for key in &keys {
            println!("{}", state_key_json(job, key));
        }
    } else {
        print!("{}", state_table(&keys));
    }
    Ok(())
}
