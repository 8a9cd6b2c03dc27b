//! The store's own pool of connections.
//!
//! sqlx's pool sends a ping on every connection it takes back, a second round trip after every
//! statement. This pool keeps a connection only when its statement was answered (a result or
//! an error of the server's), and closes one whose statement was cut short (a timeout, a lost
//! connection), whose protocol state nobody knows; after a lost connection it closes the idle
//! ones too, since a server that restarted cut them all. Nothing is sent but the statements.

use std::sync::Mutex;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, PgConnection};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// Up to `size` connections to one server, opened when needed and kept while answered.
pub(super) struct Connections {
    options: PgConnectOptions,
    idle: Mutex<Vec<PgConnection>>,
    slots: Semaphore,
}

/// Why no connection could be had.
pub(super) enum NoConnection {
    /// Every connection stayed busy, or the server did not accept one, until the deadline.
    TimedOut,
    /// The server refused or failed the connection.
    Failed(sqlx::Error),
}

/// A connection taken from the pool; given back when dropped, if it was answered.
pub(super) struct Held<'p> {
    pool: &'p Connections,
    connection: Option<PgConnection>,
    answered: bool,
    _slot: SemaphorePermit<'p>,
}

impl Connections {
    /// A pool of at most `size` connections, `warm` of them opened now.
    pub(super) async fn open(
        options: PgConnectOptions,
        size: u32,
        warm: u32,
    ) -> Result<Self, sqlx::Error> {
        let mut idle = Vec::new();
        for _ in 0..warm.min(size) {
            idle.push(options.connect().await?);
        }
        Ok(Connections {
            options,
            idle: Mutex::new(idle),
            slots: Semaphore::new(usize::try_from(size).unwrap_or(1)),
        })
    }

    /// An idle connection, or a new one, by `deadline`.
    pub(super) async fn acquire(&self, deadline: Instant) -> Result<Held<'_>, NoConnection> {
        let slot = tokio::time::timeout_at(deadline, self.slots.acquire())
            .await
            .map_err(|_| NoConnection::TimedOut)?
            // The semaphore is never closed.
            .map_err(|_| NoConnection::TimedOut)?;
        let idle = self.lock().pop();
        let connection = match idle {
            Some(connection) => connection,
            None => tokio::time::timeout_at(deadline, self.options.connect())
                .await
                .map_err(|_| NoConnection::TimedOut)?
                .map_err(NoConnection::Failed)?,
        };
        Ok(Held {
            pool: self,
            connection: Some(connection),
            answered: false,
            _slot: slot,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<PgConnection>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Held<'_> {
    /// The connection, for one statement.
    pub(super) fn connection(&mut self) -> &mut PgConnection {
        self.connection
            .as_mut()
            .expect("a held connection is present until dropped")
    }

    /// Notes how the statement ended: a connection whose statement the server answered goes
    /// back to the pool; one that was lost takes the idle ones with it.
    pub(super) fn ended<T>(&mut self, answer: &Result<Result<T, sqlx::Error>, impl Sized>) {
        match answer {
            Ok(Ok(_)) | Ok(Err(sqlx::Error::Database(_))) => self.answered = true,
            Ok(Err(sqlx::Error::Io(_) | sqlx::Error::Tls(_))) => self.pool.lock().clear(),
            _ => {}
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            if self.answered {
                self.pool.lock().push(connection);
            }
        }
    }
}
