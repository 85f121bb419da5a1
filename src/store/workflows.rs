//! Workflows: create, view, cancel, the scope check of their queues, the newest page.

use serde_json::Value;
use uuid::Uuid;

use super::{Store, map_db_error};
use crate::model::access::Scope;
use crate::model::error::CoreError;

impl Store {
    /// `s3p.create_workflow`: the new workflow's view.
    #[tracing::instrument(name = "db", skip_all, fields(op = "create_workflow"))]
    pub async fn create_workflow(
        &self,
        id: Uuid,
        name: &str,
        kind: &str,
        steps: &Value,
        callbacks: &Value,
    ) -> Result<Value, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.create_workflow($1, $2, $3, $4, $5)")
                .bind(id)
                .bind(name)
                .bind(kind)
                .bind(steps)
                .bind(callbacks)
                .fetch_one(&self.hot)
        })
        .await
        .map_err(map_db_error)
    }

    /// `s3p.workflow_view`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "workflow"))]
    pub async fn workflow(&self, id: Uuid) -> Result<Value, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.workflow_view($1)")
                .bind(id)
                .fetch_one(&self.hot)
        })
        .await
        .map_err(map_db_error)
    }

    /// `s3p.cancel_workflow`.
    #[tracing::instrument(name = "db", skip_all, fields(op = "cancel_workflow"))]
    pub async fn cancel_workflow(&self, id: Uuid) -> Result<Value, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.cancel_workflow($1)")
                .bind(id)
                .fetch_one(&self.hot)
        })
        .await
        .map_err(map_db_error)
    }

    /// Whether every queue of workflow `id` is in `scope` (true for a workflow that does not
    /// exist: its own lookup answers not found).
    #[tracing::instrument(name = "db", skip_all, fields(op = "workflow_in_scope"))]
    pub async fn workflow_in_scope(&self, scope: &Scope, id: Uuid) -> Result<bool, CoreError> {
        self.retry_conflicts(|| {
            sqlx::query_scalar("SELECT s3p.workflow_in_scope($1, $2)")
                .bind(id)
                .bind(scope.like_patterns())
                .fetch_one(&self.hot)
        })
        .await
        .map_err(map_db_error)
    }

    /// The newest workflows with their progress (the first page of `s3p.workflows_list`).
    pub async fn workflows_page(&self, scope: &Scope, limit: i32) -> Result<Value, CoreError> {
        let (items, _) = self.workflows_list(scope, None, 0, limit).await?;
        Ok(Value::Array(items))
    }
}
