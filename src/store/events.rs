//! Event log reads: pages in scope, where a page is held, the log's end, one job's events.

use uuid::Uuid;

use super::rows::{EventReadRow, EventRow, EventsRead};
use super::{Store, map_db_error};
use crate::model::access::Scope;
use crate::model::error::CoreError;

impl Store {
    /// `s3p.events_read`: a page of events and the horizon it stopped at.
    #[tracing::instrument(name = "db", skip_all, fields(op = "events"))]
    pub async fn events(
        &self,
        scope: &Scope,
        after: crate::model::events::Cursor,
        types: Option<Vec<String>>,
        queues: Option<Vec<String>>,
        job_types: Option<Vec<String>>,
        limit: i32,
    ) -> Result<EventsRead, CoreError> {
        let rows = sqlx::query_as::<_, EventReadRow>(
            "SELECT * FROM s3p.events_read($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(after.txid)
        .bind(after.seq)
        .bind(types)
        .bind(queues)
        .bind(job_types)
        .bind(limit)
        .bind(scope.like_patterns())
        .fetch_all(&self.hot)
        .await
        .map_err(map_db_error)?;
        let horizon = rows.first().map_or(0, |row| row.horizon);
        Ok(EventsRead {
            events: rows.into_iter().filter_map(EventReadRow::event).collect(),
            horizon,
        })
    }

    /// `s3p.events_held_through`: the newest transaction holding events after `after` at or past
    /// `horizon`, the one a page stopped at (held back then: wait until a page passes it).
    #[tracing::instrument(name = "db", skip_all, fields(op = "events_held"))]
    pub async fn events_held_through(
        &self,
        after: crate::model::events::Cursor,
        horizon: i64,
    ) -> Result<Option<i64>, CoreError> {
        sqlx::query_scalar("SELECT s3p.events_held_through($1, $2, $3)")
            .bind(after.txid)
            .bind(after.seq)
            .bind(horizon)
            .fetch_one(&self.hot)
            .await
            .map_err(map_db_error)
    }

    /// `s3p.events_end`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "events_end"))]
    pub async fn events_end(&self) -> Result<crate::model::events::Cursor, CoreError> {
        let (txid, seq): (i64, i64) = sqlx::query_as("SELECT * FROM s3p.events_end()")
            .fetch_one(&self.hot)
            .await
            .map_err(map_db_error)?;
        Ok(crate::model::events::Cursor { txid, seq })
    }

    /// `s3p.job_events`: the retained events of one job, oldest first.
    #[tracing::instrument(name = "db", skip_all, fields(op = "job_events"))]
    pub async fn job_events(
        &self,
        id: Uuid,
        limit: i32,
    ) -> Result<Vec<crate::model::events::Event>, CoreError> {
        sqlx::query_as::<_, EventRow>("SELECT * FROM s3p.job_events($1, $2)")
            .bind(id)
            .bind(limit)
            .fetch_all(&self.hot)
            .await
            .map(|rows| {
                rows.into_iter()
                    .map(crate::model::events::Event::from)
                    .collect()
            })
            .map_err(map_db_error)
    }
}
