//! Figures for `/metrics`: per-queue snapshots (`s3p.metrics_snapshot`) and the pool's usage.

use serde_json::Value;

use super::{Store, map_db_error};
use crate::model::access::Scope;
use crate::model::error::CoreError;

impl Store {
    /// `s3p.metrics_snapshot`: per-queue job and stream figures, `{"queues": [...]}`, read a page
    /// of queues per statement so no transaction locks every queue's tables at once.
    #[tracing::instrument(name = "db", skip_all, fields(op = "metrics_snapshot"))]
    pub async fn metrics_snapshot(&self, scope: &Scope) -> Result<Value, CoreError> {
        const PAGE: i32 = 25;
        let patterns = scope.like_patterns();
        let mut queues: Vec<Value> = Vec::new();
        let mut after: Option<String> = None;
        loop {
            // A queue dropped while the page is read: run once more (`Conflicts::rerun`).
            let mut page: Value = self
                .retry_conflicts(|| {
                    sqlx::query_scalar("SELECT s3p.metrics_snapshot($1, $2, $3)")
                        .bind(after.as_deref())
                        .bind(PAGE)
                        .bind(&patterns)
                        .fetch_one(&self.hot)
                })
                .await
                .map_err(map_db_error)?;
            let Some(Value::Array(rows)) = page.get_mut("queues").map(Value::take) else {
                break;
            };
            let full = rows.len() == PAGE as usize;
            after = rows
                .last()
                .and_then(|q| q.get("queue"))
                .and_then(Value::as_str)
                .map(str::to_string);
            queues.extend(rows);
            if !full || after.is_none() {
                break;
            }
        }
        Ok(serde_json::json!({ "queues": queues }))
    }

    /// Connections open and idle in the pool.
    pub fn pool_usage(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle())
    }
}
