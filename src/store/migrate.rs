//! Versioned, idempotent migrations of the `s3p` catalog, and the per-queue schema template.

use sqlx::PgPool;

use super::map_db_error;
use crate::core::CoreError;

/// Catalog migrations in order: (version, name, SQL).
const MIGRATIONS: &[Migration] = &[
    Migration(1, "catalog", include_str!("../../sql/001_catalog.sql")),
    Migration(2, "jobs", include_str!("../../sql/002_jobs.sql")),
    Migration(3, "streams", include_str!("../../sql/003_streams.sql")),
    Migration(
        4,
        "namespaces",
        include_str!("../../sql/004_namespaces.sql"),
    ),
    Migration(
        5,
        "workflows_cron",
        include_str!("../../sql/005_workflows_cron.sql"),
    ),
    Migration(6, "events", include_str!("../../sql/006_events.sql")),
    Migration(7, "metrics", include_str!("../../sql/007_metrics.sql")),
    Migration(
        8,
        "event_mirror",
        include_str!("../../sql/008_event_mirror.sql"),
    ),
];

/// One migration: version, name, SQL.
struct Migration(i32, &'static str, &'static str);

/// The queue schema template and its version; bump the version whenever the template changes.
const QUEUE_TEMPLATE_VERSION: i32 = 14;
const QUEUE_TEMPLATE: &str = concat!(
    include_str!("../../sql/queue_template.sql"),
    include_str!("../../sql/stream_template.sql")
);

/// The digest recorded for a migration's SQL.
fn checksum(sql: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(sql.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Applies new migrations, and again every applied one whose SQL changed since (each file is
/// idempotent: tables `IF NOT EXISTS`, functions `CREATE OR REPLACE`), under an advisory lock;
/// installs the queue template and upgrades every existing queue schema to it.
pub async fn run(pool: &PgPool) -> Result<(), CoreError> {
    let mut tx = pool.begin().await.map_err(map_db_error)?;
    // One migrator at a time when several gateways start together.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('s3p.migrate'))")
        .execute(&mut *tx)
        .await
        .map_err(map_db_error)?;
    sqlx::raw_sql(
        "CREATE SCHEMA IF NOT EXISTS s3p;
         CREATE TABLE IF NOT EXISTS s3p.migrations (
             version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
         ALTER TABLE s3p.migrations ADD COLUMN IF NOT EXISTS checksum text",
    )
    .execute(&mut *tx)
    .await
    .map_err(map_db_error)?;
    let applied: Vec<(i32, Option<String>)> =
        sqlx::query_as("SELECT version, checksum FROM s3p.migrations")
            .fetch_all(&mut *tx)
            .await
            .map_err(map_db_error)?;
    for Migration(version, name, sql) in MIGRATIONS {
        let digest = checksum(sql);
        let recorded = applied.iter().find(|(v, _)| v == version);
        if recorded.is_some_and(|(_, c)| c.as_deref() == Some(digest.as_str())) {
            continue;
        }
        tracing::info!(
            version,
            name,
            again = recorded.is_some(),
            "applying migration"
        );
        sqlx::raw_sql(*sql)
            .execute(&mut *tx)
            .await
            .map_err(map_db_error)?;
        sqlx::query(
            "INSERT INTO s3p.migrations (version, name, checksum) VALUES ($1, $2, $3)
             ON CONFLICT (version) DO UPDATE SET name = excluded.name, checksum = excluded.checksum,
                                                 applied_at = now()",
        )
        .bind(version)
        .bind(name)
        .bind(&digest)
        .execute(&mut *tx)
        .await
        .map_err(map_db_error)?;
    }
    sqlx::query(
        "INSERT INTO s3p.queue_templates (version, body) VALUES ($1, $2)
         ON CONFLICT (version) DO UPDATE SET body = excluded.body",
    )
    .bind(QUEUE_TEMPLATE_VERSION)
    .bind(QUEUE_TEMPLATE)
    .execute(&mut *tx)
    .await
    .map_err(map_db_error)?;
    let upgraded: i32 = sqlx::query_scalar("SELECT s3p.upgrade_queue_schemas()")
        .fetch_one(&mut *tx)
        .await
        .map_err(map_db_error)?;
    if upgraded > 0 {
        tracing::info!(upgraded, "upgraded queue schemas");
    }
    tx.commit().await.map_err(map_db_error)?;
    Ok(())
}
