//! Cron entries as the OJS admin UI reads and toggles them (`/ojs/v1/crons`): numbered pages, one
//! entry, pause and resume.

use chrono::Utc;

use crate::core::cron::{Schedule, parse_time_zone};
use crate::core::{CoreError, Scope, Service, validate};
use crate::model::workflow::CronEntry;

/// A numbered page of cron entries and the total.
#[derive(Debug, Clone)]
pub struct CronPage {
    /// Entries in name order.
    pub items: Vec<CronEntry>,
    /// Entries in scope.
    pub total: i64,
    /// 1-based page.
    pub page: i64,
    /// Page size.
    pub per_page: i64,
}

fn check_name(name: &str) -> Result<(), CoreError> {
    if name.is_empty() || name.len() > 255 {
        return Err(
            CoreError::invalid("a cron name is 1 to 255 bytes").with_detail("field", "name".into())
        );
    }
    validate::check_text("name", name)
}

impl Service {
    /// Cron entries of queues in scope, page `page` of `per_page`, in name order.
    pub async fn cron_page(
        &self,
        scope: &Scope,
        page: Option<i64>,
        per_page: Option<i64>,
    ) -> Result<CronPage, CoreError> {
        let (page, per_page, offset) = super::workers::page_numbers(page, per_page)?;
        let items = self.store.cron_page_at(scope, offset, per_page).await?;
        let total = self.store.count_crons(scope).await?;
        Ok(CronPage {
            items,
            total,
            page,
            per_page,
        })
    }

    /// One cron entry of a queue in scope.
    pub async fn get_cron(&self, scope: &Scope, name: &str) -> Result<CronEntry, CoreError> {
        check_name(name)?;
        self.store.cron_get(scope, name).await
    }

    /// Pauses (`enabled` false) or resumes a cron entry; a resumed entry fires from its next
    /// slot after now, never the slots missed while paused.
    pub async fn set_cron_enabled(
        &self,
        scope: &Scope,
        name: &str,
        enabled: bool,
    ) -> Result<CronEntry, CoreError> {
        let entry = self.get_cron(scope, name).await?;
        let next = match (
            Schedule::parse(&entry.expression),
            parse_time_zone(&entry.timezone),
        ) {
            (Ok(schedule), Ok(tz)) => schedule.next_after(Utc::now(), tz),
            _ => None,
        };
        self.store
            .cron_set_enabled(scope, name, enabled, next)
            .await
    }
}
