//! Throw-away databases for tests and benchmarks: each run gets a database of its own, created
//! on the server named by an administrative URL and dropped when the run is done.

use std::str::FromStr;

use tokio_postgres::NoTls;

use crate::store::StoreError;

/// The environment variable naming the PostgreSQL server that tests and benchmarks create their
/// databases on: a URL whose role may create databases, e.g.
/// `postgres://durable_test:durable_test@127.0.0.1:5432/postgres`. `scripts/setup` makes that
/// role and `scripts/test` sets the variable.
pub const TEST_SERVER_VAR: &str = "DURABLE_MCP_TEST_POSTGRES";

/// A database created for one test or benchmark, dropped (with any connection still open to
/// it) when this value is dropped.
#[derive(Debug)]
pub struct ScratchDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl ScratchDatabase {
    /// Creates a fresh database on the server of `admin_url`.
    pub async fn create(admin_url: &str) -> Result<ScratchDatabase, StoreError> {
        let name = format!("durable_scratch_{}", hex::encode(rand::random::<[u8; 6]>()));
        let url = with_database(admin_url, &name)?;
        admin(admin_url, &format!("CREATE DATABASE {name}")).await?;
        Ok(ScratchDatabase {
            admin_url: admin_url.to_owned(),
            name,
            url,
        })
    }

    /// Creates a fresh database on the server named by [`TEST_SERVER_VAR`], or `None` when the
    /// variable is not set.
    pub async fn from_env() -> Option<Result<ScratchDatabase, StoreError>> {
        let admin_url = std::env::var(TEST_SERVER_VAR).ok()?;
        Some(ScratchDatabase::create(&admin_url).await)
    }

    /// The URL of the new database.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        // Drop runs outside any async context it could use (possibly inside a runtime that is
        // shutting down), so the DROP gets a thread and a small runtime of its own.
        let (admin_url, sql) = (
            self.admin_url.clone(),
            format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime
                .block_on(admin(&admin_url, &sql))
                .map_err(std::io::Error::other)
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop scratch database {}", self.name);
        }
    }
}

/// Runs one statement on the administrative connection.
async fn admin(admin_url: &str, sql: &str) -> Result<(), StoreError> {
    let mut config = tokio_postgres::Config::from_str(admin_url)
        .map_err(|e| StoreError::Url(format!("{}: {e}", super::redact(admin_url))))?;
    // A server that accepts and never answers must fail the run, not hang it.
    config.connect_timeout(super::CONNECT_TIMEOUT);
    let (client, connection) = config.connect(NoTls).await?;
    let driver = tokio::spawn(connection);
    let result = client.batch_execute(sql).await;
    drop(client);
    let _ = driver.await;
    Ok(result?)
}

/// `url` with its database name replaced by `name`. Only the URL form
/// (`postgres://user@host:port/database?options`) is supported.
fn with_database(url: &str, name: &str) -> Result<String, StoreError> {
    let invalid = || StoreError::Url(format!("{}: not a postgres:// URL", super::redact(url)));
    let authority = url.find("://").ok_or_else(invalid)? + 3;
    let path = url[authority..]
        .find(['/', '?'])
        .map_or(url.len(), |i| authority + i);
    let query = url[path..].find('?').map_or(url.len(), |i| path + i);
    Ok(format!("{}/{name}{}", &url[..path], &url[query..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_name_is_replaced_and_the_rest_kept() {
        for (url, expected) in [
            ("postgres://u:p@h:5432/postgres", "postgres://u:p@h:5432/x"),
            (
                "postgres://u@h/postgres?sslmode=disable",
                "postgres://u@h/x?sslmode=disable",
            ),
            ("postgres://u@h", "postgres://u@h/x"),
            (
                "postgres://u@h?connect_timeout=3",
                "postgres://u@h/x?connect_timeout=3",
            ),
        ] {
            assert_eq!(with_database(url, "x").unwrap(), expected);
        }
        assert!(with_database("host=localhost", "x").is_err());
    }
}
