//! Where a job operation goes without asking the catalog each time: queue → schema, and job →
//! queue for the jobs this gateway handed out.
//!
//! Both are hints. A queue's schema name never changes while it exists (dropped and created
//! again it gets the same name), so a cached schema is either right or gone; a statement on a gone
//! schema fails with a SQLSTATE `is_stale` recognises, and the caller forgets it and asks again.
//! A job id belongs to one queue while it exists; an id that moved (a dead letter deleted and
//! its id enqueued elsewhere) is simply not found where the hint says, and the caller falls back
//! to the catalog path, which finds it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use uuid::Uuid;

use super::hot::HotPool;
use super::map_db_error;
use crate::model::error::CoreError;
use crate::model::job::Job;

/// Most job → queue hints kept; beyond it the hints start over (a miss only costs a lookup).
const MAX_OWNERS: usize = 200_000;

/// The caches of queue schemas and job queues.
#[derive(Default)]
pub struct Routes {
    schemas: RwLock<HashMap<String, Arc<str>>>,
    owners: Mutex<HashMap<Uuid, Arc<str>>>,
}

impl Routes {
    /// The quoted schema of `queue`, or `None` when the queue does not exist.
    pub async fn schema(&self, pool: &HotPool, queue: &str) -> Result<Option<Arc<str>>, CoreError> {
        if let Some(schema) = self
            .schemas
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(queue)
        {
            return Ok(Some(Arc::clone(schema)));
        }
        let found: Option<String> =
            sqlx::query_scalar("SELECT quote_ident(schema_name) FROM s3p.queues WHERE name = $1")
                .bind(queue)
                .fetch_optional(pool)
                .await
                .map_err(map_db_error)?;
        Ok(found.map(|schema| {
            let schema: Arc<str> = schema.into();
            self.schemas
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(queue.to_string(), Arc::clone(&schema));
            schema
        }))
    }

    /// Drops the cached schema of `queue` (it was dropped, or a statement found it gone).
    pub fn forget(&self, queue: &str) {
        self.schemas
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(queue);
    }

    /// The queue of a job this gateway claimed, if it remembers it.
    pub fn queue_of(&self, id: &Uuid) -> Option<Arc<str>> {
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Remembers the queue of each claimed job.
    pub fn remember(&self, queue: &Arc<str>, jobs: &[Job]) {
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        if owners.len() + jobs.len() > MAX_OWNERS {
            owners.clear();
        }
        for job in jobs {
            owners.insert(job.id, Arc::clone(queue));
        }
    }

    /// Forgets jobs whose lease ended here (acked or failed).
    pub fn release(&self, ids: impl IntoIterator<Item = Uuid>) {
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        for id in ids {
            owners.remove(&id);
        }
    }
}

/// Whether a statement on a cached schema failed because that schema (or its functions) is gone
/// or was rebuilt underneath a prepared statement.
pub fn is_stale(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // invalid_schema_name, undefined_function, undefined_table, undefined_object (a
            // function's row type gone with its schema), feature_not_supported ("cached plan
            // must not change result type")
            Some("3F000" | "42883" | "42P01" | "42704" | "0A000") => true,
            // A statement that waited on a dropping queue's lock finds its tables gone by OID:
            // an internal error with no SQLSTATE of its own.
            Some("XX000") => {
                let message = db.message();
                message.starts_with("could not open relation with OID")
                    || message.starts_with("cache lookup failed for")
            }
            _ => false,
        },
        _ => false,
    }
}
