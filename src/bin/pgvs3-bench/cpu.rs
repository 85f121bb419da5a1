//! Whole-machine CPU time from `/proc/stat`, to price a workload in CPU microseconds per job.

use std::time::Duration;

/// USER_HZ: `/proc/stat` counts in hundredths of a second on every Linux architecture.
const TICKS_PER_SECOND: f64 = 100.0;

/// A reading of the machine's busy CPU time (all cores, every state but idle and iowait).
#[derive(Debug, Clone, Copy)]
pub struct CpuTime(Option<u64>);

impl CpuTime {
    /// Reads `/proc/stat` now; `None` inside when the file is not there (not Linux).
    pub fn now() -> CpuTime {
        CpuTime(busy_ticks())
    }

    /// Busy CPU time since `self`, or `None` when either reading failed.
    pub fn since(self) -> Option<Duration> {
        let (before, after) = (self.0?, busy_ticks()?);
        Some(Duration::from_secs_f64(
            after.saturating_sub(before) as f64 / TICKS_PER_SECOND,
        ))
    }
}

/// The `cpu` line of `/proc/stat`: user nice system idle iowait irq softirq steal ...
fn busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // idle (3) and iowait (4) are not work; guest time is already inside user.
    Some(
        fields
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 3 && *i != 4)
            .map(|(_, v)| v)
            .sum(),
    )
}

/// Microseconds of busy CPU per job, when the reading worked.
pub fn micros_per_job(busy: Option<Duration>, jobs: usize) -> Option<f64> {
    busy.map(|b| b.as_secs_f64() * 1e6 / jobs.max(1) as f64)
}
