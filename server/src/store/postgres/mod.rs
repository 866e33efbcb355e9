//! The PostgreSQL backend, for a fleet of nodes sharing one database.
//!
//! tokio-postgres with a deadpool pool: every write is one statement (or one short
//! transaction) that PostgreSQL commits durably before it answers, and concurrent commits from
//! the pool's connections share WAL flushes, which is the group commit the SQLite backend does
//! by hand. Statements are prepared once per connection (`prepare_cached`).
//!
//! Times are milliseconds since the epoch from the database's clock (`durable_now_ms()`), never
//! a node's, so that rows written by different nodes order by one clock.

mod handles;
mod migrations;
pub mod scratch;
mod sessions;
mod streams;
mod tasks;
mod wakeups;

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement};

use tokio::sync::broadcast;

use super::{Change, ChangeFeed, Health, PRUNE_BATCH, StoreError};

/// Connections a node keeps open. Enough for the writes in flight to share commits; each
/// costs the database a backend process, and a fleet multiplies it.
const POOL_SIZE: usize = 16;
/// How long a request waits for a connection (including making a new one) before it fails
/// with a clear error instead of hanging while the database is unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The PostgreSQL backend: a pool of connections to one database, and a connection listening
/// for the other nodes' changes.
pub struct Postgres {
    pool: Pool,
    /// The URL without its password, for logs and errors.
    shown: String,
    changes: broadcast::Sender<Change>,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("url", &self.shown)
            .finish()
    }
}

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

impl Postgres {
    /// Connects to the database at `url` (`postgres://user[:password]@host[:port]/database`)
    /// as `node`, and migrates its schema to this binary's version.
    pub async fn connect(url: &str, node: &str) -> Result<Postgres, StoreError> {
        let mut config = tokio_postgres::Config::from_str(url)
            .map_err(|e| StoreError::Url(format!("{}: {e}", redact(url))))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        // Names the node in what its statements notify (and in pg_stat_activity).
        config.application_name(node);
        let changes = wakeups::listen(config.clone(), node.to_owned());
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT))
            .wait_timeout(Some(CONNECT_TIMEOUT * 2))
            .build()
            .map_err(|e| StoreError::Url(format!("{}: {e}", redact(url))))?;
        let store = Postgres {
            pool,
            shown: redact(url),
            changes,
        };
        let mut client = store.client().await?;
        migrations::migrate(&mut client).await?;
        Ok(store)
    }

    async fn client(&self) -> Result<Object, StoreError> {
        Ok(self.pool.get().await?)
    }

    async fn prepared(&self, sql: &str) -> Result<(Object, Statement), StoreError> {
        let client = self.client().await?;
        let statement = client.prepare_cached(sql).await?;
        Ok((client, statement))
    }

    /// Runs one statement that returns no rows; returns how many rows it changed.
    async fn execute(&self, sql: &str, params: Params<'_>) -> Result<u64, StoreError> {
        let (client, statement) = self.prepared(sql).await?;
        Ok(client.execute(&statement, params).await?)
    }

    /// Runs `sql`, a DELETE of at most `$2` rows among those older than `$1`, in one statement
    /// after another until one deletes fewer, so that no transaction holds many row locks for
    /// long. Returns the rows deleted and the statements taken.
    async fn delete_in_batches(&self, sql: &str, cutoff: i64) -> Result<(u64, u64), StoreError> {
        let (mut deleted, mut batches) = (0, 0);
        loop {
            let batch = self.execute(sql, &[&cutoff, &(PRUNE_BATCH as i64)]).await?;
            deleted += batch;
            batches += 1;
            if batch < PRUNE_BATCH as u64 {
                return Ok((deleted, batches));
            }
        }
    }

    /// Runs one statement and reads its first row, if any, with `read`.
    async fn query_opt<T>(
        &self,
        sql: &str,
        params: Params<'_>,
        read: fn(&Row) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        let (client, statement) = self.prepared(sql).await?;
        client
            .query_opt(&statement, params)
            .await?
            .as_ref()
            .map(read)
            .transpose()
    }

    /// Runs one statement and reads every row with `read`.
    async fn query<T>(
        &self,
        sql: &str,
        params: Params<'_>,
        read: fn(&Row) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let (client, statement) = self.prepared(sql).await?;
        client
            .query(&statement, params)
            .await?
            .iter()
            .map(read)
            .collect()
    }
}

#[async_trait::async_trait]
impl Health for Postgres {
    async fn round_trip(&self) -> Result<(), StoreError> {
        self.query_opt("SELECT 1", &[], |_| Ok(())).await?;
        Ok(())
    }
}

impl ChangeFeed for Postgres {
    fn changes(&self) -> Option<broadcast::Receiver<Change>> {
        Some(self.changes.subscribe())
    }
}

/// `url` with its password replaced by `***`, for logs and errors: in the user info
/// (`postgres://user:password@host`) and as a parameter (`?password=` or `password=` in the
/// key-value form).
pub fn redact(url: &str) -> String {
    let mut shown = url.to_owned();
    if let Some(scheme_end) = url.find("://").map(|i| i + 3) {
        let authority_end = url[scheme_end..]
            .find(['/', '?'])
            .map_or(url.len(), |i| scheme_end + i);
        if let Some(at) = url[scheme_end..authority_end].rfind('@')
            && let Some(colon) = url[scheme_end..scheme_end + at].find(':')
        {
            shown = format!(
                "{}***{}",
                &url[..scheme_end + colon + 1],
                &url[scheme_end + at..]
            );
        }
    }
    let mut rest = shown.as_str();
    let mut out = String::with_capacity(shown.len());
    while let Some(i) = rest.find("password=") {
        let value = i + "password=".len();
        out.push_str(&rest[..value]);
        out.push_str("***");
        let end = rest[value..]
            .find(['&', ' '])
            .map_or(rest.len(), |e| value + e);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Reads an unsigned count stored as `BIGINT`.
fn unsigned(row: &Row, index: usize) -> Result<u64, StoreError> {
    let value: i64 = row.try_get(index)?;
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("negative count {value}")))
}

/// A count to store as `BIGINT`.
fn signed(value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{value} exceeds BIGINT")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_the_logs() {
        for (url, shown) in [
            (
                "postgres://app:s3cret@db.internal:5432/tasks",
                "postgres://app:***@db.internal:5432/tasks",
            ),
            (
                "postgres://app@127.0.0.1/tasks?password=x&sslmode=disable",
                "postgres://app@127.0.0.1/tasks?password=***&sslmode=disable",
            ),
            (
                "host=/run/postgresql password=x user=app",
                "host=/run/postgresql password=*** user=app",
            ),
            ("postgres://127.0.0.1/t", "postgres://127.0.0.1/t"),
        ] {
            assert_eq!(redact(url), shown);
        }
    }
}
