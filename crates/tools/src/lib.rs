//! The binary's command line, and the commands that talk to a gateway
//! from outside or run one of their own to try it: they use the gateway's
//! public API (the `idemgate` crate) and nothing below it.
//!
//! - [`cli`]: the command line, `serve`'s arguments and each tool's.
//! - [`keys_cli`]: `idemgate keys …`, the admin API from a terminal;
//!   [`healthcheck`]: `idemgate healthcheck`, `/readyz` as an exit code;
//!   [`admin_url`]: the `--admin` base URL both take; `terminal`: what
//!   a server sent, made safe to print.
//! - [`mock_upstream`]: a fault-injecting API to try idemgate against;
//!   [`demo`]: the newcomer's tour against it; [`rehearse`]: the
//!   interruption drill against a route's real destination, faults
//!   injected in a gateway of its own; `gateway_client`: the client side
//!   of both; [`bench`](mod@bench): a retry-storm load generator that checks the API
//!   saw one write per key; [`conformance`]: a profile's cases against any
//!   endpoint.
#![forbid(unsafe_code)]

pub mod admin_tls;
pub mod admin_url;
pub mod bench;
pub mod cli;
pub mod conformance;
pub mod demo;
mod gateway_client;
pub mod healthcheck;
pub mod keys_cli;
pub mod mock_upstream;
pub mod rehearse;
mod terminal;
