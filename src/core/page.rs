//! Pages of the lists that grow with use (queues, consumers, cron registrations): at most `limit`
//! entries in name order after a cursor, the last name of the previous page.

use super::CoreError;
use super::validate::check_text;

/// Entries of a page when the client names no limit.
pub const DEFAULT_PAGE: i64 = 50;
/// The most entries one page may hold.
pub const MAX_PAGE: i64 = 1000;

/// What a client asked for.
#[derive(Debug, Clone, Default)]
pub struct PageRequest {
    /// Page size; `None` (or 0 from gRPC) is `DEFAULT_PAGE`.
    pub limit: Option<i64>,
    /// The previous page's `next_cursor`; `None` or empty is the first page.
    pub cursor: Option<String>,
}

/// A checked page request: a size in 1..=MAX_PAGE and the name to start after.
#[derive(Debug, Clone)]
pub struct PageSpec {
    /// Page size.
    pub limit: i64,
    /// Entries after this name (None: from the first).
    pub after: Option<String>,
}

impl PageRequest {
    /// Checks the limit and cursor (400 invalid_request naming the field).
    pub fn check(&self) -> Result<PageSpec, CoreError> {
        let limit = match self.limit {
            None | Some(0) => DEFAULT_PAGE,
            Some(n) if (1..=MAX_PAGE).contains(&n) => n,
            Some(n) => {
                return Err(CoreError::invalid(format!(
                    "limit must be between 1 and {MAX_PAGE}, not {n}"
                ))
                .with_detail("field", "limit".into()));
            }
        };
        let after = self.cursor.clone().filter(|c| !c.is_empty());
        if let Some(cursor) = &after {
            check_text("cursor", cursor)?;
        }
        Ok(PageSpec { limit, after })
    }
}

/// One page of a list.
#[derive(Debug, Clone)]
pub struct Page<T> {
    /// The entries, in name order.
    pub items: Vec<T>,
    /// How many entries the whole list holds.
    pub total: i64,
    /// The page size used.
    pub limit: i64,
    /// The cursor of the next page; `None` on the last.
    pub next_cursor: Option<String>,
}

impl PageSpec {
    /// Completes a page read in SQL (entries named after `after`, in name order, at most
    /// `limit + 1` of them: the one more says whether more follow), with the whole list's `total`.
    pub fn finish<T>(&self, items: &mut Vec<T>, total: i64, name: impl Fn(&T) -> &str) -> Page<T> {
        let more = items.len() as i64 > self.limit;
        items.truncate(self.limit as usize);
        let next_cursor = if more {
            items.last().map(|item| name(item).to_string())
        } else {
            None
        };
        Page {
            items: std::mem::take(items),
            total,
            limit: self.limit,
            next_cursor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_walk_a_list_in_name_order_without_gaps_or_repeats() {
        let names: Vec<String> = (0..7).map(|i| format!("q{i}")).collect();
        let mut cursor = None;
        let mut seen = Vec::new();
        loop {
            let spec = PageRequest {
                limit: Some(3),
                cursor: cursor.clone(),
            }
            .check()
            .expect("a valid request");
            // What the SQL of a page reads: after the cursor, at most limit + 1.
            let mut read: Vec<String> = names
                .iter()
                .filter(|n| spec.after.as_deref().is_none_or(|after| n.as_str() > after))
                .take(spec.limit as usize + 1)
                .cloned()
                .collect();
            let page = spec.finish(&mut read, 7, |n| n.as_str());
            assert_eq!(page.total, 7);
            assert!(page.items.len() <= 3);
            seen.extend(page.items);
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, names);
        for bad in [-1, 1001] {
            let request = PageRequest {
                limit: Some(bad),
                cursor: None,
            };
            assert!(request.check().is_err(), "{bad}");
        }
    }
}
