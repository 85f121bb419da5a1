//! Whether a pooled connection is still alive when the pool hands it out.
//!
//! sqlx's own check pings the server on every acquire: a round trip before every statement, and
//! about 6 % of the server's CPU on the job hot path. A connection that answered a statement a
//! moment ago needs none; one that sat idle may have lost its server (a restart, a failover) and
//! is pinged first, so a request does not fail on a connection the pool could have replaced. The
//! threshold is shorter than any restart: a connection last used before the server went away has
//! been idle at least that long when the first request after it comes.

use std::time::Duration;

use sqlx::PgConnection;
use sqlx::pool::PoolConnectionMetadata;

/// How long a connection may sit idle before it is pinged on acquire.
pub const PING_WHEN_IDLE_FOR: Duration = Duration::from_millis(100);

/// Pings the connection when it has been idle for `PING_WHEN_IDLE_FOR` or longer; an error
/// makes the pool close it and try another.
pub async fn check(
    conn: &mut PgConnection,
    meta: PoolConnectionMetadata,
) -> Result<bool, sqlx::Error> {
    if meta.idle_for >= PING_WHEN_IDLE_FOR {
        sqlx::Connection::ping(conn).await?;
    }
    Ok(true)
}
