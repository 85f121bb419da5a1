//! The domain's types and errors, which the core, the store and the adapters share: jobs, stream
//! messages and batches, events, cron registrations, roles and grants. No logic that needs the
//! database or a protocol lives here, so every layer may depend on it.

pub mod access;
pub mod admin;
pub mod admin_system;
pub mod error;
pub mod events;
pub mod job;
pub mod queue;
pub mod raw_json;
pub mod stream;
pub mod time;
pub mod workflow;

/// The JSON object a model record serializes to (its `Serialize` form); empty for a value that
/// is not an object, which no record is.
pub fn json_object<T: serde::Serialize>(value: &T) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    }
}
