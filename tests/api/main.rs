//! The integration tests, one binary: every module below was a test binary of its own. They share
//! one process, so one private PostgreSQL cluster per run (`common::db`), and every test database
//! is cloned from one template migrated once, instead of a cluster per file and a migration per
//! test. Run one module with e.g. `cargo test --test api worker_protocol::`.
//!
//! What the modules share is process-wide, so no test may change the process: no `set_var`, no
//! global tracing subscriber (`otlp` needs both, and runs its body in a child process of this
//! binary for it), extra clusters only in directories of their own. Tests run concurrently, except
//! conformance and the few tests that read the event log right after a commit
//! (`common::db::MANY_DATABASES_BUSY` says why).

mod common;

mod admin_jobs;
mod admin_workers;
mod advanced_parity;
mod auth;
mod auth_matrix;
mod backup;
mod bad_input;
mod classification;
mod client_shapes;
mod conformance;
mod connections;
mod dashboard;
mod database_tls;
mod event_mirror;
mod event_rows;
mod events_sse;
mod failover;
mod gateways;
mod grpc_boundaries;
mod job_ids;
mod layering;
mod lifecycle;
mod lock_conflicts;
mod migrations;
mod observability;
mod off_path;
mod otlp;
mod private_cluster;
mod push_delivery;
mod python_stubs;
mod quotas;
mod replica;
mod revocation;
mod scopes;
mod stream_parity;
mod streams;
mod tls;
mod unbounded_reads;
mod worker_protocol;
