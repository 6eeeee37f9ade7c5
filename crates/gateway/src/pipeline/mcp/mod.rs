//! The `mcp` profile: Model Context Protocol tool calls over Streamable
//! HTTP, as protected writes of the same pipeline (docs/mcp.md).
//!
//! An MCP endpoint takes every JSON-RPC message as a POST to one path. A
//! POST whose body is a `tools/call` request of a protected tool is a
//! write: keyed, fingerprinted, claimed and recorded like any other
//! ([`call`], [`identity`]); everything else — `initialize`, notifications,
//! `tools/list`, resources, prompts, a read-only tool, GET and DELETE on
//! the endpoint — is streamed through unchanged. The upstream's answer (a
//! JSON body or an event stream) is reduced to the JSON-RPC response for
//! the call's id ([`outcome`]), and every answer to a protected call —
//! first, replayed, or the gateway's own — is a JSON-RPC response under
//! the id of the request being answered ([`answer`]).
//!
//! Invariants, beside the pipeline's own (claimed before anything is sent,
//! recorded before the client hears, a lost answer held `unknown`):
//! - a call's identity is its scope, route, tool and key, never its
//!   JSON-RPC id nor a session id, so an agent's retry (a new id, perhaps
//!   a new session) is the same operation;
//! - a request whose `Mcp-Method`/`Mcp-Name` headers disagree with its
//!   body is refused as the 2026-07-28 revision says (400, `-32020`), with
//!   nothing sent, before it is classified;
//! - a stored answer is a JSON-RPC response; whoever reads it back
//!   answers under its own request's id.

pub mod answer;
pub mod call;
pub mod cancel;
pub mod identity;
pub mod outcome;
pub mod relay;
pub mod tools;
