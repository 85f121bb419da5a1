//! pgvs3: an Open Job Spec job queue and PgQue-shaped event stream on PostgreSQL, served over
//! OJS JSON/HTTP and gRPC from one service implementation.
#![warn(missing_docs)]

pub mod cluster;
pub mod config;
pub mod contract;
pub mod core;
pub mod grpc;
pub mod http;
pub mod maintenance;
pub mod memory;
pub mod metrics;
pub mod middleware;
pub mod model;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod ui;
