//! The domain's types and errors, which the core, the store and the adapters share: jobs, stream
//! messages and batches, events, cron registrations, roles and grants. No logic that needs the
//! database or a protocol lives here, so every layer may depend on it.

pub mod access;
pub mod error;
pub mod events;
pub mod job;
pub mod stream;
pub mod time;
pub mod workflow;
