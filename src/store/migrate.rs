//! Versioned, idempotent migrations of the `s3p` catalog, and the per-queue schema template.

use sqlx::PgPool;

use super::map_db_error;
use crate::model::error::CoreError;

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
    Migration(9, "tokens", include_str!("../../sql/009_tokens.sql")),
    Migration(10, "dashboard", include_str!("../../sql/010_dashboard.sql")),
    Migration(
        11,
        "worker_heartbeat",
        include_str!("../../sql/011_worker_heartbeat.sql"),
    ),
    Migration(
        12,
        "admin_jobs",
        include_str!("../../sql/012_admin_jobs.sql"),
    ),
    Migration(
        13,
        "admin_workers",
        include_str!("../../sql/013_admin_workers.sql"),
    ),
];

/// One migration: version, name, SQL.
struct Migration(i32, &'static str, &'static str);

/// The queue schema template and its version; bump the version whenever the template changes.
const QUEUE_TEMPLATE_VERSION: i32 = 45;
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
/// installs the queue template; then upgrades every existing queue schema to it.
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
    tx.commit().await.map_err(map_db_error)?;
    upgrade_queue_schemas(pool).await
}

/// Brings every queue schema to the latest template, each queue in its own transaction: one
/// transaction over ~1,000 queues would hold every queue's table locks at once and run out of
/// PostgreSQL's shared lock table. `ensure_queue_schema` serialises upgraders of one queue, so
/// gateways starting together may share the work.
async fn upgrade_queue_schemas(pool: &PgPool) -> Result<(), CoreError> {
    let stale: Vec<String> = sqlx::query_scalar(
        "SELECT q.name FROM s3p.queues q
          WHERE q.template_version < (SELECT max(version) FROM s3p.queue_templates)
          ORDER BY q.name",
    )
    .fetch_all(pool)
    .await
    .map_err(map_db_error)?;
    for queue in &stale {
        sqlx::query("SELECT s3p.ensure_queue_schema($1)")
            .bind(queue)
            .execute(pool)
            .await
            .map_err(map_db_error)?;
    }
    if !stale.is_empty() {
        tracing::info!(upgraded = stale.len(), "upgraded queue schemas");
    }
    Ok(())
}
