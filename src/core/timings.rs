//! How long jobs wait to be fetched and run until acked, by queue, as Prometheus histograms
//! (`pgvs3_job_wait_seconds`, `pgvs3_job_run_seconds`; `/metrics` registers them at scrape).

use chrono::{DateTime, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use super::{Completion, Job};

/// Upper bounds (seconds) of the job wait and run time buckets: 5 ms to an hour.
pub const JOB_TIME_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// The one label of the job histograms (queues are bounded by `--max-queues`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    /// The queue name (already `^[a-z0-9][a-z0-9.-]*$`, so nothing to escape).
    pub queue: String,
}

/// A histogram family by queue.
pub type QueueHistograms = Family<QueueLabel, Histogram, fn() -> Histogram>;

fn job_time_histogram() -> Histogram {
    Histogram::new(JOB_TIME_BUCKETS.iter().copied())
}

/// Job wait and run time histograms of this gateway.
#[derive(Debug, Clone)]
pub struct JobTimings {
    /// From when a job was due (`run_at`, else `enqueued_at`, else `created_at`) to its fetch.
    pub wait: QueueHistograms,
    /// From an attempt's start to its ack.
    pub run: QueueHistograms,
}

impl Default for JobTimings {
    fn default() -> Self {
        JobTimings {
            wait: Family::new_with_constructor(job_time_histogram),
            run: Family::new_with_constructor(job_time_histogram),
        }
    }
}

/// Seconds from `from` to `to`, 0 when `to` is earlier.
fn seconds(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).to_std().map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

impl JobTimings {
    /// Observes the wait of each job a fetch claimed.
    pub fn fetched(&self, jobs: &[Job]) {
        for job in jobs {
            let Some(started) = job.started_at else {
                continue;
            };
            // run_at is when the job last became due (scheduled time, retry backoff, requeue);
            // the claim leaves it as it was.
            let due = job.run_at.or(job.enqueued_at).unwrap_or(job.created_at);
            self.wait
                .get_or_create(&QueueLabel {
                    queue: job.queue.clone(),
                })
                .observe(seconds(due, started));
        }
    }

    /// Observes the run time of an acked job.
    pub fn completed(&self, done: &Completion) {
        if let (Some(started), Some(completed)) = (done.started_at, done.completed_at) {
            self.run
                .get_or_create(&QueueLabel {
                    queue: done.queue.clone(),
                })
                .observe(seconds(started, completed));
        }
    }

    /// Drops the series of a dropped queue.
    pub fn forget(&self, queue: &str) {
        let label = QueueLabel {
            queue: queue.to_string(),
        };
        self.wait.remove(&label);
        self.run.remove(&label);
    }
}
