//! SQLSTATEs as core errors: ours to their codes, a server going away to `unavailable`.

use crate::model::error::{CoreError, ErrorKind};

/// Maps a database error to a core error: our SQLSTATEs to their codes, the rest to backend errors.
pub fn map_db_error(error: sqlx::Error) -> CoreError {
    match &error {
        sqlx::Error::Database(db) => {
            let kind = match db.code().as_deref() {
                Some("PV400") => ErrorKind::InvalidRequest,
                Some("PV404") => ErrorKind::NotFound,
                Some("PV409") => ErrorKind::Conflict,
                Some("PV410") => ErrorKind::StaleLease,
                Some("PV411") => {
                    let mut error = CoreError::new(ErrorKind::Duplicate, db.message().to_string());
                    if let Some(existing) = db
                        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                        .and_then(|e| e.detail())
                    {
                        error = error.with_detail("existing_job_id", existing.into());
                    }
                    return error;
                }
                Some("PV413") => ErrorKind::BatchTooLarge,
                Some("PV429") => {
                    let quota = db
                        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                        .and_then(|e| e.detail())
                        .unwrap_or("quota")
                        .to_string();
                    return CoreError::new(ErrorKind::QuotaExceeded, db.message().to_string())
                        .with_detail("quota", quota.into());
                }
                Some("PV422") => ErrorKind::ValidationError,
                // read_only_sql_transaction: the database is a standby.
                Some("25006") => ErrorKind::ReadOnly,
                // admin/crash shutdown, cannot connect now (starting, in recovery), connection
                // exceptions: the server went away or is not ready; a failover may be under way.
                Some(code) if code.starts_with("57P") || code.starts_with("08") => {
                    return CoreError::new(
                        ErrorKind::Unavailable,
                        format!("the database is unavailable: {}", db.message()),
                    );
                }
                // A queue dropped or rebuilt under the statement, still so after its rerun (a
                // drop racing again): not the database failing.
                _ if super::routes::is_stale(&error) => {
                    tracing::warn!(error = %db, "queue dropped or rebuilt while a statement ran");
                    return CoreError::new(
                        ErrorKind::Conflict,
                        "the queue was dropped or rebuilt while the request ran; send it again",
                    );
                }
                _ => {
                    tracing::error!(error = %db, "database error");
                    return CoreError::new(
                        ErrorKind::Backend,
                        "the database failed to run the operation",
                    );
                }
            };
            CoreError::new(kind, db.message().to_string())
        }
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => CoreError::new(
            ErrorKind::Unavailable,
            format!("the database is unavailable: {error}"),
        ),
        _ => {
            tracing::error!(%error, "database error");
            CoreError::new(
                ErrorKind::Backend,
                "the database failed to run the operation",
            )
        }
    }
}
