//! The integration tests: one test binary, one module per topic, all on
//! the harness in [`common`]. One binary links the crate once instead of
//! once per file; `cargo test --test it admin_api::` runs one topic.

mod common;

mod access_log;
mod admin_api;
mod alerts;
mod bench_cli;
mod config_and_cli;
mod conformance;
mod console;
mod current_operation;
mod deployment;
mod destination_key;
mod docs;
mod failover;
mod fingerprint_exactness;
mod fuzz_regressions;
mod http2;
mod http_hygiene;
mod keyed_scopes;
mod keyless_and_waiting;
mod keys_and_scope;
mod keys_cli;
mod layout;
mod limits;
mod mcp;
mod mock_and_demo;
mod monitoring;
mod no_secrets;
mod outcome_unknown;
mod paths_and_probes;
mod pause_kind_upgrade;
mod postgres_gateway;
mod probe_verdicts;
mod process;
mod promotion;
mod real_clients;
mod rehearse;
mod replica_leases;
mod replicas;
mod resource_bounds;
mod restart;
mod retention_and_shutdown;
mod rotated_keys;
mod routing_and_admin;
mod schemathesis;
mod sealed_store;
mod state_model;
mod store_contract;
mod store_faults;
mod tls;
mod traces;
mod ucp;
mod wire_identity;
mod write_path;
